"""The verdict's reasons: what the sniffs showed, cross-checked with version and git.

Behaviour decides between ``upstream`` and ``needed``; the version (``fixed_in``) and git
ancestry of a source checkout are cross-checks, and a disagreement is written into the
reason. A ``needed`` verdict also needs the replacement shown to carry the fix: the sniff on
the vendored code, upstream-only and (in the default mode) with the local changes.
"""

import inspect
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..evidence.git_ancestry import commit_ancestry
from ..kinds import Kind, Resolved
from ..model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, BackportSpec, SniffResult, Target


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (a message may hold newlines)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


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


def behaviour_reasons(
    spec: BackportSpec, sniff: SniffResult, evidence: dict[str, Any], version: str
) -> tuple[str | None, str]:
    """Record what the sniff on the installed code showed, cross-checked with version and
    git; the reason it has landed (None while it has not), and the reason it is needed.
    ``version``: what was judged ("megatron-core 0.19.2")."""
    evidence["behaviour"] = {"fixed": sniff.fixed, **sniff.detail}
    notes = _cross_checks(spec, sniff.fixed, evidence)
    suffix = f" (disagrees: {'; '.join(notes)})" if notes else ""
    if sniff.fixed:
        return (
            f"{version} already has the fix: {sniff.summary}{suffix}. {spec.delete_when_landed}",
            "",
        )
    return None, f"{version} lacks the fix: {sniff.summary}{suffix}"


def git_evidence(spec: BackportSpec, evidence: dict[str, Any]) -> dict[str, Any]:
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


def shown(result: SniffResult) -> dict[str, Any]:
    """What the sniff on the vendored replacement showed, for the evidence (and the cache)."""
    found: dict[str, Any] = {"fixed": result.fixed, "summary": result.summary}
    found.update(
        (key, result.detail[key])
        for key in ("raised", "stub", "unfinished")
        if key in result.detail
    )
    return found


def vendored_behaviour(
    alone: SniffResult, composed: SniffResult | None
) -> dict[str, dict[str, Any]]:
    """``evidence["vendored_behaviour"]``: per mode, what the sniff on the replacement showed
    (a cached ``needed`` verdict must carry it: see verdict_cache)."""
    modes = {UPSTREAM_ONLY: alone, WITH_LOCAL_CHANGES: composed}
    return {mode: shown(result) for mode, result in modes.items() if result is not None}


def unproven_reason(folder: str, alone: SniffResult, composed: SniffResult | None) -> str | None:
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


def _parameters(resolved: Resolved) -> tuple[str, ...] | None:
    """The parameter names of a function target's undecorated body (None: not a function)."""
    body = getattr(resolved, "body", None)
    if not callable(body):
        return None
    try:
        return tuple(inspect.signature(body).parameters)
    except (TypeError, ValueError):
        return None


def reordered_only(
    spec: BackportSpec, kinds: Sequence[Kind], targets: Sequence[Resolved], reads: list[str]
) -> bool:
    """Whether every refusal of the targets is that upstream reordered a target's
    parameters: the same names, the first (``self``) first, and nothing else refused once
    the installed order is taken. Such a target cannot take the vendored code (a caller
    passing arguments by position would hand them to the wrong parameters), yet a sniff
    that passes them by name still tells whether the release has the fix. ``reads``
    concern the first target, as in the decision's own refusal."""
    reordered = False
    for index, (target, kind, resolved) in enumerate(
        zip(spec.targets, kinds, targets, strict=True)
    ):
        actual = _parameters(resolved)
        expected = getattr(target, "parameters", ())
        if actual is not None and expected and actual != expected:
            if sorted(actual) != sorted(expected) or actual[:1] != expected[:1]:
                return False
            target = replace(target, parameters=actual)
            reordered = True
        if kind.refusal(target, resolved, reads if index == 0 else []) is not None:
            return False
    return reordered


def _defining(target: Target, name: str) -> str | None:
    """The first of the target's modules, as imported here, that defines ``name``."""
    for module_name in target.modules:
        module = sys.modules.get(module_name)
        if module is not None and name in vars(module):
            return module_name
    return None


def renamed_reason(spec: BackportSpec, version: str) -> str | None:
    """Why a target that is missing was renamed upstream (``spec.renamed``: the old name
    gone, the new one defined in the target's module), or None: the entry cannot install
    there and the renamed code may still have the bug, so it is never "not needed"."""
    by_name = {target.attribute: target for target in spec.targets}
    found = [
        (rename, module)
        for rename in spec.renamed
        if rename.old in by_name
        and _defining(by_name[rename.old], rename.old) is None
        and (module := _defining(by_name[rename.old], rename.new)) is not None
    ]
    if not found:
        return None
    changes = " and ".join(dict.fromkeys(rename.change for rename, _ in found))
    names = ", ".join(f"{module}.{r.old} is now {r.new}" for r, module in found)
    return (
        f"{version}: renamed upstream in {changes} ({names}): this backport replaces the old "
        "names, which nothing there reads; check by hand whether the renamed code still has "
        "the bug, and update or delete the backport"
    )
