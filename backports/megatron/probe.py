"""Evidence -> verdict, with reasons. Behaviour decides; version and git cross-check."""

import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from . import import_guards, switches
from .git_ancestry import commit_ancestry
from .model import BackportSpec, SniffResult, Target
from .report import Verdict
from .targets import ResolvedTarget, TargetMissing, resolve_target
from .vendored import (
    Integrity,
    check_integrity,
    drift_reason,
    read_upstream,
    vendored_module,
)
from .vendored_sniff import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, folder_name, sniff_replacement
from .versions import describe, installed_version, release_predates

__all__ = ["ProbeResult", "guard_target_evidence", "probe", "probe_without_import"]


@dataclass
class ProbeResult:
    verdict: Verdict
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    # Every resolved target in catalog order, once all were found (else empty).
    targets: tuple[ResolvedTarget, ...] = ()
    # False only from probe_without_import: nothing decided yet, the target must be probed.
    final: bool = True

    @property
    def target(self) -> ResolvedTarget | None:
        """The first target (single-target code)."""
        return self.targets[0] if self.targets else None


def _version_claim(spec: BackportSpec, evidence: dict[str, Any]) -> bool | None:
    """What the version alone says: fixed (True), not fixed (False), or no release knows."""
    version = evidence["distribution"]["version"]
    if version is None or spec.fixed_in is None:
        return None
    installed = Version(version)
    same_release = Version(installed.base_version) == Version(spec.fixed_in.base_version)
    if installed.is_prerelease and same_release:
        return None  # a pre-release of the fixing release may or may not carry the fix
    return installed >= spec.fixed_in


def _provenance_evidence(upstream: Mapping[str, Any], integrity: Integrity) -> dict[str, Any]:
    """What ``UPSTREAM.toml`` says of the fix and whether the vendored files match it."""
    provenance = {
        key: upstream.get(key) for key in ("repo", "pr", "head_sha", "merge_sha", "origin")
    }
    # Module globals the vendored code reads at call time, as backports sync found.
    provenance["reads"] = [str(name) for name in upstream.get("reads", [])]
    vendored = {
        "file": integrity.file,
        "sha256": integrity.actual,
        "expected_sha256": integrity.expected,
        "folder": integrity.folder,
        "files_sha256": integrity.files_actual,
        "expected_files_sha256": integrity.files_expected or None,
        "ok": integrity.ok,
    }
    return {"upstream": provenance, "vendored": vendored}


def probe_without_import(spec: BackportSpec) -> ProbeResult:
    """The verdicts that need no import of megatron: absent, or a drifted vendored file.

    Anything else comes back with ``final=False``: only the target itself can decide.
    """
    evidence: dict[str, Any] = {}
    try:
        upstream = read_upstream(spec.vendored)
        integrity = check_integrity(spec.vendored, upstream)
    except Exception as exc:
        return ProbeResult(Verdict.INCOMPATIBLE, f"vendored code refused: {exc}", evidence)
    evidence.update(_provenance_evidence(upstream, integrity))
    installed = installed_version(spec.target.distribution, spec.target.modules)
    evidence["distribution"] = {"name": spec.target.distribution, **installed.to_dict()}
    others = _other_distributions(spec)
    if others:
        evidence["distributions"] = others
    drift = drift_reason(integrity, spec.id, upstream["origin"])
    if drift is not None:
        return ProbeResult(Verdict.INCOMPATIBLE, drift, evidence)
    if installed.version is None:
        return ProbeResult(Verdict.ABSENT, f"{spec.target.distribution} is not installed", evidence)
    missing = [name for name, info in others.items() if info["version"] is None]
    if missing:
        return ProbeResult(Verdict.ABSENT, f"{', '.join(missing)} is not installed", evidence)
    if release_predates(installed.version, spec.target_since):
        return ProbeResult(
            Verdict.ABSENT,
            f"{describe(spec.target.distribution, evidence['distribution'])} predates "
            f"{spec.target_since}, the first release with "
            f"{' and '.join(target.attribute for target in spec.targets)}",
            evidence,
        )
    return ProbeResult(Verdict.NEEDED, "target not probed yet", evidence, final=False)


def _other_distributions(spec: BackportSpec) -> dict[str, dict[str, str | None]]:
    """Version evidence of each distribution a later target lives in, beside the first's.
    ``target_since`` dates the first target's distribution; the others must be installed."""
    first = spec.target.distribution
    others: dict[str, dict[str, str | None]] = {}
    for target in spec.targets[1:]:
        if target.distribution != first and target.distribution not in others:
            info = installed_version(target.distribution, target.modules)
            others[target.distribution] = info.to_dict()
    return others


def _check_shape(target: Target, resolved: ResolvedTarget, reads: list[str]) -> str | None:
    """Why the target is not what the vendored code was written against, or None.

    ``reads`` are the globals a synced vendored function looks up on the live module: a
    helper that only the pull request added would fail at call time, so it fails here.
    The signature is the undecorated body's: a compiled wrapper takes ``*args``.
    """
    actual = tuple(inspect.signature(resolved.body).parameters)
    if actual != target.parameters:
        return (
            f"{resolved.module_name}.{target.attribute} signature is ({', '.join(actual)}), "
            f"expected ({', '.join(target.parameters)})"
        )
    needed = dict.fromkeys([*target.helpers, *reads])
    missing = [name for name in needed if name not in vars(resolved.module)]
    if missing:
        return f"{resolved.module_name} lacks {', '.join(missing)}"
    return None


def _cross_checks(spec: BackportSpec, fixed: bool, evidence: dict[str, Any]) -> list[str]:
    notes = []
    claim = _version_claim(spec, evidence)
    if claim is not None and claim != fixed:
        says = "has" if claim else "lacks"
        notes.append(f"version {evidence['distribution']['version']} {says} the fix by number")
    contains = evidence.get("git", {}).get("contains", {})
    if any(contains.values()) != fixed and any(v is not None for v in contains.values()):
        says = "contains" if any(contains.values()) else "does not contain"
        notes.append(f"the git checkout {says} {spec.id}'s commits")
    return notes


def probe(spec: BackportSpec, upstream_only: bool | None = None) -> ProbeResult:
    """Full probe: imports the target module and runs the behaviour sniff, on the installed
    function and, where it lacks the fix, on the vendored replacement. Never raises.

    ``upstream_only``: the mode the replacement would be installed in (default:
    ``MEGATRON_BACKPORTS_UPSTREAM_ONLY``); the vendored code is sniffed in that mode and
    alone.
    """
    early = probe_without_import(spec)
    if early.final:
        return early
    evidence = early.evidence
    if upstream_only is None:
        upstream_only = switches.upstream_only()
    try:
        if spec.guard is not None:
            return _probe_guard(spec, evidence, upstream_only)
        return _probe_target(spec, evidence, upstream_only)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # A sniff (a plugin's, say) that calls sys.exit() must not end the job: only the
        # user's Ctrl-C goes through.
        what = " ".join(f"{type(exc).__name__}: {exc}".split())
        return ProbeResult(Verdict.INCOMPATIBLE, f"probe failed: {what}", evidence)


def _resolve_all(spec: BackportSpec) -> tuple[ResolvedTarget, ...] | str:
    """Every target resolved, in catalog order, or why one is absent."""
    resolved = []
    for target in spec.targets:
        try:
            resolved.append(resolve_target(target, spec.id))
        except TargetMissing as exc:
            return f"no {target.attribute}: {exc}"
    return tuple(resolved)


def _target_evidence(target: Target, resolved: ResolvedTarget) -> dict[str, Any]:
    return {
        "module": resolved.module_name,
        "imported_as": resolved.imported_as,
        "attribute": target.attribute,
        "installed": resolved.installed is not None,
        "decorated": resolved.decorated,
    }


def _refusal(
    spec: BackportSpec, targets: tuple[ResolvedTarget, ...], reads: list[str]
) -> str | None:
    """Why some target must not be patched (another patch in place, or not the shape the
    vendored code was written against), or None. ``reads`` concern the first target."""
    for index, (target, resolved) in enumerate(zip(spec.targets, targets, strict=True)):
        if resolved.foreign is not None:
            # Patching over it would silently drop that patch (and the sniff would run it).
            return f"{resolved.module_name}.{target.attribute} is {resolved.foreign}"
        problem = _check_shape(target, resolved, reads if index == 0 else [])
        if problem is not None:
            return problem
    return None


def _probe_target(spec: BackportSpec, evidence: dict[str, Any], upstream_only: bool) -> ProbeResult:
    targets = _resolve_all(spec)
    if isinstance(targets, str):
        return ProbeResult(Verdict.ABSENT, targets, evidence)
    shown = [_target_evidence(t, r) for t, r in zip(spec.targets, targets, strict=True)]
    evidence["target"] = shown[0]
    evidence["targets"] = shown
    refusal = _refusal(spec, targets, evidence["upstream"]["reads"])
    if refusal is not None:
        return ProbeResult(Verdict.INCOMPATIBLE, refusal, evidence, targets)
    evidence["git"] = _git_evidence(spec, evidence)
    try:
        sniff = spec.sniff(targets)  # never writes the live modules or classes
    except NotImplementedError as exc:  # a scaffold's skeleton: not a probe failure
        evidence["unfinished"] = True
        reason = f"the entry is unfinished: its sniff raised NotImplementedError: {exc}"
        return ProbeResult(Verdict.INCOMPATIBLE, reason, evidence, targets)
    landed, lacks = _behaviour_reasons(spec, sniff, evidence)
    if landed is not None:
        return ProbeResult(Verdict.UPSTREAM, landed, evidence, targets)
    unproven = _vendored_unproven(spec, targets, upstream_only, evidence)
    if unproven is not None:
        return ProbeResult(Verdict.INCOMPATIBLE, unproven, evidence, targets)
    return ProbeResult(Verdict.NEEDED, lacks, evidence, targets)


def _behaviour_reasons(
    spec: BackportSpec, sniff: SniffResult, evidence: dict[str, Any]
) -> tuple[str | None, str]:
    """Record what the sniff on the installed code showed, cross-checked with version and
    git; the reason it has landed (None while it has not), and the reason it is needed."""
    evidence["behaviour"] = {"fixed": sniff.fixed, **sniff.detail}
    notes = _cross_checks(spec, sniff.fixed, evidence)
    suffix = f" (disagrees: {'; '.join(notes)})" if notes else ""
    version = describe(spec.target.distribution, evidence["distribution"])
    if sniff.fixed:
        return (
            f"{version} already has the fix: {sniff.summary}{suffix}. {spec.delete_when_landed}",
            "",
        )
    return None, f"{version} lacks the fix: {sniff.summary}{suffix}"


def _git_evidence(spec: BackportSpec, evidence: dict[str, Any]) -> dict[str, Any]:
    upstream = evidence["upstream"]
    package_dir = evidence["distribution"]["package_dir"]
    return commit_ancestry(
        None if package_dir is None else Path(package_dir),
        {
            role: sha
            for role, sha in (("merge", upstream["merge_sha"]), ("head", upstream["head_sha"]))
            if sha  # an open pull request has no merge commit; a handwritten one may lack a head
        },
        distribution=spec.target.distribution,
        package=evidence["distribution"]["package"],
    )


def guard_target_evidence(spec: BackportSpec) -> dict[str, Any]:
    """An import guard's ``evidence["target"]`` as this process stands (a cached verdict's
    evidence gets it afresh: whether the guard is installed here, the module executed)."""
    guard = spec.guard
    assert guard is not None
    module_name = guard.modules[0]
    return {
        "module": module_name,
        "attribute": guard.attribute,
        "kind": "import-guard",
        "installed": import_guards.installed(spec.id) is not None,
        "executed": module_name in sys.modules,
    }


def _probe_guard(spec: BackportSpec, evidence: dict[str, Any], upstream_only: bool) -> ProbeResult:
    """An import guard: its module is judged under the guard in force in megatron as it
    stands (none), and under the vendored guard, each in a child process (the module is
    never executed here, where it must wait for the guard). The two run at once: each
    child spends seconds importing torch and megatron. No local changes: the vendored
    guard alone is what either mode installs."""
    guard = spec.guard
    assert guard is not None
    module_name = guard.modules[0]
    evidence["target"] = guard_target_evidence(spec)
    evidence["targets"] = [evidence["target"]]
    evidence["git"] = _git_evidence(spec, evidence)
    stock: list[Any] = [import_guards.GuardTarget(module_name, import_guards.no_guard)]
    # Imported here: this module loads in every process the start-up hook reaches.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="backports-sniff") as pool:
        vendored = pool.submit(_sniff_vendored_guard, spec)
        sniff = spec.sniff(stock)  # a GuardTarget stands where a ResolvedTarget would
        alone = vendored.result()  # also when the stock code has the fix: never left running
    landed, lacks = _behaviour_reasons(spec, sniff, evidence)
    if landed is not None:
        return ProbeResult(Verdict.UPSTREAM, landed, evidence)
    shown = _shown(alone)
    evidence["vendored_behaviour"] = {UPSTREAM_ONLY: shown}
    if not upstream_only and not spec.local_changes:
        evidence["vendored_behaviour"][WITH_LOCAL_CHANGES] = shown  # the same guard
    if not alone.fixed:
        reason = f"{folder_name(spec)} lacks the fix: {alone.summary}"
        return ProbeResult(Verdict.INCOMPATIBLE, reason, evidence)
    return ProbeResult(Verdict.NEEDED, lacks, evidence)


def _sniff_vendored_guard(spec: BackportSpec) -> SniffResult:
    """The sniff on the module imported under the vendored guard; never raises."""
    try:
        return sniff_replacement(spec, vendored_module(spec.vendored), upstream_only=True)
    except Exception as exc:  # the vendored module cannot be imported
        first_line = (str(exc).splitlines() or [""])[0]
        return SniffResult(
            False, f"{folder_name(spec)} cannot be imported: {type(exc).__name__}: {first_line}"
        )


def _shown(result: SniffResult) -> dict[str, Any]:
    """What the sniff on the vendored replacement showed, for the evidence (and the cache)."""
    shown: dict[str, Any] = {"fixed": result.fixed, "summary": result.summary}
    shown.update(
        (key, result.detail[key])
        for key in ("raised", "stub", "unfinished")
        if key in result.detail
    )
    return shown


def _vendored_unproven(
    spec: BackportSpec,
    targets: tuple[ResolvedTarget, ...],
    upstream_only: bool,
    evidence: dict[str, Any],
) -> str | None:
    """Why the replacement the applier would install is not shown to carry the fix, or None.

    Sniffed in the mode in force and upstream-only alone: #7617's local changes pre-pad
    width-512 inputs, so composed with them a vendored function without the fix would pass.
    Recorded per mode in ``evidence["vendored_behaviour"]`` (a cached ``needed`` verdict
    must carry it: see verdict_cache).
    """
    folder = folder_name(spec)
    try:
        module = vendored_module(spec.vendored)
    except Exception as exc:
        error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        evidence["vendored_behaviour"] = {"import_error": error}
        return f"{folder} cannot be imported: {error}"
    alone = sniff_replacement(spec, module, upstream_only=True, targets=targets)
    composed: SniffResult | None = None  # the default mode's, when it is in force
    if not upstream_only:
        composed = alone  # no local changes: the same function
        if spec.local_changes:
            composed = sniff_replacement(spec, module, upstream_only=False, targets=targets)
    shown = {WITH_LOCAL_CHANGES: composed, UPSTREAM_ONLY: alone}
    evidence["vendored_behaviour"] = {
        mode: _shown(result) for mode, result in shown.items() if result is not None
    }
    if alone.detail.get("unfinished"):
        evidence["unfinished"] = True
    return _unproven_reason(folder, alone, composed)


def _unproven_reason(folder: str, alone: SniffResult, composed: SniffResult | None) -> str | None:
    """Why the vendored code alone (``alone``), or composed with the local changes in the
    mode in force (``composed``), is not shown to carry the fix, or None."""
    if alone.detail.get("unfinished"):
        return f"{folder} is unfinished: {alone.summary}"
    if not alone.fixed:
        hidden = (
            " (with the local changes it passes: they hide it)"
            if composed is not None and composed.fixed
            else ""
        )
        return f"{folder} lacks the fix, upstream-only: {alone.summary}{hidden}"
    if composed is not None and not composed.fixed:
        return f"{folder} with the local changes does not show the fix: {composed.summary}"
    return None
