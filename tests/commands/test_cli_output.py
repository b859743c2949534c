"""What the commands print: a table that fits a terminal, warnings on stderr, the JSON object.

The table's rules are checked against the reports' own fields (the full reason from
``status()``), never against the renderer's output alone.
"""

import io
import json
import site
from pathlib import Path

import pytest

from backports.megatron import cli, status
from backports.megatron.catalog import CATALOG
from backports.megatron.commands import output
from backports.megatron.job import hook_file
from backports.megatron.session import SESSION
from tests.conftest import BACKPORT_ID, TILELANG_DSA
from tests.reports import report_for


class _Terminal(io.StringIO):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _on_terminal(
    monkeypatch: pytest.MonkeyPatch, columns: int, *argv: str
) -> tuple[int, list[str]]:
    monkeypatch.setenv("COLUMNS", str(columns))
    terminal = _Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    code = cli.main(list(argv))
    return code, terminal.getvalue().splitlines()


@pytest.fixture
def start_up_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``tmp_path`` as this interpreter's site-packages, for every command."""
    monkeypatch.setattr(site, "getsitepackages", lambda prefixes=None: [str(tmp_path)])
    monkeypatch.setattr(hook_file, "default_site_dir", lambda: tmp_path)
    return tmp_path


# ---- the table ------------------------------------------------------------------------------


# What every reason starts with on megatron-core 0.19.2, where each backport is needed.
SHARED = "megatron-core 0.19.2 lacks the fix: "


@pytest.mark.parametrize("columns", [80, 120])
def test_status_on_a_terminal_fits_its_width_and_shows_what_differs(
    tilelang_dsa, monkeypatch, tmp_path, columns
):
    """The start all reasons share is said once under the table; each row shows the
    beginning of what is its own, word for word (issue 36.5)."""
    monkeypatch.setenv("NO_COLOR", "1")
    code, lines = _on_terminal(monkeypatch, columns, "status", "--site-dir", str(tmp_path))
    rows = lines[1 : 1 + len(CATALOG)]
    table_lines = [lines[0], *rows]
    assert code == 0 and all(len(line) <= columns for line in table_lines), table_lines
    reasons = {r.id: r.reason for r in status()}
    assert all(reason.startswith(SHARED) for reason in reasons.values())
    shown = {}
    for row in rows:
        backport_id = row.split()[0]
        shown[backport_id] = row.removesuffix(output.ELLIPSIS).split("  ")[-1].strip()
        assert len(shown[backport_id]) >= 20
        assert reasons[backport_id].removeprefix(SHARED).startswith(shown[backport_id])
    assert len(set(shown.values())) == len(rows)  # no two rows say the same
    assert lines[1 + len(CATALOG)] == f'(every reason above begins "{SHARED.strip()}")'
    assert "verdict" in lines[0] and "action" in lines[0]


@pytest.mark.parametrize(
    ("reasons", "width", "shown", "said"),
    [
        # 10 columns left for the reason: the shared phrase goes under the table
        (
            ["v1 lacks: aaaa bbbb", "v1 lacks: cccc dddd"],
            14,
            ["aaaa bbbb", "cccc dddd"],
            "v1 lacks:",
        ),
        # shared up to the last whole phrase only, never into a word ("a")
        (["v1: x: ab zzz", "v1: x: ac zzz"], 12, ["ab zzz", "ac zzz"], "v1: x:"),
        # nothing shared, one row, or no cut: cut as ever, nothing said
        (["aaaa: bbbbbbb", "cccc: ddddddd"], 12, ["aaaa: b…", "cccc: d…"], None),
        (["v1 lacks: aaaa bbbb"], 14, ["v1 lacks:…"], None),
        (["v1 lacks: aa", "v1 lacks: bb"], 40, ["v1 lacks: aa", "v1 lacks: bb"], None),
    ],
)
def test_render_drops_only_a_shared_start_it_would_cut(reasons, width, shown, said):
    rows = [["id", "reason"], *([str(i), r] for i, r in enumerate(reasons))]
    lines = output.render(rows, output.Layout(width, False)).splitlines()
    assert [line.split("  ", 1)[1].strip() for line in lines[1 : 1 + len(reasons)]] == shown
    under = " ".join(lines[1 + len(reasons) :]).split()  # wrapped to the width, as notes are
    assert under == ([] if said is None else f'(every reason above begins "{said}")'.split())


def test_the_notes_under_the_table_wrap_to_the_width_and_lose_no_word(
    tilelang_dsa, monkeypatch, tmp_path
):
    """The hook's line names a site-packages path: on an 80-column terminal it wraps at
    spaces, every word kept, never cut and never split inside the path."""
    site_dir = tmp_path / ("deep-enough-to-make-the-hook-line-longer-than-eighty" * 2)
    site_dir.mkdir()
    argv = ["status", "--site-dir", str(site_dir)]
    _, lines = _on_terminal(monkeypatch, 80, *argv)
    _, whole = _on_terminal(monkeypatch, 100_000, *argv)
    notes, whole_notes = lines[1 + len(CATALOG) :], whole[1 + len(CATALOG) :]
    notes = [note for note in notes if not note.startswith("(every reason above begins")]
    assert any(len(note) > 80 for note in whole_notes)
    assert all(len(line) <= 80 or " " not in line.strip() for line in notes), notes
    assert " ".join(notes).split() == " ".join(whole_notes).split()


def test_a_narrow_terminal_leaves_out_the_optional_columns_first(
    tilelang_dsa, monkeypatch, tmp_path
):
    _, wide = _on_terminal(monkeypatch, 200, "status", "--site-dir", str(tmp_path))
    _, narrow = _on_terminal(monkeypatch, 80, "status", "--site-dir", str(tmp_path))
    assert wide[0].split()[:3] == ["id", "upstream", "megatron-core"] and "source" in wide[0]
    assert narrow[0].split()[:3] == ["id", "verdict", "action"]


def test_verbose_and_pipes_keep_the_reason_whole(tilelang_dsa, monkeypatch, tmp_path, capsys):
    _, lines = _on_terminal(monkeypatch, 80, "status", "-v", "--site-dir", str(tmp_path))
    monkeypatch.undo()
    reasons = [r.reason for r in status()]
    assert all(any(line.endswith(reason) for line in lines) for reason in reasons)
    cli.main(["status", "--site-dir", str(tmp_path)])  # capsys: not a terminal
    out = capsys.readouterr().out
    assert all(reason in out for reason in reasons) and output.ELLIPSIS not in out


def test_colours_only_on_a_terminal_and_never_under_no_color(tilelang_dsa, monkeypatch, tmp_path):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", lambda q: None)  # moved
    monkeypatch.delenv("NO_COLOR", raising=False)
    _, lines = _on_terminal(monkeypatch, 200, "status", "--site-dir", str(tmp_path))
    assert "\x1b[31mincompatible\x1b[0m" in "\n".join(lines)
    monkeypatch.setenv("NO_COLOR", "")  # set, even empty: no colour (no-color.org)
    _, lines = _on_terminal(monkeypatch, 200, "status", "--site-dir", str(tmp_path))
    assert "\x1b[" not in "\n".join(lines) and "incompatible" in "\n".join(lines)
    monkeypatch.delenv("NO_COLOR")
    piped = io.StringIO()
    monkeypatch.setattr("sys.stdout", piped)
    cli.main(["status", "--site-dir", str(tmp_path)])
    assert "\x1b[" not in piped.getvalue() and "incompatible" in piped.getvalue()


def test_render_cuts_only_the_last_column_and_keeps_short_lines_whole():
    rows = [["id", "up", "reason"], ["a", "NV#1", "x" * 50], ["bb", "NV#22", "short"]]
    lines = output.render(rows, output.Layout(30, False)).splitlines()
    assert lines == [
        "id  up     reason",
        "a   NV#1   " + "x" * 18 + output.ELLIPSIS,
        "bb  NV#22  short",
    ]
    assert output.render(rows, output.Layout(None, False)).splitlines()[1].endswith("x" * 50)


# ---- warnings, the switches -----------------------------------------------------------------


def test_check_names_a_bad_switch_value_on_stderr_as_status_does(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    SESSION.warned.clear()
    monkeypatch.setenv("MEGATRON_BACKPORTS", "disable")
    expected = "warning: megatron-backports: MEGATRON_BACKPORTS='disable' is neither on"
    for argv in (["status", "--site-dir", str(tmp_path)], ["check"], ["check", "--json"]):
        # Each command a new process: nothing said yet, in it or in a parent.
        SESSION.warned.clear()
        monkeypatch.delenv("MEGATRON_BACKPORTS_SAID", raising=False)
        cli.main(argv)
        out, err = capsys.readouterr()
        assert err.count(expected) == 1 and "warning" not in out, argv


def test_unknown_ids_in_the_skip_list_are_named_in_one_warning(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    SESSION.warned.clear()
    monkeypatch.delenv("MEGATRON_BACKPORTS_SAID", raising=False)
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP", f"megatron-lm-76l7,{BACKPORT_ID},nope")
    cli.main(["status", "--site-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    warned = [line for line in err.splitlines() if "MEGATRON_BACKPORTS_SKIP" in line]
    assert len(warned) == 1 and "megatron-lm-76l7, nope" in warned[0]
    assert BACKPORT_ID not in warned[0] and "disabled" in out


# ---- the JSON object ------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["check"]])
def test_the_json_object_holds_the_list_a_schema_version_and_a_summary(
    tilelang_dsa, capsys, start_up_reads, command
):
    cli.main([*command, "--json"])
    listed = json.loads(capsys.readouterr().out)
    code = cli.main([*command, "--format", "json-object"])
    document = json.loads(capsys.readouterr().out)
    assert isinstance(listed, list) and code == 0
    assert document["schema_version"] == output.SCHEMA_VERSION
    assert document["command"] == command[0]
    assert [r["id"] for r in document["reports"]] == [r["id"] for r in listed]
    summary = document["summary"]
    assert summary["total"] == len(listed)
    assert sum(summary["verdicts"].values()) == sum(summary["actions"].values()) == len(listed)
    assert summary["verdicts"].get("needed") == sum(r["verdict"] == "needed" for r in listed)
    if command == ["check"]:
        assert summary["ok"] is True and summary["failed"] == []


def test_json_and_format_are_one_choice(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["status", "--json", "--format", "table"])
    assert exit_.value.code == 2


# ---- the hook, as status and check say it ---------------------------------------------------


def test_after_apply_status_and_check_name_the_import_that_installs_each(
    tilelang_dsa, capsys, start_up_reads
):
    from backports.megatron import revert

    assert cli.main(["apply"]) == 0
    revert()  # a new process: nothing installed in it yet
    capsys.readouterr()
    cli.main(["status", "--json"])
    statuses = json.loads(capsys.readouterr().out)
    cli.main(["check", "--json"])
    checks = json.loads(capsys.readouterr().out)
    assert [r["action"] for r in checks] == [r["action"] for r in statuses]
    report = report_for(statuses, BACKPORT_ID)
    assert report["action"] == "active-via-hook"
    assert report["reason"].endswith(f"in each new process that imports {TILELANG_DSA}")
    several = report_for(statuses, "megatron-lm-6793")
    modules = [t["module"] for t in several["evidence"]["targets"]]
    assert len(set(modules)) == 2
    assert several["reason"].endswith(f"once it has imported {modules[0]} and {modules[1]}")
