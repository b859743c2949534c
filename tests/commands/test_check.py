"""``backports check``, the CI gate: backports/megatron/commands/check.py and the command.

The verdict table is the judge's, unit-tested on hand-built reports; the command runs on
real megatron-core 0.19.2, with a copy of vendor/ edited to show a rotted backport.
"""

import json

import pytest

from backports.megatron import Action, Report, Verdict, cli
from backports.megatron.api import target_releases
from backports.megatron.commands.check import judge
from tests.conftest import BACKPORT_ID

# Fixtures: the real catalog entry reading its vendored code from an editable copy.
from tests.vendored.test_vendored import folder, spec  # noqa: F401


def report(verdict: Verdict, action: Action = Action.WOULD_SKIP, **distribution: object) -> Report:
    evidence = {"distribution": {"name": "megatron-core", **distribution}}
    return Report(BACKPORT_ID, verdict, action, "why", evidence)


@pytest.mark.parametrize(
    ("verdict", "applied_action", "ok"),
    [
        (Verdict.NEEDED, Action.INSTALLED, True),
        (Verdict.NEEDED, Action.ALREADY_INSTALLED, True),
        (Verdict.NEEDED, Action.SKIPPED, False),  # skipped where it should apply
        (Verdict.NEEDED, Action.DEFERRED, False),  # nothing installed in this process
        (Verdict.NEEDED, None, False),
        (Verdict.UPSTREAM, Action.SKIPPED, False),  # landed: delete it
        (Verdict.INCOMPATIBLE, Action.SKIPPED, False),
        (Verdict.DISABLED, Action.SKIPPED, True),
    ],
)
def test_judge(verdict: Verdict, applied_action: Action | None, ok: bool) -> None:
    probed = report(verdict, version="0.19.2")
    applied = None if applied_action is None else report(verdict, applied_action)
    assert judge(target_releases(BACKPORT_ID), probed, applied).ok is ok


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.18.2", True),  # predates the target (0.19): nothing to carry
        ("0.19.2", False),  # the target should be there: a moved target is a silent no-op
        ("1.0.0rc1", False),
        ("0.19.0rc0", False),  # a pre-release of the first release with the target has it
        ("0.18.0rc0", True),
        (None, False),  # not installed: nothing was checked
    ],
)
def test_an_absent_target_passes_only_before_it_existed(version: str | None, ok: bool) -> None:
    judgement = judge(target_releases(BACKPORT_ID), report(Verdict.ABSENT, version=version), None)
    assert judgement.ok is ok


def test_check_passes_on_megatron_core_0_19_2_and_changes_nothing(
    tilelang_dsa, capsys: pytest.CaptureFixture[str]
) -> None:
    original = tilelang_dsa.fused_sparse_mla_absorbed
    code = cli.main(["check", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    (entry,) = [r for r in json.loads(out) if r["id"] == BACKPORT_ID]
    assert (entry["verdict"], entry["check"]) == (
        "needed",
        {"ok": True, "why": entry["check"]["why"]},
    )
    assert "installs" in entry["check"]["why"]
    assert "check: all" in err
    assert tilelang_dsa.fused_sparse_mla_absorbed is original  # check reverted what it applied


@pytest.mark.usefixtures("spec", "tilelang_dsa")
def test_check_fails_once_the_vendored_file_is_edited(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = request.getfixturevalue("folder")
    assert cli.main(["check"]) == 0
    capsys.readouterr()
    vendored = copy / "tilelang_dsa.py"
    vendored.write_text(vendored.read_text() + "\n# a hand edit\n")
    code = cli.main(["check"])
    out = capsys.readouterr().out
    assert code == 1
    header, row, summary = out.splitlines()
    assert header.split() == ["id", "verdict", "check", "why"]
    assert row.split()[:3] == [BACKPORT_ID, "incompatible", "FAIL"]
    assert "tilelang_dsa.py has sha256" in row  # the probe's reason, so CI says what rotted
    # A handwritten folder (no upstream text to sync): the fix is --rehash, named.
    assert f"backports sync --backport {BACKPORT_ID} --rehash" in row
    assert summary == f"check: 1 of 1 failed: {BACKPORT_ID}"


@pytest.mark.parametrize(
    ("standin", "verdict", "ok"),
    [("fixed_upstream", "upstream", False), ("new_signature", "incompatible", False),
     (None, "needed", True)],
)  # fmt: skip
def test_a_disabled_backport_is_probed_anyway_and_fails_if_landed_or_rotted(
    tilelang_dsa, monkeypatch, capsys: pytest.CaptureFixture[str], standin, verdict, ok
) -> None:
    from tests import standins

    if standin is not None:
        monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", getattr(standins, standin))
    if standin == "fixed_upstream":  # landed: in a release recorded as carrying the fix
        standins.recorded_as_carrying_the_fix(monkeypatch)
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP", BACKPORT_ID)
    code = cli.main(["check", "--json", "--only", BACKPORT_ID])
    (entry,) = json.loads(capsys.readouterr().out)
    assert (code == 0) is ok
    assert entry["check"]["ok"] is ok
    assert "disabled here" in entry["check"]["why"]
    assert entry["evidence"]["probed_while_disabled"]["verdict"] == verdict
