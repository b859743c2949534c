"""apply / status / revert / applied: the public api, each a few named steps.

Data flows one way: catalog -> decision -> install -> report. ``apply()`` decides every
selected backport (``decision.decide``), installs the needed ones together
(``job.settling``), watches those whose targets are not imported yet (``job.deferred``) and
says each skip once per job (``job.announce``). ``status()`` decides without installing;
``revert()`` undoes; ``applied()`` scopes an ``apply()`` to a block.
"""

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from packaging.version import InvalidVersion, Version

from . import switches
from .catalog import entries, origin, select, select_withheld, source, withheld
from .decision import Decision, decide, start_children_early, verdict_cache
from .errors import BackportError
from .evidence.one_look import one_look
from .evidence.versions import release_predates
from .job import deferred
from .job.announce import announce, forget
from .job.settling import UPSTREAM_ONLY_NOTE, mode_evidence, settle
from .kinds import kind_of
from .kinds.constructor import census
from .kinds.install import by_kind, installed, uninstall, uninstalling
from .model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, BackportSpec, mode_name
from .report import Action, Report, Verdict
from .session import SESSION

__all__ = [
    "UPSTREAM_ONLY",
    "WITH_LOCAL_CHANGES",
    "applied",
    "apply",
    "apply_in_job",
    "disabled_reason",
    "installed_mode",
    "is_deferred",
    "last_report",
    "load_targets",
    "probe_ignoring_switches",
    "revert",
    "status",
    "status_proving",
]

# The environment switches; switches.py reads them (spellings, warnings).
ENV_ENABLE = switches.ENABLE
ENV_SKIP = switches.SKIP
ENV_UPSTREAM_ONLY = switches.UPSTREAM_ONLY

_LOG = logging.getLogger(__name__)


def disabled_reason(spec: BackportSpec) -> str | None:
    """Why the environment turns ``spec`` off, or None."""
    return switches.disabled_reason(spec.id)


def _mode(upstream_only: bool | None) -> str:
    """The argument if given, else ``MEGATRON_BACKPORTS_UPSTREAM_ONLY``."""
    return mode_name(switches.upstream_only() if upstream_only is None else upstream_only)


def installed_mode(backport_id: str) -> str | None:
    """The mode of the installed replacement, or None when nothing is installed."""
    installation = installed(backport_id)
    return None if installation is None else str(installation.mode)


def last_report(backport_id: str) -> Report | None:
    """What ``apply()`` last decided for this backport in this process, if it ran."""
    report: Report | None = SESSION.last.get(backport_id)
    return report


def is_deferred(spec: BackportSpec) -> bool:
    """Whether an import hook waits to decide and install ``spec`` on the target's import."""
    return deferred.is_deferred(spec.id)


def _selection(only: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """``only`` read once (it may be a generator), as ids; None: every backport."""
    if only is None:
        return None
    return (only,) if isinstance(only, str) else tuple(only)


def _warn_unknown_skips() -> None:
    known = [spec.id for spec in entries()] + [w.id for w in withheld()]
    switches.warn_unknown_skips(known)


def _withheld(only: tuple[str, ...] | None, action: Action) -> list[Report]:
    """One report per plugin (or id) the catalog withheld: it never reaches the decision."""
    return [
        Report(w.id, w.verdict, action, w.reason, {"plugin": {"source": w.source}}, w.source)
        for w in select_withheld(only)
    ]


def _sourced(reports: list[Report]) -> list[Report]:
    """Each report saying where its entry comes from (builtin, or a plugin distribution)."""
    return [replace(report, source=source(report.id)) for report in reports]


# ---- apply ---------------------------------------------------------------------------------


def _already(spec: BackportSpec, mode: str) -> Report | None:
    """Disabled, or installed already in this mode (in the other mode it is uninstalled:
    the caller decides it anew, under the same lock); else None."""
    reason = disabled_reason(spec)
    if reason is not None:
        return Report(spec.id, Verdict.DISABLED, Action.SKIPPED, reason)
    current = installed_mode(spec.id)
    if current is None:
        return None
    if current != mode:
        uninstall(spec.id)
        return None
    last = SESSION.last.get(spec.id)
    why = last.reason if last else "installed earlier in this process"
    return Report(
        spec.id, Verdict.NEEDED, Action.ALREADY_INSTALLED, why, last.evidence if last else {}
    )


def _deferred_report(spec: BackportSpec, decision: Decision) -> Report:
    evidence = {**decision.evidence, **mode_evidence(spec, decision.mode)}
    return Report(spec.id, Verdict.NEEDED, Action.DEFERRED, decision.reason, evidence)


def _decide_each(
    specs: list[BackportSpec],
    early: list[Report | None],
    mode: str,
    child_sniffs: bool,
    on_demand: bool,
) -> dict[str, Decision]:
    """One decision per backport not already settled (``early``)."""
    return {
        spec.id: decide(
            spec,
            mode,
            importing=False,
            child_sniffs=child_sniffs,
            plugin=origin(spec.id),
            on_demand=on_demand,
        )
        for spec, report in zip(specs, early, strict=True)
        if report is None
    }


def _apply_all(
    specs: list[BackportSpec], strict: bool, mode: str, child_sniffs: bool, on_demand: bool
) -> list[Report]:
    """Decide each backport (one decision each), install the needed ones together, watch
    the installed and the deferred ones for their targets' import."""
    early = [_already(spec, mode) for spec in specs]
    with census(target for spec in specs for target in spec.targets):
        decisions = _decide_each(specs, early, mode, child_sniffs, on_demand)
    settled = iter(settle([d for d in decisions.values() if d.verdict is not None]))
    reports: list[Report] = []
    for spec, report in zip(specs, early, strict=True):
        decision = decisions.get(spec.id)
        if report is None and decision is not None:
            waits = decision.verdict is None
            report = _deferred_report(spec, decision) if waits else next(settled)
            if report.action in (Action.INSTALLED, Action.DEFERRED):
                # Watched for its import, and for a reload or re-import once installed.
                watched = deferred.Watch(
                    spec, strict, mode, origin(spec.id), child_sniffs, on_demand
                )
                deferred.watch(watched)
        assert report is not None
        reports.append(report)
    return reports


def apply(
    only: str | Iterable[str] | None = None,
    *,
    strict: bool = False,
    upstream_only: bool | None = None,
) -> list[Report]:
    """Decide each backport and install the ones that are needed (idempotent, thread-safe).

    ``upstream_only=True`` (default: ``MEGATRON_BACKPORTS_UPSTREAM_ONLY=1``) installs the
    vendored code alone, without this project's local changes; asking for the other mode
    than the installed one swaps the replacement. A backport whose sniff starts child
    interpreters is proven here where the proof store has no answer, once per node
    (``apply_in_job``: the start-up hook's ``apply`` in a job's processes), one marked
    ``sniff_on_demand`` (a process group of ranks) too.
    """
    return _apply(only, strict, upstream_only, child_sniffs=True, on_demand=True)


def apply_in_job(only: tuple[str, ...] | None = None, strict: bool = False) -> list[Report]:
    """``apply`` as the start-up hook runs it in every process of a job: the proof store
    answers a sniff that starts child interpreters; where it has no proof, one process of
    the node runs the sniff under a file lock in the store and the others read its proof
    (with the store off, ``MEGATRON_BACKPORTS_CACHE=0``, each process runs it). A sniff
    marked ``sniff_on_demand`` is never run here: its proof (``backports apply`` or ``check``
    keeps it) answers, else the entry is "not yet checked" and not installed."""
    return _apply(only, strict, None, child_sniffs=True, on_demand=False)


def _apply(
    only: str | Iterable[str] | None,
    strict: bool,
    upstream_only: bool | None,
    *,
    child_sniffs: bool,
    on_demand: bool,
) -> list[Report]:
    mode = _mode(upstream_only)
    ids = _selection(only)
    _warn_unknown_skips()
    with SESSION.lock, one_look():
        chosen = select(ids)
        if on_demand:  # the ranks of a sniff run on demand are forked from the zygote
            ranked = [s for s in chosen if s.sniff_on_demand and disabled_reason(s) is None]
            start_children_early(ranked, on_demand=True)
        reports = _apply_all(chosen, strict, mode, child_sniffs, on_demand)
        for report in reports:  # in catalog order, once every outcome is recorded
            announce(report, stacklevel=4)
    held_back = _withheld(ids, Action.SKIPPED)
    for report in held_back:
        announce(report, stacklevel=4)
    reports = _sourced(reports) + held_back
    if strict:
        bad = [r for r in reports if r.verdict is Verdict.INCOMPATIBLE]
        if bad:
            raise BackportError("; ".join(f"{r.id} is incompatible: {r.reason}" for r in bad))
    return reports


# ---- status --------------------------------------------------------------------------------


def _status_one(
    spec: BackportSpec, ignore_switches: bool = False, on_demand: bool = False
) -> Report:
    """What ``apply`` would do for ``spec``, decided with every target imported and every
    sniff run (a child's answer through the verdict cache), but one marked
    ``sniff_on_demand`` unless ``on_demand`` (its proof in the store answers, or "not yet
    checked")."""
    reason = None if ignore_switches else disabled_reason(spec)
    if reason is not None:
        return Report(spec.id, Verdict.DISABLED, Action.WOULD_SKIP, reason)
    current = installed_mode(spec.id)
    mode = _mode(None) if current is None else current
    decision = decide(
        spec, mode, importing=True, child_sniffs=True, plugin=origin(spec.id), on_demand=on_demand
    )
    assert decision.verdict is not None  # importing: every target is judged
    # Importing the targets may have fired a deferred install (apply ran before the import).
    current = installed_mode(spec.id)
    if ignore_switches:
        action = Action.WOULD_SKIP
    elif current is not None:
        action = Action.ALREADY_INSTALLED
    elif decision.verdict is Verdict.NEEDED:
        action = Action.WOULD_INSTALL
    else:
        action = Action.WOULD_SKIP
    evidence = {**decision.evidence, **mode_evidence(spec, mode)}
    reason = decision.reason + (UPSTREAM_ONLY_NOTE if mode == UPSTREAM_ONLY else "")
    return Report(spec.id, decision.verdict, action, reason, evidence)


def status(only: str | Iterable[str] | None = None) -> list[Report]:
    """Decide each backport and say what ``apply`` would do; changes nothing. A sniff
    marked ``sniff_on_demand`` is not run: its proof in the store answers, else the report
    says "not yet checked: run `backports check`"."""
    return _status(only, on_demand=False)


def status_proving(only: str | Iterable[str] | None = None) -> list[Report]:
    """``status``, running the sniffs marked ``sniff_on_demand`` too where the proof store
    has no answer (and keeping their proofs): what ``backports check`` judges."""
    return _status(only, on_demand=True)


def _status(only: str | Iterable[str] | None, on_demand: bool) -> list[Report]:
    ids = _selection(only)
    _warn_unknown_skips()
    chosen = select(ids)
    with one_look():
        judged = _with_rivals(chosen)
        enabled = [spec for spec in judged if disabled_reason(spec) is None]
        start_children_early(enabled, on_demand=on_demand)
        with census(target for spec in judged for target in spec.targets):
            reports = _shadowed([_status_one(spec, on_demand=on_demand) for spec in judged])
    # ``--only``: the rivals were probed for what a job does with the chosen, not shown.
    by_id = {report.id: report for report in reports}
    return _sourced([by_id[spec.id] for spec in chosen]) + _withheld(ids, Action.WOULD_SKIP)


def _static_targets(spec: BackportSpec) -> set[str]:
    """Every "module.attribute" a spec may patch, read from the catalog (nothing imported)."""
    return {f"{module}.{t.attribute}" for t in spec.targets for module in t.modules}


def _with_rivals(chosen: list[BackportSpec]) -> list[BackportSpec]:
    """``chosen`` and every other entry that may patch one of their targets, in catalog
    order: a job applies them all, and one earlier on a shared target installs first, so
    ``status --only`` (and ``check --only``) must judge the chosen beside them."""
    wanted = {spec.id for spec in chosen}
    every = list(entries())
    if wanted == {spec.id for spec in every}:
        return every
    targets = set().union(*(_static_targets(spec) for spec in chosen))
    kept = [s for s in every if s.id in wanted or _static_targets(s) & targets]
    listed = {spec.id for spec in kept}
    # An id ``entries`` lacks (none today) keeps the order it was given in, after the rest.
    return kept + [spec for spec in chosen if spec.id not in listed]


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
    """What the decision finds for ``spec`` whatever the environment's switches say
    (``check`` probes a disabled backport too); changes nothing."""
    with one_look():
        return _status_one(spec, ignore_switches=True, on_demand=True)


def load_targets(only: str | Iterable[str] | None = None) -> None:
    """Import every module the selected backports patch, so that ``apply()`` decides and
    installs now instead of deferring to their import (what ``backports apply`` and
    ``check`` show is then the truth for this environment). A target that cannot be found
    or imported is left for the decision to report."""
    for spec in select(_selection(only)):
        if disabled_reason(spec) is not None:
            continue
        for target in spec.targets:
            try:
                kind_of(target).resolve(target, spec.id)
            except Exception as exc:  # the decision says why, in the report
                _LOG.debug("%s: %s not loaded: %r", spec.id, target.attribute, exc)


# ---- revert and applied --------------------------------------------------------------------


def _revert_one(spec: BackportSpec) -> Report:
    pending = deferred.unwatch(spec.id)
    removed = uninstall(spec.id)
    with SESSION.lock:
        last = SESSION.last.pop(spec.id, None)
    forget(spec.id)  # a later apply() is a new decision and may warn again
    verdict = last.verdict if last else Verdict.NEEDED
    if removed is not None:
        done = "; ".join(kind.reverted(parts) for kind, parts in by_kind(removed.parts))
        return Report(spec.id, verdict, Action.REVERTED, done)
    if pending:
        return Report(spec.id, verdict, Action.REVERTED, "dropped the pending import hook")
    return Report(spec.id, verdict, Action.NOT_INSTALLED, "nothing to revert")


def revert(only: str | Iterable[str] | None = None) -> list[Report]:
    """Uninstall backports and drop their pending import hooks (idempotent)."""
    ids = _selection(only)
    with SESSION.lock:
        specs = select(ids)
        with uninstalling(spec.id for spec in specs):
            reports = [_revert_one(spec) for spec in specs]
    return _sourced(reports) + _withheld(ids, Action.NOT_INSTALLED)


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
    holders = SESSION.holders
    with SESSION.lock:
        reports = apply(only, strict=strict, upstream_only=upstream_only)
        held = []
        for report in reports:
            started = report.action in (Action.INSTALLED, Action.DEFERRED)
            if started or (report.action is Action.ALREADY_INSTALLED and holders.get(report.id)):
                holders[report.id] = holders.get(report.id, 0) + 1
                held.append(report.id)
    try:
        yield reports
    finally:
        with SESSION.lock:
            last = []
            for backport_id in held:
                holders[backport_id] -= 1
                if holders[backport_id] == 0:
                    del holders[backport_id]
                    last.append(backport_id)
            if last:
                revert(last)


# ---- for the commands wing -------------------------------------------------------------------
# What the `backports` commands (backports/megatron/commands/) ask beyond apply / status /
# revert / applied, so that they import the api alone, never the catalog or the switches.
# Kept apart, and small: the api's rewrite re-points these few names.

ENV_CACHE = verdict_cache.CACHE  # audit's child probes with the cache off


def upstream_only_requested() -> bool:
    """Whether ``MEGATRON_BACKPORTS_UPSTREAM_ONLY`` asks for upstream's code alone."""
    return switches.upstream_only()


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
