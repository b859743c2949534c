"""apply / status / revert / applied: the catalog through probe and patcher, with one warning.

Data flows one way: catalog -> probe -> verdict -> patcher -> report.
"""

import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType

from . import patcher, post_import
from .catalog import BackportSpec, select
from .errors import BackportError, BackportWarning
from .probe import ProbeResult, probe, probe_without_import
from .ranks import is_rank_zero
from .report import Action, Report, Verdict
from .targets import find_loaded_target
from .vendored import load_replacement

__all__ = ["applied", "apply", "disabled_reason", "is_deferred", "last_report", "revert", "status"]

ENV_ENABLE = "MEGATRON_BACKPORTS"  # "0" turns every backport off
ENV_SKIP = "MEGATRON_BACKPORTS_SKIP"  # comma-separated ids to turn off

_LOG = logging.getLogger("backports.megatron")
_SKIPPED = (Verdict.UPSTREAM, Verdict.INCOMPATIBLE, Verdict.ABSENT)
_warned: set[tuple[str, Verdict]] = set()
_last: dict[str, Report] = {}  # id -> what apply last decided in this process


class _StrictFailure(BackportError):
    # Raised from a post-import hook in strict mode: the import itself must fail.
    fatal_on_import = True


def disabled_reason(spec: BackportSpec) -> str | None:
    """Why the environment turns ``spec`` off, or None."""
    if os.environ.get(ENV_ENABLE, "").strip() == "0":
        return f"{ENV_ENABLE}=0 turns every backport off"
    skipped = {part.strip() for part in os.environ.get(ENV_SKIP, "").split(",")}
    if spec.id in skipped:
        return f"{ENV_SKIP} names {spec.id}"
    return None


def _announce(report: Report) -> None:
    """One BackportWarning per backport and verdict per process, from rank 0 only."""
    if report.action is Action.INSTALLED:
        _LOG.info("installed %s: %s", report.id, report.reason)
        return
    if report.action is not Action.SKIPPED or report.verdict not in _SKIPPED:
        return
    key = (report.id, report.verdict)
    if key in _warned:
        return
    _warned.add(key)
    message = f"megatron-backports: {report.id} not applied ({report.verdict}): {report.reason}"
    if is_rank_zero():
        warnings.warn(message, BackportWarning, stacklevel=5)  # the caller of apply()
    else:
        _LOG.debug("%s", message)


def _finish(spec: BackportSpec, result: ProbeResult) -> Report:
    """Install on ``needed``; otherwise skip. Records and announces the outcome."""
    if result.verdict is Verdict.NEEDED and result.target is not None:
        replacement = load_replacement(spec.vendored, result.target.module_name)
        _, fresh = patcher.install(spec.id, result.target, replacement)
        action = Action.INSTALLED if fresh else Action.ALREADY_INSTALLED
        report = Report(spec.id, result.verdict, action, result.reason, result.evidence)
    else:
        report = Report(spec.id, result.verdict, Action.SKIPPED, result.reason, result.evidence)
    _last[spec.id] = report
    _announce(report)
    return report


def _hook_key(spec: BackportSpec) -> str:
    return f"backports.megatron:{spec.id}"


def last_report(backport_id: str) -> Report | None:
    """What ``apply()`` last decided for this backport in this process, if it ran."""
    return _last.get(backport_id)


def is_deferred(spec: BackportSpec) -> bool:
    """Whether an import hook waits to probe and install ``spec`` on the target's import."""
    return bool(post_import.registered(_hook_key(spec)))


def _on_target_import(spec: BackportSpec, strict: bool) -> post_import.Callback:
    def callback(module: ModuleType) -> None:
        with patcher.lock():
            if patcher.installed(spec.id) is not None:
                return
            report = _finish(spec, probe(spec))
        if strict and report.verdict is Verdict.INCOMPATIBLE:
            raise _StrictFailure(f"{spec.id} is incompatible: {report.reason}")

    return callback


def _apply_one(spec: BackportSpec, strict: bool) -> Report:
    reason = disabled_reason(spec)
    if reason is not None:
        return Report(spec.id, Verdict.DISABLED, Action.SKIPPED, reason)
    current = patcher.installed(spec.id)
    if current is not None:
        last = _last.get(spec.id)
        why = last.reason if last else "installed earlier in this process"
        return Report(
            spec.id, Verdict.NEEDED, Action.ALREADY_INSTALLED, why, last.evidence if last else {}
        )
    early = probe_without_import(spec)
    if early.final:
        return _finish(spec, early)
    loaded = find_loaded_target(spec.target, spec.id) is not None
    if not loaded:
        # Patch the moment megatron defines the target, not before: importing megatron
        # here would cost the job ~9 s and happen in every process the hook reaches.
        for module_name in spec.target.modules:
            post_import.register(module_name, _hook_key(spec), _on_target_import(spec, strict))
        version = early.evidence["distribution"]["version"]
        reason = (
            f"{spec.target.distribution} {version} is not imported yet: the behaviour probe "
            f"runs, and the backport installs if needed, when {spec.target.modules[-1]} is imported"
        )
        return Report(spec.id, Verdict.NEEDED, Action.DEFERRED, reason, early.evidence)
    return _finish(spec, probe(spec))


def apply(only: str | Iterable[str] | None = None, *, strict: bool = False) -> list[Report]:
    """Probe each backport and install the ones that are needed (idempotent, thread-safe)."""
    with patcher.lock():
        reports = [_apply_one(spec, strict) for spec in select(only)]
    if strict:
        bad = [r for r in reports if r.verdict is Verdict.INCOMPATIBLE]
        if bad:
            raise BackportError("; ".join(f"{r.id} is incompatible: {r.reason}" for r in bad))
    return reports


def status(only: str | Iterable[str] | None = None) -> list[Report]:
    """Probe each backport and say what ``apply`` would do; changes nothing."""
    reports = []
    for spec in select(only):
        reason = disabled_reason(spec)
        if reason is not None:
            reports.append(Report(spec.id, Verdict.DISABLED, Action.WOULD_SKIP, reason))
            continue
        result = probe(spec)
        if patcher.installed(spec.id) is not None:
            action = Action.ALREADY_INSTALLED
        elif result.verdict is Verdict.NEEDED:
            action = Action.WOULD_INSTALL
        else:
            action = Action.WOULD_SKIP
        reports.append(Report(spec.id, result.verdict, action, result.reason, result.evidence))
    return reports


def revert(only: str | Iterable[str] | None = None) -> list[Report]:
    """Uninstall backports and drop their pending import hooks (idempotent)."""
    reports = []
    with patcher.lock():
        for spec in select(only):
            pending = is_deferred(spec)
            post_import.unregister(_hook_key(spec))
            removed = patcher.uninstall(spec.id)
            last = _last.pop(spec.id, None)
            # A later apply() is a new decision and may warn again.
            _warned.difference_update({key for key in _warned if key[0] == spec.id})
            verdict = last.verdict if last else Verdict.NEEDED
            if removed is not None:
                where = ", ".join(f"{m}.{a}" for m, a in removed.sites)
                report = Report(
                    spec.id, verdict, Action.REVERTED, f"restored the original at {where}"
                )
            elif pending:
                report = Report(
                    spec.id, verdict, Action.REVERTED, "dropped the pending import hook"
                )
            else:
                report = Report(spec.id, verdict, Action.NOT_INSTALLED, "nothing to revert")
            reports.append(report)
    return reports


@contextmanager
def applied(
    only: str | Iterable[str] | None = None, *, strict: bool = False
) -> Iterator[list[Report]]:
    """``apply`` on entry; on exit revert what this block installed or deferred."""
    reports = apply(only, strict=strict)
    mine = [r.id for r in reports if r.action in (Action.INSTALLED, Action.DEFERRED)]
    try:
        yield reports
    finally:
        if mine:
            revert(mine)
