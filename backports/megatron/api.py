"""apply / status / revert / applied: the catalog through probe and patcher, with one warning.

Data flows one way: catalog -> probe -> verdict -> patcher -> report.
"""

import hashlib
import logging
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import ModuleType
from typing import Any

from . import compiled_code, import_guards, patcher, switches, vendored_sniff, verdict_cache
from .activation import once_per_job, post_import
from .catalog import entries, select, select_withheld, source, withheld
from .errors import BackportError, BackportWarning
from .model import BackportSpec
from .one_look import one_look
from .probe import ProbeResult, guard_target_evidence, probe, probe_without_import
from .report import Action, Report, Verdict
from .targets import all_loaded, find_loaded_target, live_decorator, resolve_target
from .vendored import replacement_functions, vendored_module
from .versions import describe

__all__ = [
    "applied",
    "apply",
    "disabled_reason",
    "in_force",
    "is_deferred",
    "last_report",
    "load_targets",
    "probe_ignoring_switches",
    "revert",
    "status",
]

# The environment switches; switches.py reads them (spellings, warnings).
ENV_ENABLE = switches.ENABLE
ENV_SKIP = switches.SKIP
ENV_UPSTREAM_ONLY = switches.UPSTREAM_ONLY

# The two modes an installed backport runs in: "upstream-only", "local-changes".
UPSTREAM_ONLY = vendored_sniff.UPSTREAM_ONLY
WITH_LOCAL_CHANGES = vendored_sniff.WITH_LOCAL_CHANGES

_LOG = logging.getLogger("backports.megatron")
_SKIPPED = (Verdict.UPSTREAM, Verdict.INCOMPATIBLE, Verdict.ABSENT)
_warned: set[str] = set()  # _said_key of each warning decided in this process
_last: dict[str, Report] = {}  # id -> what apply last decided in this process
# id -> (spec, strict, upstream_only) of each backport whose post-import hook is registered.
_watched: dict[str, tuple[BackportSpec, bool, bool]] = {}


class _StrictFailure(BackportError):
    # Raised from a post-import hook in strict mode: the import itself must fail.
    fatal_on_import = True


def disabled_reason(spec: BackportSpec) -> str | None:
    """Why the environment turns ``spec`` off, or None."""
    return switches.disabled_reason(spec.id)


def _announce(report: Report, stacklevel: int = 3) -> None:
    """One BackportWarning per backport, verdict and reason per job (see ``once_per_job``).
    ``stacklevel`` 3 names the caller of the function that calls this one (``apply``)."""
    if report.action is Action.INSTALLED:
        _LOG.info("installed %s: %s", report.id, report.reason)
        return
    if report.action is not Action.SKIPPED or report.verdict not in _SKIPPED:
        return
    said = _said_key(report)
    if said in _warned:
        return
    _warned.add(said)
    message = f"megatron-backports: {report.id} not applied ({report.verdict}): {report.reason}"
    # Rank 0 only, and not again in the workers and spawn children of a process that warned.
    if once_per_job.may_say(said):
        if _warn_shown(message, stacklevel):
            once_per_job.record(said)  # only what was shown: a child may show what was dropped
    else:
        _LOG.debug("%s (said once per job: by rank 0, or by a parent process)", message)


def _said_key(report: Report) -> str:
    """id:verdict:<digest of the reason>: another reason (a new sniff, another version) is
    news, the same one in a child process is not."""
    digest = hashlib.sha256(report.reason.encode()).hexdigest()[:12]
    return f"{report.id}:{report.verdict}:{digest}"


def _warn_shown(message: str, stacklevel: int) -> bool:
    """Warn through the user's filters; whether the warning was shown (not dropped by an
    ``ignore`` filter or a ``once`` already spent). An ``error`` filter raises, as ever."""
    with warnings.catch_warnings(record=True) as caught:  # keeps the filters as they are
        warnings.warn(message, BackportWarning, stacklevel=stacklevel + 1)
    for shown in caught:
        warnings.showwarning(shown.message, shown.category, shown.filename, shown.lineno)
    return bool(caught)


def upstream_only_requested(upstream_only: bool | None = None) -> bool:
    """The argument if given, else ``MEGATRON_BACKPORTS_UPSTREAM_ONLY``."""
    if upstream_only is not None:
        return upstream_only
    return switches.upstream_only()


def mode_evidence(spec: BackportSpec, upstream_only: bool) -> dict[str, object]:
    """Which mode runs (or would run), and each local change the catalog declares."""
    active = not upstream_only
    return {
        "mode": _mode(upstream_only),
        "local_changes": [{**c.to_dict(), "active": active} for c in spec.local_changes],
    }


def _mode(upstream_only: bool) -> str:
    return vendored_sniff.mode_name(upstream_only)


# Appended to the reason of a backport that runs (or would run) upstream's code alone.
_UPSTREAM_ONLY_NOTE = " [upstream only: no local changes]"


def installed_mode(backport_id: str) -> str | None:
    """The mode of the installed replacement, or None when nothing is installed."""
    guard = import_guards.installed(backport_id)
    if guard is not None:
        return guard.mode
    installation = patcher.installed(backport_id)
    if installation is None:
        return None
    return str(getattr(installation.replacement, "__backport_mode__", WITH_LOCAL_CHANGES))


def _replacements(
    spec: BackportSpec, result: ProbeResult, upstream_only: bool
) -> list[patcher.Replacement]:
    """One per target, in catalog order. The vendored module reads the first target's
    module; the local changes wrap the first target's replacement."""
    replacements = []
    functions = replacement_functions(
        spec,
        vendored_module(spec.vendored),
        result.targets[0].module_name,
        upstream_only=upstream_only,
    )
    for target, resolved, vendored in zip(spec.targets, result.targets, functions, strict=True):
        decorator = None
        if resolved.decorated and target.decorator is not None:
            decorator = live_decorator(target.decorator)
        replacements.append(patcher.Replacement(resolved, vendored, decorator))
    return replacements


# A backport's probe result, and the mode (upstream only or not) it is to install in.
_Decided = tuple[BackportSpec, ProbeResult, bool]
_Outcome = tuple[patcher.Installation, bool] | Exception | None


def _settle(decided: list[_Decided]) -> list[Report]:
    """Install each ``needed`` backport, with one scan for aliases for them all (it reads
    every module's globals: ~5 ms with torch loaded); skip the others. Records each outcome
    (``last_report``); the caller announces them, once everything is recorded.

    Every probe ran before any install: a verdict never depends on another backport being
    installed (the verdict cache, keyed by each target alone, assumes as much).
    """
    requests: list[patcher.Request] = []
    positions: list[int] = []
    outcomes: dict[int, _Outcome] = {}
    for index, (spec, result, upstream_only) in enumerate(decided):
        if result.verdict is not Verdict.NEEDED or not result.targets:
            continue
        try:
            replacements = _replacements(spec, result, upstream_only)
        except Exception as exc:
            outcomes[index] = exc
            continue
        requests.append((spec.id, replacements, {"__backport_mode__": _mode(upstream_only)}))
        positions.append(index)
    outcomes.update(zip(positions, patcher.install_all(requests), strict=True))
    reports = [
        _report(spec, result, upstream_only, outcomes.get(index))
        for index, (spec, result, upstream_only) in enumerate(decided)
    ]
    _last.update((report.id, report) for report in reports)
    return reports


def _report(
    spec: BackportSpec, result: ProbeResult, upstream_only: bool, outcome: _Outcome
) -> Report:
    """What became of a probed backport: skipped (``outcome`` None), not installed (an
    exception: install undid any partial rebind), or installed."""
    evidence = {**result.evidence, **mode_evidence(spec, upstream_only)}
    if outcome is None:
        return Report(spec.id, result.verdict, Action.SKIPPED, result.reason, evidence)
    if isinstance(outcome, Exception):
        reason = f"install failed: {type(outcome).__name__}: {outcome}"
        return Report(spec.id, Verdict.INCOMPATIBLE, Action.SKIPPED, reason, evidence)
    _, fresh = outcome
    action = Action.INSTALLED if fresh else Action.ALREADY_INSTALLED
    reason = result.reason + (_UPSTREAM_ONLY_NOTE if upstream_only else "")
    if fresh:
        reason += _dropped_compiled_code(spec, result, evidence)
    return Report(spec.id, result.verdict, action, reason, evidence)


def _dropped_compiled_code(
    spec: BackportSpec, result: ProbeResult, evidence: dict[str, Any]
) -> str:
    """Drop torch.compile's code compiled before this install (it may have inlined an
    original method, see ``compiled_code``); a note for the reason, or ""."""
    try:
        dropped = compiled_code.drop_stale(t.is_method for t in result.targets)
    except Exception as exc:  # torch internals moved: say so, never fail the install
        _LOG.warning("%s: cannot check torch.compile's earlier code: %r", spec.id, exc)
        return ""
    if not dropped:
        return ""
    evidence["compiled_before_apply"] = dropped
    shown = ", ".join(dropped[:3]) + (f" and {len(dropped) - 3} more" if len(dropped) > 3 else "")
    note = (
        f" [torch.compile had compiled {shown} before the install: that code was dropped and "
        "recompiles with the backport; call apply() before torch.compile]"
    )
    _LOG.warning("%s:%s", spec.id, note)
    return note


def _probe_with_cache(spec: BackportSpec, upstream_only: bool) -> ProbeResult:
    """``probe(spec)``, or the verdict a process of this environment proved for the very same
    files and code (``verdict_cache``); a verdict probed here is kept for the next process.
    ``upstream_only``: the mode it is to install in (its vendored code is sniffed in it)."""
    if not verdict_cache.enabled():
        return probe(spec, upstream_only)
    try:
        key = verdict_cache.fingerprint(spec)
        hit = None if key is None else verdict_cache.load(spec, key, upstream_only=upstream_only)
        found = [find_loaded_target(target, spec.id) for target in spec.targets]
        loaded = tuple(t for t in found if t is not None)
        if len(loaded) != len(found):
            loaded = ()
    except Exception as exc:  # an optimisation only: never a reason to fail or to skip
        _LOG.debug("verdict cache not used for %s: %r", spec.id, exc)
        key, hit, loaded = None, None, ()
    if hit is not None and loaded:
        stored, path = hit
        evidence = {**stored["evidence"], "cache": {"hit": True, "file": str(path)}}
        return ProbeResult(Verdict(stored["verdict"]), stored["reason"], evidence, loaded)
    result = probe(spec, upstream_only)
    # Kept only if the probe judged the very functions the key describes (it may import a
    # module of a newer layout that the key did not see).
    judged = [t.original for t in result.targets]
    if key is not None and loaded and judged == [t.original for t in loaded]:
        kept = verdict_cache.store(spec, key, str(result.verdict), result.reason, result.evidence)
        result.evidence["cache"] = {"hit": False, "file": None if kept is None else str(kept)}
    return result


def _probe_guard_with_cache(spec: BackportSpec, upstream_only: bool) -> ProbeResult:
    """An import guard's ``probe(spec)`` (two child interpreters importing torch and
    megatron), or the verdict one proved for the very same interpreter, path, files and
    environment (``verdict_cache``); a verdict probed here is kept for the next command.
    What describes this process (the guard installed, the module executed) is read afresh."""
    if not verdict_cache.enabled():
        return probe(spec, upstream_only)
    try:
        key = verdict_cache.fingerprint(spec)
        hit = None if key is None else verdict_cache.load(spec, key, upstream_only=upstream_only)
    except Exception as exc:  # an optimisation only: never a reason to fail or to skip
        _LOG.debug("verdict cache not used for %s: %r", spec.id, exc)
        key, hit = None, None
    if hit is not None:
        stored, path = hit
        target = guard_target_evidence(spec)
        evidence = {**stored["evidence"], "target": target, "targets": [target]}
        evidence["cache"] = {"hit": True, "file": str(path)}
        return ProbeResult(Verdict(stored["verdict"]), stored["reason"], evidence)
    result = probe(spec, upstream_only)
    if key is not None:
        kept = verdict_cache.store(spec, key, str(result.verdict), result.reason, result.evidence)
        result.evidence["cache"] = {"hit": False, "file": None if kept is None else str(kept)}
    return result


def _probe_for_status(spec: BackportSpec, upstream_only: bool | None = None) -> ProbeResult:
    """What ``status`` and ``check`` probe: a function target afresh (milliseconds, once
    megatron is imported), an import guard through the verdict cache."""
    if spec.guard is None:
        return probe(spec, upstream_only)
    return _probe_guard_with_cache(spec, upstream_only_requested(upstream_only))


def _hook_key(spec: BackportSpec) -> str:
    return f"backports.megatron:{spec.id}"


def last_report(backport_id: str) -> Report | None:
    """What ``apply()`` last decided for this backport in this process, if it ran."""
    return _last.get(backport_id)


def is_deferred(spec: BackportSpec) -> bool:
    """Whether an import hook waits to probe and install ``spec`` on the target's import."""
    return bool(post_import.registered(_hook_key(spec))) and patcher.installed(spec.id) is None


def _watch_target(spec: BackportSpec, strict: bool, upstream_only: bool) -> None:
    """Probe and install on every (re-)import of a target module: the first import of a
    deferred backport, and a reload or fresh import that put an original back."""
    _watched[spec.id] = (spec, strict, upstream_only)
    for module_name in dict.fromkeys(m for target in spec.targets for m in target.modules):
        post_import.register(module_name, _hook_key(spec), _on_target_import)


def _on_target_import(module: ModuleType) -> None:
    """Every watched backport that waits for ``module`` and whose targets are now all loaded,
    probed and installed together. One call for them all (post_import runs a callback
    registered under several keys once per import): their installs share one scan for
    aliases. A strict backport that is incompatible fails the import before anything is
    installed in it."""
    with patcher.lock(), one_look():
        due = _waiting_for(module.__name__)
        decided = [(spec, _probe_with_cache(spec, mode), mode) for spec, _, mode in due]
        strict = {spec.id for spec, is_strict, _ in due if is_strict}
        refused = [d for d in decided if d[0].id in strict and d[1].verdict is Verdict.INCOMPATIBLE]
        reports = _settle(refused or decided)
        for report in reports:
            _announce(report)
    failures = [
        f"{report.id} is incompatible: {report.reason}"
        for report in reports
        if report.id in strict and report.verdict is Verdict.INCOMPATIBLE
    ]
    if failures:
        raise _StrictFailure("; ".join(failures))


def _waiting_for(module_name: str) -> list[tuple[BackportSpec, bool, bool]]:
    """The watched backports (spec, strict, upstream_only) whose hook waits for this module,
    not installed, with every target loaded (else a later target's import probes), in
    catalog order."""
    order = {spec.id: index for index, spec in enumerate(entries())}
    waiting = [
        watched
        for watched in _watched.values()
        if module_name in post_import.registered(_hook_key(watched[0]))
        and patcher.installed(watched[0].id) is None
        and all_loaded(watched[0].targets, watched[0].id)
    ]
    return sorted(waiting, key=lambda watched: order.get(watched[0].id, len(order)))


def _apply_early(spec: BackportSpec, strict: bool, upstream_only: bool) -> Report | None:
    """``apply`` for ``spec`` as far as it goes without probing a loaded target: disabled,
    already installed (in the other mode: uninstalled), absent or drifted (recorded), or
    deferred to the target's import (its hook registered). None: the target is to be probed."""
    reason = disabled_reason(spec)
    if reason is not None:
        return Report(spec.id, Verdict.DISABLED, Action.SKIPPED, reason)
    mode = installed_mode(spec.id)
    if mode is not None and (mode == UPSTREAM_ONLY) != upstream_only:
        # Asked for the other mode: swap the replacement, under the same lock.
        patcher.uninstall(spec.id)
        import_guards.uninstall(spec.id)
        mode = None
    if mode is not None:
        last = _last.get(spec.id)
        why = last.reason if last else "installed earlier in this process"
        return Report(
            spec.id, Verdict.NEEDED, Action.ALREADY_INSTALLED, why, last.evidence if last else {}
        )
    early = probe_without_import(spec)
    if early.final:
        return _settle([(spec, early, upstream_only)])[0]
    if spec.guard is not None:
        return _install_guard(spec, early, upstream_only)
    if not all_loaded(spec.targets, spec.id):
        # Patch the moment megatron defines the target, not before: importing megatron
        # here would cost the job ~9 s and happen in every process the hook reaches.
        _watch_target(spec, strict, upstream_only)
        version = describe(spec.target.distribution, early.evidence["distribution"])
        reason = (
            f"{version} is not imported yet: the behaviour probe "
            f"runs, and the backport installs if needed, when {spec.target.modules[-1]} is imported"
        )
        evidence = {**early.evidence, **mode_evidence(spec, upstream_only)}
        return Report(spec.id, Verdict.NEEDED, Action.DEFERRED, reason, evidence)
    return None


def _install_guard(spec: BackportSpec, early: ProbeResult, upstream_only: bool) -> Report:
    """Put an import guard in place before its module executes.

    Its sniff imports the module in a child process (tens of seconds): too slow for every
    process of a job, so ``apply`` decides on what it can see without it (version, vendored
    files) and ``status`` / ``check`` / ``audit`` run the sniff. Where upstream's fix is
    present the guard changes nothing: it decides as upstream does.
    """
    guard = spec.guard
    assert guard is not None
    evidence = {**early.evidence, **mode_evidence(spec, upstream_only)}
    try:
        factory = getattr(vendored_module(spec.vendored), guard.replacement_name)
        import_guards.install(spec.id, guard.modules[0], factory, _mode(upstream_only))
    except Exception as exc:
        reason = f"install failed: {type(exc).__name__}: {exc}"
        report = Report(spec.id, Verdict.INCOMPATIBLE, Action.SKIPPED, reason, evidence)
    else:
        module = guard.modules[0]
        version = describe(guard.distribution, early.evidence["distribution"])
        if module in sys.modules:
            when = "already ran unguarded in this process; a reload or re-import runs"
        else:
            when = "runs from its first import"
        reason = (
            f"{version}: {module} {when} inside {guard.replacement_name} (the import "
            "behaviour is sniffed by `backports status`, in a child process)"
        )
        reason += _UPSTREAM_ONLY_NOTE if upstream_only else ""
        report = Report(spec.id, Verdict.NEEDED, Action.INSTALLED, reason, evidence)
    _last[spec.id] = report
    return report


def _install_loaded(specs: list[BackportSpec], strict: bool, upstream_only: bool) -> list[Report]:
    """Probe backports whose targets are loaded, install the needed ones together, and
    watch each installed one for a re-import of its target."""
    reports = _settle(
        [(spec, _probe_with_cache(spec, upstream_only), upstream_only) for spec in specs]
    )
    for spec, report in zip(specs, reports, strict=True):
        if report.action is Action.INSTALLED:
            _watch_target(spec, strict, upstream_only)
    return reports


def _selection(only: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """``only`` read once (it may be a generator), as ids; None: every backport."""
    if only is None:
        return None
    return (only,) if isinstance(only, str) else tuple(only)


def _warn_unknown_skips() -> None:
    known = [spec.id for spec in entries()] + [w.id for w in withheld()]
    switches.warn_unknown_skips(known)


def _withheld(only: tuple[str, ...] | None, action: Action) -> list[Report]:
    """One report per plugin (or id) the catalog withheld: it never reaches the probe."""
    return [
        Report(w.id, w.verdict, action, w.reason, {"plugin": {"source": w.source}}, w.source)
        for w in select_withheld(only)
    ]


def _sourced(reports: list[Report]) -> list[Report]:
    """Each report saying where its entry comes from (builtin, or a plugin distribution)."""
    return [replace(report, source=source(report.id)) for report in reports]


def apply(
    only: str | Iterable[str] | None = None,
    *,
    strict: bool = False,
    upstream_only: bool | None = None,
) -> list[Report]:
    """Probe each backport and install the ones that are needed (idempotent, thread-safe).

    ``upstream_only=True`` (default: ``MEGATRON_BACKPORTS_UPSTREAM_ONLY=1``) installs the
    vendored code alone, without this project's local changes; asking for the other mode
    than the installed one swaps the replacement.
    """
    upstream_only = upstream_only_requested(upstream_only)
    ids = _selection(only)
    _warn_unknown_skips()
    with patcher.lock(), one_look():
        specs = select(ids)
        early = [_apply_early(spec, strict, upstream_only) for spec in specs]
        due = [spec for spec, report in zip(specs, early, strict=True) if report is None]
        probed = iter(_install_loaded(due, strict, upstream_only))
        reports = [report if report is not None else next(probed) for report in early]
        for report in reports:  # in catalog order, once every outcome is recorded
            _announce(report)
    withheld = _withheld(ids, Action.SKIPPED)
    for report in withheld:
        _announce(report)
    reports = _sourced(reports) + withheld
    if strict:
        bad = [r for r in reports if r.verdict is Verdict.INCOMPATIBLE]
        if bad:
            raise BackportError("; ".join(f"{r.id} is incompatible: {r.reason}" for r in bad))
    return reports


def status(only: str | Iterable[str] | None = None) -> list[Report]:
    """Probe each backport and say what ``apply`` would do; changes nothing."""
    ids = _selection(only)
    _warn_unknown_skips()
    with one_look():
        reports = _shadowed([_status_one(spec) for spec in select(ids)])
    return _sourced(reports) + _withheld(ids, Action.WOULD_SKIP)


def _resolved_targets(report: Report) -> set[str]:
    return {f"{t['module']}.{t['attribute']}" for t in report.evidence.get("targets", [])}


def _shadowed(reports: list[Report]) -> list[Report]:
    """Each report that would install on a target an earlier entry (in catalog order:
    builtins first) installs on too, turned into what ``apply`` finds: that target is
    already patched, so this entry never installs (``incompatible``)."""
    taken: dict[str, str] = {}  # "module.attribute" -> the id that installs there first
    shown = []
    for report in reports:
        targets = _resolved_targets(report)
        if report.action in (Action.WOULD_INSTALL, Action.ALREADY_INSTALLED):
            clash = sorted(t for t in targets if t in taken and taken[t] != report.id)
            if clash and report.action is Action.WOULD_INSTALL:
                owner = taken[clash[0]]
                reason = (
                    f"{', '.join(clash)} is also the target of {owner} ({source(owner)}), which "
                    f"installs first: {report.id} never installs while {owner} does "
                    f"(MEGATRON_BACKPORTS_SKIP={owner} to use this one)"
                )
                report = replace(
                    report, verdict=Verdict.INCOMPATIBLE, action=Action.WOULD_SKIP, reason=reason
                )
            else:
                taken.update((t, taken.get(t, report.id)) for t in targets)
        shown.append(report)
    return shown


def probe_ignoring_switches(spec: BackportSpec) -> Report:
    """What the probe finds for ``spec`` whatever the environment's switches say (``check``
    probes a disabled backport too); changes nothing."""
    with one_look():
        result = _probe_for_status(spec)
    return Report(spec.id, result.verdict, Action.WOULD_SKIP, result.reason, result.evidence)


def _status_one(spec: BackportSpec) -> Report:
    reason = disabled_reason(spec)
    if reason is not None:
        return Report(spec.id, Verdict.DISABLED, Action.WOULD_SKIP, reason)
    mode = installed_mode(spec.id)
    upstream_only = upstream_only_requested() if mode is None else mode == UPSTREAM_ONLY
    result = _probe_for_status(spec, upstream_only)
    if mode is not None:
        action = Action.ALREADY_INSTALLED
    elif result.verdict is Verdict.NEEDED:
        action = Action.WOULD_INSTALL
    else:
        action = Action.WOULD_SKIP
    evidence = {**result.evidence, **mode_evidence(spec, upstream_only)}
    reason = result.reason + (_UPSTREAM_ONLY_NOTE if upstream_only else "")
    return Report(spec.id, result.verdict, action, reason, evidence)


def load_targets(only: str | Iterable[str] | None = None) -> None:
    """Import every module the selected backports patch, so that ``apply()`` probes and
    installs now instead of deferring to their import (what ``backports apply`` and
    ``check`` show is then the truth for this environment). A target that cannot be
    found or imported is left for the probe to report."""
    for spec in select(_selection(only)):
        if disabled_reason(spec) is not None:
            continue
        for target in spec.targets:
            try:
                resolve_target(target, spec.id)
            except Exception as exc:  # the probe says why, in the report
                _LOG.debug("%s: %s not loaded: %r", spec.id, target.attribute, exc)


def in_force(spec: BackportSpec) -> tuple[Verdict | None, str, dict[str, Any]]:
    """What this process runs for ``spec``: (verdict, action, the evidence of a probe that
    imports nothing), importing nothing megatron has not imported yet.

    ``action``: "installed"; "skipped" (``apply()`` decided not to, or it is disabled);
    "deferred" (installs when megatron's target is imported); "not-applied" (``apply()``
    was not called). The verdict is None while nothing decided it and the target is not
    imported: deciding would import it.
    """
    early = probe_without_import(spec)
    last = last_report(spec.id)
    if patcher.installed(spec.id) is not None or import_guards.installed(spec.id) is not None:
        return (last.verdict if last else Verdict.NEEDED), "installed", early.evidence
    if last is not None:
        return last.verdict, "skipped", early.evidence
    if disabled_reason(spec) is not None:
        return Verdict.DISABLED, "skipped", early.evidence
    if early.final:
        return early.verdict, "not-applied", early.evidence
    # An import guard's probe imports its module in a child process: never here.
    if spec.guard is None and all_loaded(spec.targets, spec.id):
        return probe(spec).verdict, "not-applied", early.evidence
    return None, "deferred" if is_deferred(spec) else "not-applied", early.evidence


def revert(only: str | Iterable[str] | None = None) -> list[Report]:
    """Uninstall backports and drop their pending import hooks (idempotent)."""
    ids = _selection(only)
    reports = []
    with patcher.lock():
        for spec in select(ids):
            pending = is_deferred(spec)
            post_import.unregister(_hook_key(spec))
            _watched.pop(spec.id, None)
            removed = patcher.uninstall(spec.id)
            guard = import_guards.uninstall(spec.id)
            last = _last.pop(spec.id, None)
            # A later apply() is a new decision and may warn again.
            _warned.difference_update({key for key in _warned if key.startswith(f"{spec.id}:")})
            once_per_job.release(f"{spec.id}:")
            verdict = last.verdict if last else Verdict.NEEDED
            if removed is not None:
                where = ", ".join(f"{m}.{a}" for m, a in removed.sites)
                report = Report(
                    spec.id, verdict, Action.REVERTED, f"restored the original at {where}"
                )
            elif guard is not None:
                report = Report(
                    spec.id, verdict, Action.REVERTED, f"removed the guard on {guard.module_name}"
                )
            elif pending:
                report = Report(
                    spec.id, verdict, Action.REVERTED, "dropped the pending import hook"
                )
            else:
                report = Report(spec.id, verdict, Action.NOT_INSTALLED, "nothing to revert")
            reports.append(report)
    return _sourced(reports) + _withheld(ids, Action.NOT_INSTALLED)


# Open ``applied()`` blocks per backport id that this module installed for them: the last
# block to exit reverts, whichever thread it runs in.
_holders: dict[str, int] = {}


@contextmanager
def applied(
    only: str | Iterable[str] | None = None,
    *,
    strict: bool = False,
    upstream_only: bool | None = None,
) -> Iterator[list[Report]]:
    """``apply`` on entry; on exit revert what this block installed or deferred.

    Overlapping blocks (nested, or in several threads) share what the first installed: it
    is reverted when the last of them exits, never under another block.
    """
    with patcher.lock():
        reports = apply(only, strict=strict, upstream_only=upstream_only)
        held = []
        for report in reports:
            started = report.action in (Action.INSTALLED, Action.DEFERRED)
            if started or (report.action is Action.ALREADY_INSTALLED and _holders.get(report.id)):
                _holders[report.id] = _holders.get(report.id, 0) + 1
                held.append(report.id)
    try:
        yield reports
    finally:
        with patcher.lock():
            last = []
            for backport_id in held:
                _holders[backport_id] -= 1
                if _holders[backport_id] == 0:
                    del _holders[backport_id]
                    last.append(backport_id)
            if last:
                revert(last)


# ---- for the commands wing -------------------------------------------------------------------
# What the `backports` commands (backports/megatron/commands/) ask beyond apply / status /
# revert / applied, so that they import the api alone, never the catalog or the switches.
# Kept apart, and small: the api's rewrite re-points these few names.

from dataclasses import dataclass  # noqa: E402 (this section's own imports)

from packaging.version import InvalidVersion, Version  # noqa: E402

ENV_CACHE = verdict_cache.CACHE  # audit's child probes with the cache off


def selected_ids(only: str | Iterable[str] | None = None) -> list[str]:
    """The ids of the entries ``only`` names (None: all), as ``status`` would take them; an
    unknown id raises ``BackportError`` with the same line as ``status``."""
    return [spec.id for spec in select(_selection(only))]


def all_switched_off() -> bool:
    """Whether ``MEGATRON_BACKPORTS`` turns every backport off in this environment."""
    return not switches.enabled()


def skipped_by_environment() -> frozenset[str]:
    """The ids ``MEGATRON_BACKPORTS_SKIP`` turns off in this environment."""
    return switches.skipped_ids()


def target_modules(backport_id: str) -> tuple[str, ...]:
    """Every module a backport's targets may live in, in the catalog's order."""
    specs = select(backport_id)  # a withheld plugin's id: no entry, no module
    return tuple(
        dict.fromkeys(m for spec in specs for target in spec.targets for m in target.modules)
    )


def probe_anyway(backport_id: str) -> Report | None:
    """What the probe finds for a backport whatever the switches say (``check`` judges a
    disabled one too); None for an id with no entry (a withheld plugin)."""
    spec = next((s for s in entries() if s.id == backport_id), None)
    return None if spec is None else probe_ignoring_switches(spec)


@dataclass(frozen=True)
class TargetReleases:
    """Where a backport's target exists and where its fix is released, as ``check`` asks."""

    distribution: str
    target_since: Version  # the first release with the target(s)
    fixed_in: Version | None  # the first release with the fix; None while none has it

    def predate_the_target(self, version: str) -> bool:
        """Whether release ``version`` comes before the target existed (an unreadable
        version does not)."""
        from .versions import release_predates

        try:
            return release_predates(Version(version), self.target_since)
        except InvalidVersion:
            return False


def target_releases(backport_id: str) -> TargetReleases | None:
    """The releases a backport's entry names; None for an id with no entry."""
    spec = next((s for s in entries() if s.id == backport_id), None)
    if spec is None:
        return None
    return TargetReleases(spec.target.distribution, spec.target_since, spec.fixed_in)
