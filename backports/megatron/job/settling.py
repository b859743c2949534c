"""From decisions to reports: install each ``needed`` backport, skip the others.

Every decision is made before any install (a verdict never depends on another backport
being installed: the verdict cache, keyed by each target alone, assumes as much); then the
needed ones are installed together, with one scan for module aliases for them all. Each
outcome is recorded on the session (``last_report``); the caller announces them once
everything is recorded.
"""

from collections.abc import Sequence
from typing import Any

from ..decision import Decision
from ..kinds.install import Replacement, Request, install_all
from ..model import UPSTREAM_ONLY, BackportSpec
from ..report import Action, Report, Verdict
from ..session import SESSION

# Appended to the reason of a backport that runs (or would run) upstream's code alone.
UPSTREAM_ONLY_NOTE = " [upstream only: no local changes]"

_Outcome = tuple[Any, bool] | Exception | None


def mode_evidence(spec: BackportSpec, mode: str) -> dict[str, object]:
    """Which mode runs (or would run), and each local change the catalog declares."""
    active = mode != UPSTREAM_ONLY
    return {
        "mode": mode,
        "local_changes": [{**c.to_dict(), "active": active} for c in spec.local_changes],
    }


def _request(decision: Decision) -> Request:
    replacements = [
        Replacement(target, resolved, replacement)
        for target, resolved, replacement in zip(
            decision.spec.targets,
            decision.targets,
            decision.replacements().installed,
            strict=True,
        )
    ]
    markers = {"__backport_mode__": decision.mode}
    return Request(decision.spec.id, decision.mode, replacements, markers)


def settle(decisions: Sequence[Decision]) -> list[Report]:
    """Install each decision that is ``needed``, all at once; a report for every one."""
    outcomes: dict[int, _Outcome] = {}
    requests: dict[int, Request] = {}
    for index, decision in enumerate(decisions):
        if decision.installable:
            try:
                requests[index] = _request(decision)
            except Exception as exc:  # the vendored module cannot be built: not installed
                outcomes[index] = exc
    outcomes.update(zip(requests, install_all(list(requests.values())), strict=True))
    reports = [_report(decision, outcomes.get(index)) for index, decision in enumerate(decisions)]
    with SESSION.lock:
        SESSION.last.update((report.id, report) for report in reports)
    return reports


def _report(decision: Decision, outcome: _Outcome) -> Report:
    """What became of a decision: skipped (``outcome`` None), not installed (an exception:
    the install undid any partial rebind), or installed."""
    spec = decision.spec
    assert decision.verdict is not None
    evidence = {**decision.evidence, **mode_evidence(spec, decision.mode)}
    if outcome is None:
        return Report(spec.id, decision.verdict, Action.SKIPPED, decision.reason, evidence)
    if isinstance(outcome, Exception):
        reason = f"install failed: {type(outcome).__name__}: {outcome}"
        return Report(spec.id, Verdict.INCOMPATIBLE, Action.SKIPPED, reason, evidence)
    installation, fresh = outcome
    action = Action.INSTALLED if fresh else Action.ALREADY_INSTALLED
    reason = decision.reason + (UPSTREAM_ONLY_NOTE if decision.upstream_only else "")
    if fresh:
        reason += installation.notes.get("note", "")
        evidence.update(installation.notes.get("evidence", {}))
    return Report(spec.id, decision.verdict, action, reason, evidence)
