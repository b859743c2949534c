"""``backports status / apply / revert`` in this process, the hook in a temporary folder.

``audit`` and the console script in fresh interpreters: test_audit.py, test_start_up.py,
test_cli_process.py.
"""

import errno
import json
import logging
import site
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from backports.megatron import api, cli, revert, status
from backports.megatron.catalog import CATALOG
from backports.megatron.commands import output
from backports.megatron.job import hook_file, start_up
from backports.megatron.job import startup_hook as job_start
from backports.megatron.job.hook_file import START_FILE
from backports.megatron.session import SESSION
from tests import standins
from tests.conftest import BACKPORT_ID
from tests.paths import ROOT
from tests.reports import report_for


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def start_up_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``tmp_path`` as a site-packages folder whose .pth files every interpreter runs."""
    monkeypatch.setattr(site, "getsitepackages", lambda prefixes=None: [str(tmp_path)])
    return tmp_path


def _without_hook(report: dict) -> dict:
    return {**report, "evidence": {k: v for k, v in report["evidence"].items() if k != "hook"}}


def test_status_json_is_status_plus_the_hook_state(tilelang_dsa, capsys, tmp_path):
    # A first look imports every target and keeps the child sniffs' proof for the process:
    # the two compared below then judge the same state (what ran, what is remembered).
    status()
    code, out, _ = _main(capsys, "status", "--json", "--site-dir", str(tmp_path))
    assert code == 0
    reports = json.loads(out)
    report = report_for(reports, BACKPORT_ID)
    assert [_without_hook(r) for r in reports] == [r.to_dict() for r in status()]
    hook = report["evidence"]["hook"]
    assert hook["path"] == str(tmp_path / hook_file.HOOK_FILE)
    assert (hook["exists"], hook["applies"]) == (False, False)


def test_status_table_says_what_apply_would_do(tilelang_dsa, capsys, tmp_path):
    code, out, _ = _main(capsys, "status", "--site-dir", str(tmp_path))
    header, *rows, hook, note = out.splitlines()
    assert [row.split()[0] for row in rows] == [spec.id for spec in CATALOG]
    row = rows[0]
    assert header.split()[:5] == ["id", "upstream", "megatron-core", "verdict", "action"]
    upstream = "NVIDIA/Megatron-LM#7617"
    assert row.split()[:5] == [BACKPORT_ID, upstream, "0.19.2", "needed", "would-install"]
    assert "lacks the fix" in row
    assert hook.startswith(f"hook: none in {tmp_path}")
    assert note.startswith(f"note: {tmp_path} is not a site-packages folder")
    assert code == 0 and job_start.read_hook(tmp_path).exists is False


def test_after_apply_status_says_the_hook_installs_it(tilelang_dsa, capsys, start_up_reads):
    assert _main(capsys, "apply", "--site-dir", str(start_up_reads))[0] == 0
    revert()  # a new process: nothing installed in it yet
    code, out, _ = _main(capsys, "status", "--site-dir", str(start_up_reads))
    _header, *rows, hook = out.splitlines()
    row = rows[[spec.id for spec in CATALOG].index(BACKPORT_ID)]
    assert code == 0 and row.split()[3:5] == ["needed", "active-via-hook"]
    assert "the start-up hook installs it in each new process" in row
    path = start_up_reads / hook_file.HOOK_FILE
    twin = f"(and {START_FILE} for Python 3.15+)"
    assert hook == f"hook: {path} {twin} activates the backports in every new interpreter"
    _, out, _ = _main(capsys, "status", "--json", "--site-dir", str(start_up_reads))
    report = report_for(json.loads(out), BACKPORT_ID)
    assert (
        report["action"] == "active-via-hook" and report["evidence"]["target"]["installed"] is False
    )
    assert report["evidence"]["hook"] == {
        "path": str(start_up_reads / hook_file.HOOK_FILE),
        "exists": True,
        "start_file": str(start_up_reads / START_FILE),
        "current": True,
        "runs_at_startup": True,
        "applies": True,
        "only": None,
        "strict": False,
    }


def test_an_earlier_versions_working_hook_still_counts_as_active(
    tilelang_dsa, capsys, start_up_reads
):
    """After an in-place upgrade the old hook file still patches every new process (its line
    calls ``_start_up``, the address every version keeps): status says so, and that a new
    ``backports apply`` refreshes it, instead of ``would-install``."""
    assert _main(capsys, "apply", "--site-dir", str(start_up_reads))[0] == 0
    revert()
    path = start_up_reads / hook_file.HOOK_FILE
    old = path.read_text().replace("(megatron-backports ", "(megatron-backports 0.0.1, was ")
    path.write_text(old)  # another version's comment line, the same working import line
    (start_up_reads / START_FILE).unlink()  # written before PEP 829's twin existed
    code, out, _ = _main(capsys, "status", "--site-dir", str(start_up_reads))
    _header, *rows, hook = out.splitlines()
    row = rows[[spec.id for spec in CATALOG].index(BACKPORT_ID)]
    assert code == 0 and row.split()[3:5] == ["needed", "active-via-hook"]
    assert hook == (
        f"hook: {path} activates the backports in every new interpreter "
        "(written by another version: `backports apply` refreshes it)"
    )
    path.write_text(old.replace("._start_up(", "._not_a_start_up("))  # a line that patches nothing
    _code, out, _ = _main(capsys, "status", "--json", "--site-dir", str(start_up_reads))
    assert report_for(json.loads(out), BACKPORT_ID)["action"] == "would-install"


def test_revert_on_a_read_only_site_dir_without_a_hook_is_no_error(capsys, tmp_path, monkeypatch):
    """Nothing to remove: nothing is unlinked (on a read-only file system unlinking a file that
    is not there fails with EROFS, not FileNotFoundError; played here, as root writes anyway)."""

    def read_only(self, missing_ok=False):  # type: ignore[no-untyped-def]
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    code, _out, err = _main(capsys, "revert", "--site-dir", str(tmp_path))
    assert code == 0 and err == ""


def test_a_hook_start_up_never_reads_activates_nothing(tilelang_dsa, capsys, tmp_path):
    _main(capsys, "apply", "--site-dir", str(tmp_path))
    revert()
    _code, out, _ = _main(capsys, "status", "--json", "--site-dir", str(tmp_path))
    report = report_for(json.loads(out), BACKPORT_ID)
    assert report["action"] == "would-install"
    assert report["evidence"]["hook"]["runs_at_startup"] is False


def test_a_hook_for_other_backports_does_not_apply_this_one(tilelang_dsa, capsys, start_up_reads):
    job_start.write_hook(start_up_reads, ())  # a hook that applies no backport
    _code, out, _ = _main(capsys, "status", "--json", "--site-dir", str(start_up_reads))
    report = report_for(json.loads(out), BACKPORT_ID)
    assert report["action"] == "would-install" and report["evidence"]["hook"]["applies"] is False


def test_status_strict_fails_on_incompatible(tilelang_dsa, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    assert _main(capsys, "status", "--site-dir", str(tmp_path))[0] == 0
    assert _main(capsys, "status", "--strict", "--site-dir", str(tmp_path))[0] == 1


def test_apply_installs_writes_the_hook_and_is_idempotent(tilelang_dsa, capsys, tmp_path):
    code, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert code == 0
    assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == BACKPORT_ID
    assert f"hook: wrote {tmp_path / hook_file.HOOK_FILE}" in out
    assert "installed" in out.splitlines()[1]
    assert "is not a site-packages folder" in out  # a temp folder: say .pth files won't run
    code, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert code == 0 and "already-installed" in out
    assert f"hook: unchanged: {tmp_path / hook_file.HOOK_FILE}" in out
    code, out, _ = _main(capsys, "status", "--site-dir", str(tmp_path))
    assert "activates the backports in every new interpreter" in out


def test_apply_json_prints_reports_only(tilelang_dsa, capsys, tmp_path):
    code, out, err = _main(capsys, "apply", "--json", "--site-dir", str(tmp_path))
    report = report_for(json.loads(out), BACKPORT_ID)
    assert code == 0 and report["id"] == BACKPORT_ID and report["action"] == "installed"
    assert "hook: wrote" in err


def test_apply_warns_once_and_still_writes_the_hook(tilelang_dsa, monkeypatch, capsys, tmp_path):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    code, out, err = _main(capsys, "apply", "--site-dir", str(tmp_path))
    # Warnings go to stderr, the table's mode included: stdout stays the table and its notes.
    assert code == 0 and err.count("warning: megatron-backports:") == 1
    assert "warning:" not in out
    assert "upstream" in out.splitlines()[1] and job_start.read_hook(tmp_path).current


def test_apply_strict_fails_on_incompatible_without_a_hook(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    code, _, err = _main(capsys, "apply", "--strict", "--site-dir", str(tmp_path))
    assert code == 1 and "incompatible" in err and "hook not written" in err
    assert not job_start.read_hook(tmp_path).exists
    code, _, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))  # not strict: skip it
    assert code == 0 and job_start.read_hook(tmp_path).exists


def test_apply_only_and_strict_reach_the_hook(tilelang_dsa, capsys, tmp_path):
    argv = ("apply", "--only", BACKPORT_ID, "--strict", "--site-dir", str(tmp_path))
    assert _main(capsys, *argv)[0] == 0
    assert job_start.read_hook(tmp_path).config == {"strict": True, "only": (BACKPORT_ID,)}


def test_unknown_id_is_a_usage_error(capsys, tmp_path):
    code, _, err = _main(capsys, "apply", "--only", "megatron-lm-1", "--site-dir", str(tmp_path))
    assert code == 2 and "unknown backport 'megatron-lm-1'" in err
    assert not job_start.read_hook(tmp_path).exists


@pytest.mark.parametrize("command", ["apply", "status", "revert"])
def test_a_missing_site_dir_is_named_as_missing(tilelang_dsa, capsys, tmp_path, command):
    missing = tmp_path / "missing"
    code, out, err = _main(capsys, command, "--site-dir", str(missing))
    assert (code, out) == (2, "")
    assert err == f"backports: site dir {missing} does not exist\n"
    assert list(tmp_path.iterdir()) == []


def test_revert_removes_the_hook_and_reverts_idempotently(tilelang_dsa, capsys, tmp_path):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    _main(capsys, "apply", "--site-dir", str(tmp_path))
    code, out, _ = _main(capsys, "revert", "--site-dir", str(tmp_path))
    assert code == 0 and tilelang_dsa.fused_sparse_mla_absorbed is original
    assert f"hook: removed {tmp_path / hook_file.HOOK_FILE}" in out and "reverted" in out
    code, out, _ = _main(capsys, "revert", "--site-dir", str(tmp_path))
    assert code == 0 and "hook: none at" in out and "not-installed" in out


def test_revert_in_a_new_process_says_it_removed_the_hook(tilelang_dsa, capsys, tmp_path):
    _main(capsys, "apply", "--only", BACKPORT_ID, "--site-dir", str(tmp_path))
    revert()  # a new process: nothing installed in it; the hook is what revert undoes
    code, out, _ = _main(capsys, "revert", "--site-dir", str(tmp_path))
    _header, *rows, note = out.splitlines()
    row = rows[[spec.id for spec in CATALOG].index(BACKPORT_ID)]
    hook = tmp_path / hook_file.HOOK_FILE
    assert row.split()[:2] == [BACKPORT_ID, "reverted"]
    assert f"removed the start-up hook {hook}: new processes do not apply it" in row
    assert code == 0 and note == f"hook: removed {hook} and {tmp_path / START_FILE}"
    assert list(tmp_path.iterdir()) == []


def test_revert_json_reports_what_it_did_with_the_probed_verdict(tilelang_dsa, capsys, tmp_path):
    _main(capsys, "apply", "--site-dir", str(tmp_path))
    revert()
    code, out, err = _main(capsys, "revert", "--json", "--site-dir", str(tmp_path))
    report = report_for(json.loads(out), BACKPORT_ID)
    assert code == 0 and report["action"] == "reverted"
    assert report["verdict"] == "needed" and "lacks the fix" not in report["reason"]
    assert report["evidence"]["behaviour"]["fixed"] is False  # probed, not made up
    assert report["evidence"]["hook"] == {
        "path": str(tmp_path / hook_file.HOOK_FILE),
        "removed": True,
    }
    assert "hook: removed" in err
    code, out, _ = _main(capsys, "revert", "--json", "--site-dir", str(tmp_path))
    report = report_for(json.loads(out), BACKPORT_ID)
    assert report["action"] == "not-installed" and report["evidence"]["hook"]["removed"] is False
    assert report["reason"].startswith("nothing to revert")


def test_revert_json_under_an_upstream_fix_reports_upstream(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    _, out, _ = _main(capsys, "revert", "--json", "--site-dir", str(tmp_path))
    report = report_for(json.loads(out), BACKPORT_ID)
    assert (report["verdict"], report["action"]) == ("upstream", "not-installed")


# ---- the switches a `backports apply` runs under --------------------------------------------


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_apply_with_every_backport_off_writes_no_hook_and_says_so(
    tilelang_dsa, monkeypatch, capsys, tmp_path, value
):
    monkeypatch.setenv("MEGATRON_BACKPORTS", value)
    code, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert code == 0 and not job_start.read_hook(tmp_path).exists
    assert (
        f"hook: not written: every backport asked for is off (MEGATRON_BACKPORTS={value} is set)"
        in out
    )
    assert not hasattr(tilelang_dsa.fused_sparse_mla_absorbed, "__backport__")


def test_apply_with_every_backport_off_names_an_earlier_hook(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    job_start.write_hook(tmp_path)
    monkeypatch.setenv("MEGATRON_BACKPORTS", "0")
    _, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    hook = tmp_path / hook_file.HOOK_FILE
    assert f"{hook} from an earlier apply stays (`backports revert` removes it)" in out
    assert hook.exists()


def test_apply_leaves_skipped_backports_out_of_the_hook(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    ids = ", ".join(spec.id for spec in CATALOG)
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP", f"other, {ids}")
    code, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert code == 0 and not job_start.read_hook(tmp_path).exists
    expected = f"every backport asked for is off (MEGATRON_BACKPORTS_SKIP names {ids})"
    assert expected in out


def test_apply_says_the_hook_does_not_record_upstream_only(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    monkeypatch.setenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY", "yes")
    _, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert "MEGATRON_BACKPORTS_UPSTREAM_ONLY=yes holds for this process only" in out
    assert job_start.read_hook(tmp_path).config == {"strict": False, "only": None}
    monkeypatch.delenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY")
    _, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert "UPSTREAM_ONLY" not in out


def test_a_bad_switch_value_is_one_warning_line_among_the_notes(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    SESSION.warned.clear()
    monkeypatch.setenv("MEGATRON_BACKPORTS", "maybe")
    code, out, err = _main(capsys, "status", "--site-dir", str(tmp_path))
    lines = [line for line in err.splitlines() if "MEGATRON_BACKPORTS='maybe'" in line]
    assert lines == [
        "warning: megatron-backports: MEGATRON_BACKPORTS='maybe' is neither on (1, true, on, "
        "yes) nor off (0, false, off, no); using the default, on"
    ]
    assert code == 0 and "warning" not in out and "would-install" in out


# ---- conventions ----------------------------------------------------------------------------


def test_version_is_the_distribution_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert exit_.value.code == 0 and capsys.readouterr().out == f"megatron-backports {version}\n"


def test_help_lists_the_backport_ids_and_the_variables(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in (
        BACKPORT_ID,
        "MEGATRON_BACKPORTS=0",
        "MEGATRON_BACKPORTS_SKIP=ID,...",
        "MEGATRON_BACKPORTS_UPSTREAM_ONLY=1",
    ):
        assert name in out


TE_NOTICE = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers."


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["status"], False),
        (["-v", "status"], True),
        (["status", "-v"], True),
        (["--verbose", "status", "--json"], True),
    ],
)
def test_verbose_shows_import_notices_wherever_it_goes(
    tilelang_dsa, monkeypatch, capsys, tmp_path, argv, shown
):
    def status_importing_megatron(only=None):
        # megatron is imported once per test session; a fresh process warns while probing.
        warnings.warn(TE_NOTICE, UserWarning, stacklevel=1)
        return status(only)

    monkeypatch.setattr(api, "status", status_importing_megatron)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _main(capsys, *argv, "--site-dir", str(tmp_path))[0] == 0
    assert [str(w.message) for w in caught] == ([TE_NOTICE] if shown else [])


def test_known_import_notices_are_hidden_and_others_are_not(caplog):
    # What megatron-core 0.19.2 and torch print on a machine without CUDA, TE, Apex, absl.
    notices = [
        (
            UserWarning,
            "Transformer Engine and Apex are not installed. Falling back to Torch optimizers.",
        ),
        (UserWarning, "Apex is not installed. Falling back to Torch Norm"),
        (UserWarning, "absl.logging is not installed. Using logging.getLogger(__name__) instead."),
    ]
    cuda = "No CUDA runtime is found, using CUDA_HOME='/usr/local'"
    logger = logging.getLogger("torch.utils.cpp_extension")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        with output.import_notices_hidden():
            for category, message in notices:
                warnings.warn(message, category, stacklevel=1)
            warnings.warn("Transformer Engine is broken", UserWarning, stacklevel=1)
            logger.warning(cuda)
            logger.warning("something else")
        hidden_then = [str(w.message) for w in caught]
        logs_then = [r.getMessage() for r in caplog.records]
        warnings.warn(notices[0][1], UserWarning, stacklevel=1)
        logger.warning(cuda)
    assert hidden_then == ["Transformer Engine is broken"]
    assert logs_then == ["something else"]
    assert str(caught[-1].message) == notices[0][1]  # shown again after the block
    assert caplog.records[-1].getMessage() == cuda


def test_cli_ignores_this_interpreters_trigger(tilelang_dsa, capsys, tmp_path):
    exec(next(line for line in job_start.hook_text().splitlines() if line.startswith("import")))
    assert start_up.triggers()
    _main(capsys, "status", "--site-dir", str(tmp_path))
    assert start_up.triggers() == []


@pytest.mark.slow
def test_python_m_backports_megatron_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "backports.megatron", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    for command in ("status", "apply", "revert", "audit"):
        assert command in done.stdout


def test_apply_probes_each_backport_once_and_reads_the_hook_file_once(
    capsys, tmp_path, monkeypatch
):
    """The table is apply's own reports: no status() before it, and the hook file it
    wrote is not read back (twice) to describe itself."""
    from backports.megatron import api

    probed: list[str] = []
    real_probe = api.decide

    def counting_probe(spec, *args, **kwargs):
        probed.append(spec.id)
        return real_probe(spec, *args, **kwargs)

    reads: list[str] = []
    real_read = Path.read_text

    def counting_read(self, *args, **kwargs):
        if self.name == hook_file.HOOK_FILE:
            reads.append(str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(api, "decide", counting_probe)
    monkeypatch.setattr(Path, "read_text", counting_read)
    code, out, _ = _main(capsys, "apply", "--json", "--site-dir", str(tmp_path))
    assert code == 0
    # Every entry is decided once (an import guard without its sniff's children: status,
    # check and audit run them, and keep the verdict for the next process).
    ids = [row["id"] for row in json.loads(out)]
    assert sorted(probed) == sorted(ids) and len(set(probed)) == len(probed)
    assert len(reads) <= 1, reads  # a new file: none; an existing one: once, to compare


# ---- the exit status never depends on the pipe (issue 27.5) ----------------------------------

# A fresh interpreter whose one backport fails check without importing megatron: #7091 with
# a target module that does not exist, where megatron-core 0.19.2 should have it ("absent"
# from a version that should have it: the patch would do nothing).
_FAILING_CHECK = """
import dataclasses, sys
from backports.megatron import catalog, cli
spec = catalog.MEGATRON_LM_7091
target = dataclasses.replace(spec.target, modules=("backports_no_such_module",))
catalog.CATALOG = (dataclasses.replace(spec, targets=(target,)),)
sys.exit(cli.main(sys.argv[1:]))
"""


def _failing_check(*args: str, stdout: int | None) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", _FAILING_CHECK, "check", "--only", "megatron-lm-7091"]
    return subprocess.Popen(
        [*command, *args],
        env=_scrubbed_env(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def _scrubbed_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}


def test_check_fails_the_same_into_a_file_or_dev_null(tmp_path: Path) -> None:
    """The control: `backports check > /dev/null` exits 1, as into a file."""
    for target in (subprocess.DEVNULL, None):
        with open(tmp_path / "out.txt", "w") as out:
            child = _failing_check(stdout=out.fileno() if target is None else target)
            _, err = child.communicate(timeout=120)
        assert child.returncode == 1, err
    text = (tmp_path / "out.txt").read_text()
    assert "FAIL" in text and "check: 1 of 1 failed: megatron-lm-7091" in text


@pytest.mark.parametrize("json_flag", [(), ("--json",)], ids=["table", "json"])
def test_a_reader_that_hangs_up_never_changes_checks_exit_status(
    json_flag: tuple[str, ...],
) -> None:
    """`backports check | true` and `check --json | head -1`: the reader is gone before the
    first write (EPIPE on it); check still exits 1, with no traceback."""
    child = _failing_check(*json_flag, stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.close()
    _, err = child.communicate(timeout=120)
    assert child.returncode == 1, err
    assert "Traceback" not in err and "Broken pipe" not in err


def test_a_reader_that_reads_one_line_never_changes_checks_exit_status() -> None:
    """`check --json | head -1` as the shell runs it: one line read, then the pipe closed."""
    child = _failing_check("--json", stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip()
    child.stdout.close()
    _, err = child.communicate(timeout=120)
    assert child.returncode == 1, err
    assert "Traceback" not in err
