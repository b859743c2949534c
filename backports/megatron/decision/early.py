"""The evidence that needs no import of megatron: provenance, integrity, versions.

Gathered once per decision: ``UPSTREAM.toml`` read, the vendored folder hashed once (the
integrity check and the verdict cache's key share the reading), the target distributions'
versions read from their metadata. It decides alone when the vendored code drifted
(``incompatible``), the distribution is not installed or predates the target or the bug
(``absent``); otherwise the targets must be judged.
"""

import ast
import hashlib
import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..evidence.fingerprints import module_file, sha256_file
from ..evidence.versions import describe, first_release_missing, installed_versions
from ..model import BackportSpec
from ..report import Verdict
from ..vendored import Integrity, drift_reason, read_upstream


@dataclass(frozen=True)
class FolderHashes:
    """The sha256 of every file of a vendored folder (bytecode and temporary files left
    out), by name, read once; ``where`` is the folder, for messages."""

    where: str
    by_name: dict[str, str]

    def python_files(self) -> str:
        """One sha256 over the ``.py`` files (UPSTREAM.toml's ``files_sha256``): per file,
        sorted by name, ``name``, a NUL, its sha256 in hex, a newline."""
        lines = sorted(f"{n}\0{s}\n" for n, s in self.by_name.items() if n.endswith(".py"))
        return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()

    def every_file(self) -> str:
        """One sha256 over every file (UPSTREAM.toml included): the verdict cache's key."""
        digest = hashlib.sha256()
        for name in sorted(self.by_name):
            digest.update(f"{name}\0{self.by_name[name]}\n".encode())
        return digest.hexdigest()


def hash_folder(package: str) -> FolderHashes:
    """Every file directly in the vendored package's folder (``__path__``: where its modules
    are imported from), bytecode and temporary files left out."""
    module = sys.modules.get(package) or importlib.import_module(package)
    (folder,) = list(module.__path__)[:1] or [""]
    hashed = {}
    with os.scandir(folder) as listing:
        for entry in listing:
            if entry.is_file() and not entry.name.endswith((".pyc", ".tmp")):
                hashed[entry.name] = sha256_file(entry.path)
    return FolderHashes(folder, hashed)


@dataclass
class Early:
    """What the early evidence decided (``verdict`` None: the targets must be judged)."""

    verdict: Verdict | None
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    hashes: FolderHashes | None = None
    # "megatron-core 0.19.2" (saying so where the imported code is another tree): every
    # reason names what it judged.
    version: str = ""


def _integrity(upstream: Mapping[str, Any], hashes: FolderHashes, module: str) -> Integrity:
    name = str(upstream.get("file", f"{module}.py"))
    if name not in hashes.by_name:
        raise FileNotFoundError(f"{hashes.where}/{name}: UPSTREAM.toml names a file not there")
    return Integrity(
        file=name,
        expected=str(upstream.get("sha256", "")),
        actual=hashes.by_name[name],
        folder=hashes.where,
        files_expected=str(upstream.get("files_sha256", "")),
        files_actual=hashes.python_files(),
    )


def _provenance(upstream: Mapping[str, Any], integrity: Integrity) -> dict[str, Any]:
    """What ``UPSTREAM.toml`` says of the fix and whether the vendored files match it."""
    provenance = {
        key: upstream.get(key) for key in ("repo", "pr", "head_sha", "merge_sha", "origin")
    }
    # Module globals the vendored code reads at call time, as a sync found them.
    provenance["reads"] = [str(name) for name in upstream.get("reads", [])]
    # The fix's text per carried symbol (``evidence.fix_text``): what ``upstream`` checks.
    provenance["fixed_symbols_sha256"] = dict(upstream.get("fixed_symbols_sha256", {}))
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


def _defines(path: Path, attribute: str) -> bool:
    """Whether the source file ``path`` defines ``attribute`` ("name" or "Class.method") at
    its top level, read without importing it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    owner, _, name = attribute.rpartition(".")
    body = tree.body
    if owner:
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner]
        body = classes[0].body if classes else []
    defined = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in body:
        if isinstance(node, defined) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def _parts_present(spec: BackportSpec) -> list[bool]:
    """Per target: whether a candidate module's file on the path defines it (no import)."""
    present = []
    for target in spec.targets:
        files = [module_file(module) for module in target.modules]
        present.append(any(f is not None and _defines(f, target.attribute) for f in files))
    return present


def _predates(spec: BackportSpec, installed: Version, version: str) -> str | None:
    """Why the installed release (``version``, described) predates what the backport
    fixes, or None. Where an entry has several targets and the release holds some of them,
    the reason names the part it lacks."""
    predated = first_release_missing(installed, spec.target_since, spec.bug_since)
    if predated == 0:
        present = _parts_present(spec) if len(spec.targets) > 1 else []
        if any(present) and not all(present):
            parts = list(zip(spec.targets, present, strict=True))
            has = " and ".join(target.attribute for target, here in parts if here)
            lacks = " and ".join(target.attribute for target, here in parts if not here)
            return (
                f"{version} has {has} but not {lacks}, the part of the fix that arrives in "
                f"{spec.target_since}: nothing to carry"
            )
        attributes = " and ".join(target.attribute for target in spec.targets)
        return f"{version} predates {spec.target_since}, the first release with {attributes}"
    if predated == 1:
        return (
            f"{version} predates {spec.bug_since}, the first release with the bug: it has "
            "the target and behaves as the fix does"
        )
    return None


def early_evidence(spec: BackportSpec) -> Early:
    """Provenance, integrity and versions; a verdict where they decide alone."""
    evidence: dict[str, Any] = {}
    try:
        upstream = read_upstream(spec.vendored)
        hashes = hash_folder(spec.vendored.package)
        integrity = _integrity(upstream, hashes, spec.vendored.module)
    except Exception as exc:
        return Early(Verdict.INCOMPATIBLE, f"vendored code refused: {exc}", evidence)
    evidence.update(_provenance(upstream, integrity))
    # Every distribution a target lives in, read in one go; ``target_since`` dates the
    # first target's, the others must be installed.
    first = spec.target.distribution
    read = installed_versions([(t.distribution, t.modules) for t in spec.targets])
    installed = read.pop(first)
    evidence["distribution"] = {"name": first, **installed.to_dict()}
    others = {name: info.to_dict() for name, info in read.items()}
    if others:
        evidence["distributions"] = others
    drift = drift_reason(integrity, spec.id, str(upstream.get("origin") or ""))
    if drift is not None:
        return Early(Verdict.INCOMPATIBLE, drift, evidence, hashes)
    if installed.version is None:
        why = f"{spec.target.distribution} is not installed"
        return Early(Verdict.ABSENT, why, evidence, hashes)
    missing = [name for name, info in others.items() if info["version"] is None]
    if missing:
        return Early(Verdict.ABSENT, f"{', '.join(missing)} is not installed", evidence, hashes)
    version = describe(spec.target.distribution, evidence["distribution"])
    predates = _predates(spec, installed.version, version)
    if predates is not None:
        return Early(Verdict.ABSENT, predates, evidence, hashes, version)
    return Early(None, "targets not judged yet", evidence, hashes, version)
