"""One decision path: for one backport in one mode, the verdict, its reason and evidence.

``decide()`` reads as the job itself, one named step per line: the evidence that needs no
import (provenance, integrity, versions: read once, the vendored folder hashed once), each
target located once through its kind, the shape checked, the verdict cache asked (and told),
the sniff run on the installed code and on the replacement, which is built once and kept on
the ``Decision`` for the install. Every caller goes through it: ``apply`` and the deferred
install at a target's import, ``status``, ``check``, ``audit``'s child, the commands.
"""

import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, cast

from ..evidence.fingerprints import offering_imports
from ..interpreter import children, zygote
from ..kinds import Kind, Resolved, TargetMissing, kind_of
from ..local_changes import wrap_all
from ..model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, BackportSpec, SniffResult
from ..report import Verdict
from ..vendored import vendored_module
from . import verdict_cache
from .early import Early, early_evidence
from .judging import (
    behaviour_reasons,
    git_evidence,
    one_line,
    renamed_reason,
    reordered_only,
    unproven_reason,
    vendored_behaviour,
)
from .sniffing import folder_name, run_sniffs, sniffs_in_this_thread, stand_ins, stub_of

__all__ = [
    "Decision",
    "Replacements",
    "cache_key",
    "decide",
    "sniff_vendored",
    "sniffs_in_this_thread",
    "start_children_early",
]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replacements:
    """What replaces each target, in catalog order: ``alone`` is the vendored objects as
    they are (what the sniff judges upstream-only), ``installed`` what the applier puts in
    place in the decision's mode (the first wrapped in the local changes, unless
    upstream-only)."""

    alone: tuple[object, ...]
    installed: tuple[object, ...]


@dataclass
class Decision:
    """One backport's verdict in one mode; ``verdict`` None while its targets wait for
    their import. ``targets`` are the resolved targets (once all were found), and
    ``replacements`` what the applier installs (a ``needed`` verdict's only): built by the
    sniff where it ran, else on first use (``status`` of a cached verdict never builds)."""

    spec: BackportSpec
    mode: str
    verdict: Verdict | None
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    targets: tuple[Resolved, ...] = ()
    built: Replacements | None = None
    # False: ``needed`` by the evidence that needs no sniff, the replacement not shown to
    # carry the fix here (a sniff in children a job's process does not start): never
    # installed on that alone.
    proven: bool = True

    @property
    def upstream_only(self) -> bool:
        return self.mode == UPSTREAM_ONLY

    @property
    def installable(self) -> bool:
        return (
            self.verdict is Verdict.NEEDED
            and self.proven
            and len(self.targets) == len(self.spec.targets)
        )

    def replacements(self) -> Replacements:
        """What replaces each target in this decision's mode, built once."""
        if self.built is None:
            self.built = _replacements(self.spec, self.mode, self.targets)
        return self.built


def decide(
    spec: BackportSpec,
    mode: str,
    *,
    importing: bool,
    child_sniffs: bool,
    plugin: tuple[str, str] | None = None,
    on_demand: bool = False,
) -> Decision:
    """The verdict on ``spec`` in ``mode`` (``UPSTREAM_ONLY`` or ``WITH_LOCAL_CHANGES``).

    ``importing``: import the targets' modules to judge them (else a target not imported
    yet leaves the verdict None: it is decided at its import). ``child_sniffs``: run a sniff
    that starts child interpreters (seconds) when the proof store has no answer (once per
    node: see ``_proved_once``); without (the manifest, which starts no child), such a
    backport is decided on the evidence that needs no sniff, and the reason says so.
    ``plugin``: (distribution, entry-point module) of a plugin's entry, for the cache's key.
    ``on_demand``: also run a sniff the entry marks ``sniff_on_demand`` (``check`` and
    ``apply()`` do; ``status`` and a job's processes only read its proof, else say "not yet
    checked").
    Never raises but for a KeyboardInterrupt: a failure is an ``incompatible`` verdict.
    """
    if spec.sniff_on_demand and not on_demand:
        child_sniffs = False  # the proof store's answer, or "not yet checked"
    if spec.copies:
        return _decide_copies(spec, mode, importing, child_sniffs, plugin)
    early = early_evidence(spec)
    if early.verdict is not None:
        return Decision(spec, mode, early.verdict, early.reason, early.evidence)
    try:
        return _judge_targets(spec, mode, early, importing, child_sniffs, plugin)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # A sniff (a plugin's, say) that calls sys.exit() must not end the job: only the
        # user's Ctrl-C goes through.
        reason = f"probe failed: {one_line(exc)}"
        return Decision(spec, mode, Verdict.INCOMPATIBLE, reason, early.evidence)


def _decide_copies(
    spec: BackportSpec,
    mode: str,
    importing: bool,
    child_sniffs: bool,
    plugin: tuple[str, str] | None,
) -> Decision:
    """An entry whose code ships in several distributions (``spec.copies``): each copy
    decided as an entry of its own (its version, its installed text, its sniff), then one
    decision that installs the copies that need it. As for an entry that is not coupled, a
    copy found imported brings in the others (their distributions installed) to be judged."""
    parts = spec.parts()
    decisions = [
        decide(part, mode, importing=importing, child_sniffs=child_sniffs, plugin=plugin)
        for part in parts
    ]
    if any(d.verdict is None for d in decisions) and any(d.targets for d in decisions):
        decisions = [
            decide(part, mode, importing=True, child_sniffs=child_sniffs, plugin=plugin)
            if d.verdict is None
            else d
            for part, d in zip(parts, decisions, strict=True)
        ]
    return _combined(spec, mode, decisions)


# Which copy's verdict is the entry's, first first. A copy unlike any version makes the
# entry incompatible (``strict`` refuses it, nothing is installed: the catalog's rule for a
# target it cannot judge); else one copy to install makes it ``needed``.
_COPY_ORDER = (Verdict.INCOMPATIBLE, Verdict.NEEDED, Verdict.UPSTREAM, Verdict.ABSENT)


def _named(distribution: str, reason: str) -> str:
    return reason if reason.startswith(f"{distribution} ") else f"[{distribution}] {reason}"


def _combined(spec: BackportSpec, mode: str, decisions: Sequence[Decision]) -> Decision:
    """One decision from the copies': the reason names each distribution's, the evidence
    keeps each (``copies``); a ``needed`` one is for the copies that need it only (its
    ``spec`` holds their targets), waiting (None) while a copy waits for its import."""
    copies = [
        {
            "distribution": d.spec.target.distribution,
            "verdict": None if d.verdict is None else str(d.verdict),
            "reason": d.reason,
            "evidence": d.evidence,
        }
        for d in decisions
    ]
    # Each reason names its distribution (its version first, as every reason does); one
    # that does not (a refusal) is prefixed with it.
    reason = "; ".join(_named(d.spec.target.distribution, d.reason) for d in decisions)
    waiting = [d for d in decisions if d.verdict is None]
    decided = sorted(
        (d for d in decisions if d.verdict is not None),
        key=lambda d: _COPY_ORDER.index(d.verdict) if d.verdict in _COPY_ORDER else 0,
    )
    if waiting or not decided:
        return Decision(spec, mode, None, reason, {"copies": copies})
    leading = decided[0]
    evidence = {**leading.evidence, "copies": copies}
    # The entry's own distribution (the first target's) stays the one reports name.
    if "distribution" in decisions[0].evidence:
        evidence["distribution"] = decisions[0].evidence["distribution"]
    evidence["targets"] = [shown for d in decisions for shown in d.evidence.get("targets", [])]
    if leading.verdict is not Verdict.NEEDED:
        return Decision(spec, mode, leading.verdict, reason, evidence, leading.targets)
    needed = [d for d in decided if d.verdict is Verdict.NEEDED]
    installed = replace(spec, targets=tuple(t for d in needed for t in d.spec.targets), copies=())
    targets = tuple(t for d in needed for t in d.targets)
    proven = all(d.proven for d in needed)
    return Decision(installed, mode, Verdict.NEEDED, reason, evidence, targets, proven=proven)


def _judge_targets(
    spec: BackportSpec,
    mode: str,
    early: Early,
    importing: bool,
    child_sniffs: bool,
    plugin: tuple[str, str] | None,
) -> Decision:
    evidence = early.evidence
    kinds = [kind_of(target) for target in spec.targets]
    located = _locate(spec, kinds, importing)
    unloaded: list[str] = []
    if located is None and _a_part_is_imported(spec, kinds):
        unloaded = _unloaded_modules(spec)
        located = _locate(spec, kinds, importing=True)
    if located is None:
        return Decision(spec, mode, None, _waiting_reason(spec, kinds, early.version), evidence)
    if isinstance(located, str):
        renamed = renamed_reason(spec, early.version)
        if renamed is not None:
            return Decision(spec, mode, Verdict.INCOMPATIBLE, renamed, evidence)
        return Decision(spec, mode, Verdict.ABSENT, located, evidence)
    targets = located
    _target_evidence(spec, kinds, targets, evidence)
    refusal = _refusal(spec, kinds, targets, evidence["upstream"]["reads"])
    if refusal is not None:
        return _refused(spec, mode, early, kinds, targets, refusal)
    in_child = spec.sniff_in_child or any(kind.sniff_in_child for kind in kinds)
    key = _cache_key(spec, kinds, targets, early, in_child, plugin) if _caching() else None
    decision = _from_cache(spec, mode, key, evidence, targets)
    if decision is None and in_child and not child_sniffs:
        decision = _unsniffed(spec, mode, early, targets)
    if decision is None and in_child and key is not None:
        decision = _proved_once(spec, mode, key, early, targets)
    if decision is None:
        decision = _sniffed(spec, mode, early, targets, in_child)
        _keep(spec, key, decision)
    return _with_brought_in(_with_existing(decision, kinds), unloaded)


def _proved_once(
    spec: BackportSpec,
    mode: str,
    key: dict[str, object],
    early: Early,
    targets: tuple[Resolved, ...],
) -> Decision:
    """A sniff in child interpreters (seconds) where the proof store has no proof: proved by
    one process of the node while the others wait for it (``verdict_cache.proving``), then
    read from the store by each of them."""
    with verdict_cache.proving(spec):
        decision = _from_cache(spec, mode, key, early.evidence, targets)
        if decision is None:
            decision = _sniffed(spec, mode, early, targets, True)
            _keep(spec, key, decision)
    return decision


def start_children_early(specs: Sequence[BackportSpec], on_demand: bool = False) -> None:
    """Start the zygote (``interpreter.zygote``: torch imported once for every sniff child)
    now, beside the in-process work, when one of ``specs`` sniffs in children and the proof
    store holds no verdict on it: its seconds of imports overlap this process's own.
    ``on_demand``: the sniffs marked ``sniff_on_demand`` run too (``check``, ``apply()``):
    their ranks are forked from it."""
    for spec in specs:
        in_child = spec.sniff_in_child or any(kind_of(t).sniff_in_child for t in spec.targets)
        runs = on_demand or not spec.sniff_on_demand  # else only its proof is read
        if in_child and runs and not verdict_cache.stored_for(spec):
            try:
                zygote.start(children.child_path())
            except OSError as exc:  # an optimisation only: a sniff starts its own child
                _LOG.debug("the zygote did not start: %r", exc)
            return


def cache_key(
    spec: BackportSpec, plugin: tuple[str, str] | None = None
) -> dict[str, object] | None:
    """The verdict cache's key for ``spec`` as its targets stand in this process (importing
    nothing), or None where it cannot be keyed (a target not loaded, not the module's own,
    or not a file of its distribution). What ``decide`` looks up and stores under."""
    early = early_evidence(spec)
    kinds = [kind_of(target) for target in spec.targets]
    located = _locate(spec, kinds, importing=False)
    if not isinstance(located, tuple):
        return None
    in_child = spec.sniff_in_child or any(kind.sniff_in_child for kind in kinds)
    return _cache_key(spec, kinds, located, early, in_child, plugin)


# What a sniff's child imports besides the targets' own packages: a folder of the path that
# offers none of these (a job's script folder, say) cannot change its answer.
_CHILD_IMPORTS = ("backports", "torch", "triton", "numpy")


def _child_path_key(spec: BackportSpec) -> list[str]:
    """The folders of the children's path that offer what they import, for the cache key:
    ``backports apply`` and a job started from a folder of its own scripts share a proof."""
    tops = {module.partition(".")[0] for target in spec.targets for module in target.modules}
    offering = offering_imports(children.child_path(), tops.union(_CHILD_IMPORTS))
    # Resolved: a venv reached through a link to its folder offers the same files.
    return list(dict.fromkeys(os.path.realpath(folder) for folder in offering))


def _locate(
    spec: BackportSpec, kinds: Sequence[Kind], importing: bool
) -> tuple[Resolved, ...] | str | None:
    """Every target resolved, in catalog order (a tuple); why one is absent (a str); or
    None while one waits for its module's import (``importing`` False)."""
    resolved = []
    for target, kind in zip(spec.targets, kinds, strict=True):
        if not importing or kind.before_import:
            found = kind.find(target, spec.id)
            if found is None:
                return None
            resolved.append(found)
            continue
        try:
            resolved.append(kind.resolve(target, spec.id))
        except TargetMissing as exc:
            return _absent_reason(spec, target.attribute, str(exc))
    return tuple(resolved)


def _mid_import(module_name: str) -> bool:
    """In ``sys.modules`` but still executing (its own hook has not run yet)."""
    spec = getattr(sys.modules.get(module_name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _a_part_is_imported(spec: BackportSpec, kinds: Sequence[Kind]) -> bool:
    """Whether a target of an entry that is not ``coupled`` stands in a module the process
    has imported: its other targets' modules are then imported to judge it now (a job that
    imports LLaVA and never MiMo still gets #6010 where it runs). Not while one of those is
    being imported (its own hook judges the entry once it has executed)."""
    if spec.coupled:
        return False
    found = [
        (target, not kind.before_import and kind.find(target, spec.id) is not None)
        for target, kind in zip(spec.targets, kinds, strict=True)
    ]
    if any(_mid_import(name) for target, ok in found if not ok for name in target.modules):
        return False
    return any(ok for _, ok in found)


def _waiting_reason(spec: BackportSpec, kinds: Sequence[Kind], version: str) -> str:
    """Why the verdict waits, naming the modules not imported yet (a coupled entry's: the
    one it waits for)."""
    waiting = [
        target.modules[-1]
        for target, kind in zip(spec.targets, kinds, strict=True)
        if kind.before_import or kind.find(target, spec.id) is None
    ]
    modules = list(dict.fromkeys(waiting)) or [spec.target.modules[-1]]
    if spec.coupled and len({t.modules for t in spec.targets}) > 1:
        return (
            f"{version}: its targets are coupled (installed all or none): it waits for "
            f"{modules[0]}, not imported yet; the behaviour probe runs, and the backport "
            "installs if needed, once every one of its modules is imported"
        )
    return (
        f"{version} is not imported yet: the behaviour probe runs, and the backport "
        f"installs if needed, when {' or '.join(modules)} is imported"
    )


def _unloaded_modules(spec: BackportSpec) -> list[str]:
    return list(dict.fromkeys(m for t in spec.targets for m in t.modules if m not in sys.modules))


def _with_brought_in(decision: Decision, unloaded: Sequence[str]) -> Decision:
    """A decision that imported the modules of the entry's other targets says which (the
    job had imported only part of it): they are installed together."""
    brought = [module for module in unloaded if module in sys.modules]
    if brought:
        decision.evidence["imported_to_judge"] = brought
        decision.reason += (
            f" [judged once part of it was imported: {', '.join(brought)} imported for its "
            "other targets, so every part is in]"
        )
    return decision


def _absent_reason(spec: BackportSpec, attribute: str, why: str) -> str:
    """Which target is missing; where the entry has others, that only this part is."""
    if len(spec.targets) == 1:
        return f"no {attribute}: {why}"
    others = " and ".join(t.attribute for t in spec.targets if t.attribute != attribute)
    return f"no {attribute} (the part of the fix beside {others}): {why}"


def _target_evidence(
    spec: BackportSpec, kinds: Sequence[Kind], targets: Sequence[Resolved], evidence: dict[str, Any]
) -> None:
    shown = [
        kind.evidence(target, resolved)
        for target, kind, resolved in zip(spec.targets, kinds, targets, strict=True)
    ]
    evidence["target"] = shown[0]
    evidence["targets"] = shown


def _refusal(
    spec: BackportSpec, kinds: Sequence[Kind], targets: Sequence[Resolved], reads: list[str]
) -> str | None:
    """Why some target must not be patched, or None. ``reads`` concern the first target
    (the vendored module reads its globals from the first target's module)."""
    for index, (target, kind, resolved) in enumerate(
        zip(spec.targets, kinds, targets, strict=True)
    ):
        problem = kind.refusal(target, resolved, reads if index == 0 else [])
        if problem is not None:
            return problem
    return None


def _refused(
    spec: BackportSpec,
    mode: str,
    early: Early,
    kinds: Sequence[Kind],
    targets: tuple[Resolved, ...],
    refusal: str,
) -> Decision:
    """A target the vendored code must not replace as it stands (``incompatible``). Where
    upstream only reordered a target's parameters (``reordered_only``), the behaviour is
    judged all the same: a release that has the fix reads ``upstream`` (nothing is
    installed then), one without it keeps the refusal. A sniff that starts children is not
    run for that."""
    evidence = early.evidence
    in_child = spec.sniff_in_child or any(kind.sniff_in_child for kind in kinds)
    reads = evidence["upstream"]["reads"]
    if in_child or not reordered_only(spec, kinds, targets, reads):
        return Decision(spec, mode, Verdict.INCOMPATIBLE, refusal, evidence, targets)
    stock = [
        kind_of(target).stock(target, resolved)
        for target, resolved in zip(spec.targets, targets, strict=True)
    ]
    (outcome,) = run_sniffs(spec, [stock], in_child=False)
    if not isinstance(outcome, SniffResult) or not outcome.fixed:
        return Decision(spec, mode, Verdict.INCOMPATIBLE, refusal, evidence, targets)
    evidence["git"] = git_evidence(spec, evidence)
    verdict, landed = behaviour_reasons(spec, outcome, evidence, early.version, targets)
    evidence["signature_drift"] = refusal
    reason = f"{landed} (judged by behaviour: upstream reordered parameters since: {refusal})"
    return Decision(spec, mode, verdict, reason, evidence, targets)


def _caching() -> bool:
    return verdict_cache.enabled()


def _cache_key(
    spec: BackportSpec,
    kinds: Sequence[Kind],
    targets: Sequence[Resolved],
    early: Early,
    in_child: bool,
    plugin: tuple[str, str] | None,
) -> dict[str, object] | None:
    if early.hashes is None:
        return None
    try:
        fingerprints = [
            kind.fingerprint(target, resolved)
            for target, kind, resolved in zip(spec.targets, kinds, targets, strict=True)
        ]
        return verdict_cache.key(
            spec,
            early.hashes.every_file(),
            fingerprints,
            child_path=_child_path_key(spec) if in_child else None,
            plugin=plugin,
        )
    except Exception as exc:  # an optimisation only: never a reason to fail or to skip
        _LOG.debug("verdict cache not used for %s: %r", spec.id, exc)
        return None


def _from_cache(
    spec: BackportSpec,
    mode: str,
    key: dict[str, object] | None,
    evidence: dict[str, Any],
    targets: tuple[Resolved, ...],
) -> Decision | None:
    """The verdict a process of this environment proved for the very same key, with what
    describes this process (the targets as found here) read afresh."""
    if key is None:
        return None
    hit = verdict_cache.load(spec, key, upstream_only=mode == UPSTREAM_ONLY)
    if hit is None:
        return None
    stored, path = hit
    kept = {**stored["evidence"], "target": evidence["target"], "targets": evidence["targets"]}
    kept["cache"] = {"hit": True, "file": str(path)}
    return Decision(spec, mode, Verdict(stored["verdict"]), stored["reason"], kept, targets)


def _keep(spec: BackportSpec, key: dict[str, object] | None, decision: Decision) -> None:
    """Store a verdict the sniff decided, for the next process with the same key."""
    if key is None or decision.verdict is None:
        return
    kept = verdict_cache.store(spec, key, str(decision.verdict), decision.reason, decision.evidence)
    decision.evidence["cache"] = {"hit": False, "file": None if kept is None else str(kept)}


def _replacements(
    spec: BackportSpec, mode: str, targets: Sequence[Resolved], module: ModuleType | None = None
) -> Replacements:
    """What replaces each target, built once from the vendored module (or ``module``: a
    candidate a sync is about to write): it reads its globals from the first target's
    module; the local changes wrap the first target's replacement."""
    if module is None:
        module = vendored_module(spec.vendored)
    module.__target_module__ = targets[0].module_name  # type: ignore[attr-defined]
    alone = tuple(kind_of(target).replacement(target, module) for target in spec.targets)
    installed = list(alone)
    if mode == WITH_LOCAL_CHANGES and spec.local_changes:
        # Local changes wrap a function target's replacement (the catalog's rule).
        installed[0] = wrap_all(cast(Callable[..., object], alone[0]), spec.local_changes)

    return Replacements(alone, tuple(installed))


def _unsniffed(
    spec: BackportSpec, mode: str, early: Early, targets: tuple[Resolved, ...]
) -> Decision:
    """A backport whose sniff starts child interpreters, asked of a caller that starts none
    (the manifest) where the proof store has no answer: needed by the evidence that needs no
    sniff (no release says it landed), but nothing shows its replacement carries the fix
    here, so it is not installed. A job's process proves it itself (``_proved_once``)."""
    evidence = early.evidence
    evidence["behaviour"] = {"sniffed": False}
    reason = (
        f"{early.version}: not proven in this environment yet (its sniff starts child "
        "interpreters, which this caller does not): `backports apply` or `backports "
        "status` prove it and keep the proof for every process"
    )
    if spec.sniff_on_demand:
        evidence["behaviour"]["on_demand"] = True
        reason = (
            f"{early.version} lacks the fix: by its version alone (no release carries it); "
            "not yet checked: run `backports check` (its sniff starts child processes, "
            "which only `backports check` and `backports apply` run; they keep the proof "
            "for status and jobs)"
        )
    return Decision(spec, mode, Verdict.NEEDED, reason, evidence, targets, proven=False)


def _sniffed(
    spec: BackportSpec,
    mode: str,
    early: Early,
    targets: tuple[Resolved, ...],
    in_child: bool,
) -> Decision:
    """The sniff on the installed code, then (where it lacks the fix) on the replacement."""
    evidence = early.evidence
    evidence["git"] = git_evidence(spec, evidence)
    stock = [
        kind_of(target).stock(target, resolved)
        for target, resolved in zip(spec.targets, targets, strict=True)
    ]
    built: Replacements | Exception | None = None
    if in_child:
        # Each child spends seconds importing torch and megatron: the vendored code's
        # children start beside the installed code's (also when the latter has the fix).
        built = _built_or_error(spec, mode, targets)
        sets = [stock]
        if not isinstance(built, Exception) and stub_of(built.alone) is None:
            sets.append(_alone(spec, targets, built))
        outcomes = run_sniffs(spec, sets, in_child=True)
    else:
        outcomes = run_sniffs(spec, [stock], in_child=False)
    first = outcomes[0]
    if isinstance(first, NotImplementedError):  # a scaffold's skeleton: not a probe failure
        evidence["unfinished"] = True
        reason = f"the entry is unfinished: its sniff raised NotImplementedError: {first}"
        return Decision(spec, mode, Verdict.INCOMPATIBLE, reason, evidence, targets)
    if isinstance(first, BaseException):
        raise first
    verdict, reason = behaviour_reasons(spec, first, evidence, early.version, targets)
    if verdict is not Verdict.NEEDED:  # landed, or drifted (fixed by a sniff alone)
        return Decision(spec, mode, verdict, reason, evidence, targets)
    if built is None:
        built = _built_or_error(spec, mode, targets)
    if isinstance(built, Exception):
        error = one_line(built)
        evidence["vendored_behaviour"] = {"import_error": error}
        reason = f"{folder_name(spec)} cannot be imported: {error}"
        return Decision(spec, mode, Verdict.INCOMPATIBLE, reason, evidence, targets)
    if len(outcomes) > 1:
        alone = _as_result(outcomes[1])
    else:
        alone = _sniff_replacement(spec, targets, built, False, in_child)
    composed = None if mode == UPSTREAM_ONLY else alone
    if composed is not None and spec.local_changes:
        composed = _sniff_replacement(spec, targets, built, True, in_child)
    evidence["vendored_behaviour"] = vendored_behaviour(alone, composed)
    if alone.detail.get("unfinished"):
        evidence["unfinished"] = True
    unproven = unproven_reason(folder_name(spec), alone, composed)
    if unproven is not None:
        return Decision(spec, mode, Verdict.INCOMPATIBLE, unproven, evidence, targets)
    return Decision(spec, mode, Verdict.NEEDED, reason, evidence, targets, built)


def _built_or_error(
    spec: BackportSpec, mode: str, targets: Sequence[Resolved]
) -> Replacements | Exception:
    try:
        return _replacements(spec, mode, targets)
    except Exception as exc:  # the vendored module cannot be imported, or lacks a name
        return exc


def _alone(spec: BackportSpec, targets: Sequence[Resolved], built: Replacements) -> list[Resolved]:
    return stand_ins(spec, targets, built.alone, composed=False)


def _as_result(outcome: SniffResult | BaseException) -> SniffResult:
    """A sniff's outcome on the replacement: what it raised is "not shown fixed"."""
    if isinstance(outcome, SniffResult):
        return outcome
    first_line = (str(outcome).splitlines() or [""])[0]
    raised = f"{type(outcome).__name__}: {first_line}" if first_line else type(outcome).__name__
    detail = {"raised": raised, "unfinished": isinstance(outcome, NotImplementedError)}
    return SniffResult(False, f"the sniff raised {raised}", detail)


def _sniff_replacement(
    spec: BackportSpec,
    targets: Sequence[Resolved],
    built: Replacements,
    composed: bool,
    in_child: bool = False,
) -> SniffResult:
    """The entry's sniff on what the applier would install: the vendored objects alone, or
    the first composed with the local changes. A stub (``backports new`` leaves the
    replacement raising NotImplementedError) is known without running it."""
    stub = stub_of(built.alone)
    if stub is not None:
        summary = f"{stub} is a stub: its body only raises NotImplementedError"
        return SniffResult(False, summary, {"stub": stub, "unfinished": True})
    try:
        shown = stand_ins(spec, targets, built.alone, composed)
    except Exception as exc:
        return _as_result(exc)
    (outcome,) = run_sniffs(spec, [shown], in_child=in_child)
    return _as_result(outcome)


def _with_existing(decision: Decision, kinds: Sequence[Kind]) -> Decision:
    """A ``needed`` decision notes the objects built before the install that a constructor
    fix cannot reach (``Kind.existing``)."""
    if decision.verdict is not Verdict.NEEDED:
        return decision
    counts = {}
    for target, kind, resolved in zip(decision.spec.targets, kinds, decision.targets, strict=True):
        count = kind.existing(resolved)
        if count:
            counts[f"{resolved.module_name}.{target.owner_name or target.attribute}"] = count
    if counts:
        decision.evidence["existing_instances"] = counts
        listed = ", ".join(f"{n} {name.rpartition('.')[2]}" for name, n in counts.items())
        decision.reason += (
            f" [{listed} built before the install: the constructor fix cannot reach them; "
            "build them after apply()]"
        )
    return decision


def sniff_vendored(
    spec: BackportSpec,
    module: ModuleType,
    *,
    upstream_only: bool,
    targets: Sequence[Resolved] | None = None,
) -> SniffResult:
    """The entry's sniff on what the applier would install from ``module`` (the vendored
    module, or a candidate), on ``targets`` as resolved (default: resolved here, importing
    their modules): upstream-only, or the first composed with the local changes. Never
    raises: what fails is "not shown fixed", named in the summary."""
    try:
        if targets is None:
            targets = [kind_of(target).resolve(target, spec.id) for target in spec.targets]
        mode = UPSTREAM_ONLY if upstream_only else WITH_LOCAL_CHANGES
        built = _replacements(spec, mode, targets, module)
    except Exception as exc:
        return _as_result(exc)
    in_child = spec.sniff_in_child or any(kind_of(t).sniff_in_child for t in spec.targets)
    return _sniff_replacement(spec, targets, built, not upstream_only, in_child)
