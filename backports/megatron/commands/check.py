"""``backports check``, the CI gate: is every backport still carrying its weight, and does it
still apply?

A patch rots quietly: its fix lands upstream and the copy lives on, or a pin bump moves
the target and the patch stops applying while CI stays green. ``judge`` turns each report
into pass or fail so that ``backports check`` can make that a red CI run:

- ``incompatible``: fails (the target is not what the vendored code was written for, or
  the vendored code does not show the fix; "unfinished" for a scaffold's stub);
- ``upstream``: fails (the fix landed: delete the backport);
- ``absent``: passes only where the distribution predates the target (nothing to carry
  there); a target missing from a version that should have it, or a distribution that is
  not installed, fails: the backport would silently do nothing;
- ``needed``: passes only if ``apply`` really installed it in this process;
- ``disabled``: probed anyway: a switch in CI's environment must not hide a landed or rotted
  backport that jobs elsewhere still carry. It fails as the verdict would, saying it is
  disabled here; a needed or not-yet-existing one passes, with a note.

The command changes nothing: what it applies to see that it installs, it reverts.
"""

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .. import api, exit_status
from ..report import Action, Report, Verdict
from . import _hook, _job, _options, output

_INSTALLED = (Action.INSTALLED, Action.ALREADY_INSTALLED)


# ---- the judge -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    ok: bool
    why: str  # one line for the table

    def to_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "why": self.why}


def _absent(releases: api.TargetReleases | None, probed: Report) -> Judgement:
    distribution = probed.evidence.get("distribution") or {}
    name = distribution.get("name") or (releases.distribution if releases else "the target")
    version = distribution.get("version")
    if version is None or releases is None:
        return Judgement(False, f"{name} is not installed: nothing was checked")
    if releases.predate_the_target(str(version)):
        return Judgement(True, f"{name} {version} predates the target: nothing to carry")
    return Judgement(False, "the target is missing where it should exist: the patch does nothing")


def _vendored_unfixed(probed: Report) -> bool:
    """Whether the sniff on the vendored replacement (probe) did not show the fix."""
    shown = probed.evidence.get("vendored_behaviour")
    return isinstance(shown, dict) and any(
        isinstance(mode, dict) and mode.get("fixed") is False for mode in shown.values()
    )


def _disabled(releases: api.TargetReleases | None, anyway: Report | None) -> Judgement:
    """A backport the environment turns off, judged on what its probe found anyway."""
    if anyway is None or anyway.verdict is Verdict.DISABLED:
        return Judgement(True, "disabled by the environment: not checked")
    if anyway.verdict is Verdict.NEEDED:
        return Judgement(True, f"disabled here; still needed where it runs: {anyway.reason}")
    found = judge(releases, anyway, None)
    return Judgement(found.ok, f"disabled here; {found.why}")


def judge(
    releases: api.TargetReleases | None,
    probed: Report,
    applied: Report | None,
    anyway: Report | None = None,
) -> Judgement:
    """Pass or fail for one backport: ``probed`` from ``status``, ``applied`` from ``apply``,
    ``anyway``: what the probe found for a disabled one (see ``_disabled``).

    ``releases`` (``api.target_releases``) is None for a plugin the catalog withheld (its
    report is incompatible, or disabled by ``MEGATRON_BACKPORTS_SKIP_PLUGINS``).
    """
    verdict = probed.verdict
    if verdict is Verdict.INCOMPATIBLE and probed.evidence.get("unfinished"):
        return Judgement(False, f"unfinished, write it: {probed.reason}")
    if verdict is Verdict.INCOMPATIBLE and _vendored_unfixed(probed):
        return Judgement(False, f"would install code without the fix: {probed.reason}")
    if verdict is Verdict.INCOMPATIBLE:
        return Judgement(False, f"does not fit, update or delete it: {probed.reason}")
    if verdict is Verdict.UPSTREAM:
        return Judgement(False, f"landed upstream, delete it: {probed.reason}")
    if verdict is Verdict.ABSENT:
        return _absent(releases, probed)
    if verdict is Verdict.DISABLED:
        return _disabled(releases, anyway)
    if applied is None or applied.action not in _INSTALLED:
        action = "no report" if applied is None else f"{applied.action}: {applied.reason}"
        return Judgement(False, f"needed but not installed ({action})")
    return Judgement(True, "needed, and it installs")


# ---- the command ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options.add_report_formats(parser)
    _options.add_only(parser)


def _with_probe_anyway(report: Report, anyway: Report | None) -> Report:
    if anyway is None:
        return report
    found = {"verdict": str(anyway.verdict), "reason": anyway.reason}
    return replace(report, evidence={**report.evidence, "probed_while_disabled": found})


def run(args: argparse.Namespace) -> int:
    only = _options.only(args)
    # Imports the targets, so the apply below installs now; proves (and keeps) the sniffs
    # that only check and apply run.
    probed = api.status_proving(only)
    # The same action words as `status`: a backport the environment's hook installs says so.
    hook = _hook.Hook.read(_job.default_site_dir())
    probed = [_hook.with_hook(report, hook) for report in probed]
    probing_warnings = len(args.warning_notes)  # a bad switch value, an unknown skipped id
    with api.applied(only) as done:  # and reverts on exit: check changes nothing
        installed = {r.id: r for r in done}
    del args.warning_notes[probing_warnings:]  # apply's repeat what the "why" column says
    anyway = {r.id: api.probe_anyway(r.id) for r in probed if r.verdict is Verdict.DISABLED}
    probed = [_with_probe_anyway(r, anyway.get(r.id)) for r in probed]
    verdicts = {
        r.id: judge(api.target_releases(r.id), r, installed.get(r.id), anyway.get(r.id))
        for r in probed
    }
    failed = [r.id for r in probed if not verdicts[r.id].ok]
    summary = (
        f"check: {len(failed)} of {len(probed)} failed: {', '.join(failed)}"
        if failed
        else f"check: all {len(probed)} backports ok"
    )
    columns = (
        output.ID,
        output.VERDICT,
        ("check", _ok_cell(verdicts)),
        ("why", _why_cell(verdicts)),
    )
    totals = {"ok": not failed, "failed": failed}
    extra = (("check", _as_json(verdicts)),)
    output.emit(args, probed, [summary], columns, json_extra=extra, extra_summary=totals)
    return exit_status.FAILED if failed else exit_status.DONE


def _ok_cell(verdicts: dict[str, Judgement]) -> Callable[[Report], str]:
    return lambda report: "ok" if verdicts[report.id].ok else "FAIL"


def _why_cell(verdicts: dict[str, Judgement]) -> Callable[[Report], str]:
    return lambda report: verdicts[report.id].why


def _as_json(verdicts: dict[str, Judgement]) -> Callable[[Report], Any]:  # a dict, not a str
    return lambda report: verdicts[report.id].to_dict()
