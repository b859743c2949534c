"""A vendored folder and its ``UPSTREAM.toml``, as a sync reads them.

The manifest is read and written by the one reader/writer in ``upstream_schema`` (the
probe's too); here only what a sync adds: finding the folder of an id under a vendor
directory, and the two things the package says about it (the folder digest the probe
compares, and the local changes the catalog wraps around the vendored code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..upstream_schema import FILE_NAME, ManifestError, parse_upstream, render_upstream
from .errors import UsageError

__all__ = [
    "MANIFEST",
    "Backport",
    "files_digest",
    "known_backports",
    "load_backport",
    "local_changes",
    "render_manifest",
]

MANIFEST = FILE_NAME
_BACKPORT_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class Backport:
    id: str
    folder: Path
    manifest: dict[str, Any]
    manifest_text: str

    @property
    def file(self) -> Path:
        return self.folder / str(self.manifest["file"])

    @property
    def manifest_path(self) -> Path:
        return self.folder / MANIFEST

    def shown(self, name: str = "") -> str:
        """``vendor/<folder>/<name>``: how diffs and messages name the backport's files."""
        return f"{self.folder.parent.name}/{self.folder.name}/{name}"


def _read_manifest(folder: Path) -> Backport:
    path = folder / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
        data = parse_upstream(text, str(path), hashes_required=False)
    except (OSError, UnicodeDecodeError, ManifestError) as exc:
        message = str(exc) if isinstance(exc, ManifestError) else f"cannot read {path}: {exc}"
        raise UsageError(message) from exc
    return Backport(data["id"], folder, data, text)


def known_backports(vendor: Path) -> list[Backport]:
    """Every vendored folder; the hidden ones are a sync's staging and set-aside copies."""
    folders = sorted(path.parent for path in vendor.glob(f"*/{MANIFEST}"))
    return [_read_manifest(folder) for folder in folders if not folder.name.startswith(".")]


def load_backport(vendor: Path, backport_id: str) -> Backport:
    """The backport ``id`` (``megatron-lm-7617`` lives in ``vendor/megatron_lm_7617/``)."""
    folder = vendor / backport_id.replace("-", "_")
    if not _BACKPORT_ID.fullmatch(backport_id) or not (folder / MANIFEST).is_file():
        known = ", ".join(b.id for b in known_backports(vendor)) or "none"
        raise UsageError(f"unknown backport {backport_id!r} (known under {vendor}: {known})")
    backport = _read_manifest(folder)
    if backport.id != backport_id:
        raise UsageError(f"{backport.manifest_path} says id = {backport.id!r}, not {backport_id!r}")
    return backport


def render_manifest(old_text: str, data: dict[str, Any]) -> str:
    """The new ``UPSTREAM.toml`` text (the one writer; a refusal is a usage error)."""
    try:
        return render_upstream(old_text, data)
    except ManifestError as exc:
        raise UsageError(str(exc)) from exc


def files_digest(folder: Path) -> str:
    """``files_sha256``: one sha256 over the folder's ``.py`` files, as the probe computes it."""
    from ..vendored import python_files_digest

    return python_files_digest(folder)


def local_changes(backport_id: str) -> list[tuple[str, str]] | None:
    """(name, reason) of each local change the catalog entry wraps its vendored code with;
    None when this environment's catalog has no such entry (a plugin not installed here)."""
    from .. import catalog  # loads the entries and plugins: only a sync that wrote needs it

    try:
        spec = catalog.by_id(backport_id)
    except KeyError:
        return None
    return [(change.name, change.reason) for change in spec.local_changes]
