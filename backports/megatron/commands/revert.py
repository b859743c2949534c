"""``backports revert``: remove the start-up hook files and revert in this process."""

import argparse
from dataclasses import replace

from .. import api, exit_status
from ..report import Action, Report
from . import _hook, _job, _options, output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options.add_report_formats(parser)
    _options.add_site_dir(parser)


def run(args: argparse.Namespace) -> int:
    site_dir = _hook.site_dir(args)
    here = {r.id: r for r in api.revert()}
    state, removed = _job.remove_hook(site_dir)
    # The table shows what was done; --json adds each backport's verdict and evidence,
    # which takes a probe (as `status --json`): revert itself decides nothing.
    reports = api.status() if args.json else list(here.values())
    reports = [_reverted(r, here[r.id], state if removed else None) for r in reports]
    files = str(state.path) + (f" and {state.start_path}" if state.start_exists else "")
    note = f"hook: removed {files}" if removed else f"hook: none at {state.path}"
    output.emit(args, reports, [note], (output.ID, output.ACTION, output.REASON))
    return exit_status.DONE


def _hook_applied(removed: _job.HookState, backport_id: str) -> bool:
    """Whether the removed hook applied ``backport_id`` (a file we cannot read: say yes)."""
    if removed.config is None:
        return True
    only = removed.config.get("only")
    return only is None or backport_id in only


def _reverted(report: Report, here: Report, removed: _job.HookState | None) -> Report:
    """``report`` saying what revert did for its backport: the hook, and this process."""
    hook_applied = removed is not None and _hook_applied(removed, report.id)
    done = []
    if removed is not None and hook_applied:
        done.append(f"removed the start-up hook {removed.path}: new processes do not apply it")
    elif removed is not None:
        done.append(f"the removed hook {removed.path} did not apply it")
    if here.action is Action.REVERTED:
        done.append(f"in this process: {here.reason}")
    reverted = hook_applied or here.action is Action.REVERTED
    reason = "; ".join(done) or "nothing to revert: no start-up hook, nothing installed here"
    hook = {"path": None if removed is None else str(removed.path), "removed": hook_applied}
    return replace(
        report,
        action=Action.REVERTED if reverted else Action.NOT_INSTALLED,
        reason=reason,
        evidence={**report.evidence, "hook": hook},
    )
