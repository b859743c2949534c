"""The verdict's reasons: what the sniffs showed, cross-checked with version and git.

Behaviour decides between ``upstream`` and ``needed``, and ``upstream`` ("delete the
backport") also needs independent evidence: the installed text of every carried symbol is
the fix's, git ancestry shows the merge, or the release is recorded as carrying it; a sniff
saying fixed without any is ``incompatible`` (drifted). A disagreement of version or git
with the sniff is written into the reason. A ``needed`` verdict also needs the replacement
shown to carry the fix: the sniff on the vendored code, upstream-only and (in the default
mode) with the local changes.
"""

import inspect
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..evidence.fingerprints import module_file
from ..evidence.fix_text import object_digest, symbol_digest
from ..evidence.git_ancestry import commit_ancestry
from ..kinds import Kind, Resolved
from ..model import (
    UPSTREAM_ONLY,
    WITH_LOCAL_CHANGES,
    BackportSpec,
    ResolvedTarget,
    SniffResult,
    Target,
)
from ..report import Verdict


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
    spec: BackportSpec,
    sniff: SniffResult,
    evidence: dict[str, Any],
    version: str,
    targets: Sequence[Resolved] = (),
) -> tuple[Verdict, str]:
    """Record what the sniff on the installed code showed, cross-checked with version and
    git; the verdict it supports and its reason: ``needed`` (the sniff says not fixed),
    ``upstream`` (it says fixed and independent evidence agrees: see ``landed_evidence``),
    or ``incompatible`` (it says fixed on text that no evidence ties to the fix: drifted).
    ``version``: what was judged ("megatron-core 0.19.2"); ``targets``: the resolved
    targets, in catalog order (their installed text is compared with the fix's)."""
    evidence["behaviour"] = {"fixed": sniff.fixed, **sniff.detail}
    notes = _cross_checks(spec, sniff.fixed, evidence)
    suffix = f" (disagrees: {'; '.join(notes)})" if notes else ""
    if not sniff.fixed:
        return Verdict.NEEDED, f"{version} lacks the fix: {sniff.summary}{suffix}"
    agreeing, text_gap = landed_evidence(spec, targets, evidence)
    if agreeing:
        return (
            Verdict.UPSTREAM,
            f"{version} already has the fix: {sniff.summary} ({'; '.join(agreeing)}){suffix}. "
            f"{spec.delete_when_landed}",
        )
    return (
        Verdict.INCOMPATIBLE,
        f"{version}: drifted: the sniff says fixed but {text_gap}, git ancestry does not show "
        f"the merge and no release is recorded as carrying it; check by hand whether the bug "
        f"is still there, then update or delete the backport (the sniff: {sniff.summary})",
    )


def landed_evidence(
    spec: BackportSpec, targets: Sequence[Resolved], evidence: dict[str, Any]
) -> tuple[list[str], str]:
    """The independent evidence that the installed release carries the fix (each item one
    phrase; [] if none), and what the text comparison found when it does not agree. Any of
    three: the installed text of every carried symbol is the fix's (normalised AST, as
    ``UPSTREAM.toml``'s ``fixed_symbols_sha256`` records it: every target votes, sniffed or
    not), git ancestry of the imported checkout shows the merge, or the installed release is
    one recorded as carrying it (``fixed_in``). Recorded in ``evidence["landed"]``."""
    recorded: dict[str, str] = evidence["upstream"].get("fixed_symbols_sha256") or {}
    texts = _texts_match(spec, targets, recorded)
    contains = evidence.get("git", {}).get("contains", {})
    in_git = any(contains.values())
    by_release = _version_claim(spec, evidence) is True
    evidence["landed"] = {"text": texts, "git": in_git, "release": by_release}
    agreeing = []
    if texts and all(texts.values()):
        agreeing.append("the installed text of every carried symbol is the fix's")
    if in_git:
        agreeing.append(f"the git checkout contains {spec.id}'s merge")
    if by_release:
        release = evidence["distribution"]["version"]
        agreeing.append(f"{release} is recorded as carrying it (fixed in {spec.fixed_in})")
    return agreeing, _text_gap(spec, recorded, texts)


def _text_gap(spec: BackportSpec, recorded: dict[str, str], texts: dict[str, bool]) -> str:
    if not recorded:
        return "no text of the fix is recorded (UPSTREAM.toml has no fixed_symbols_sha256)"
    unrecorded = [t.attribute for t in spec.targets if t.attribute not in recorded]
    if unrecorded:
        return f"no text of the fix is recorded for {', '.join(unrecorded)}"
    differ = [name for name, same in texts.items() if not same]
    return f"the installed text of {', '.join(differ)} is not the fix's"


def _texts_match(
    spec: BackportSpec, targets: Sequence[Resolved], recorded: dict[str, str]
) -> dict[str, bool]:
    """Per recorded symbol, whether its installed text is the fix's; {} where a target has
    no recorded text (it cannot vote, so the text proves nothing)."""
    if not recorded or not targets or any(t.attribute not in recorded for t in spec.targets):
        return {}
    resolved = dict(zip((t.attribute for t in spec.targets), targets, strict=False))
    declared = {t.attribute: t for t in spec.targets}
    return {
        name: installed_digest(resolved.get(name), declared.get(name, spec.targets[0]), name)
        == digest
        for name, digest in recorded.items()
    }


def installed_digest(resolved: Resolved | None, carrier: Target, name: str) -> str | None:
    """The normalised digest of ``name`` as installed: a function target's running code
    (``resolved``), else its definition in the module's file (an import guard's flag, a
    module attribute; a name carried beside the targets: in the first target's module,
    ``carrier``)."""
    if isinstance(resolved, ResolvedTarget) and inspect.isfunction(inspect.unwrap(resolved.body)):
        return object_digest(inspect.unwrap(resolved.body))
    module_name = getattr(resolved, "module_name", None)
    modules = [module_name] if isinstance(module_name, str) else []
    modules += list(carrier.modules)
    for module in modules:
        path = _source_file(module)
        if path is None:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        digest = symbol_digest(text, name)
        if digest is not None:
            return digest
    return None


def _source_file(module: str) -> Path | None:
    """The module's file: the imported one's, else as the path finds it (no import)."""
    loaded = getattr(sys.modules.get(module), "__file__", None)
    if isinstance(loaded, str) and loaded.endswith(".py"):
        return Path(loaded)
    return module_file(module)


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
