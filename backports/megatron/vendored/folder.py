"""A vendored folder: where it is, its ``UPSTREAM.toml`` read and checked, its integrity.

The probe finds an entry's folder from its ``VendoredRef`` (an installed package); a sync
finds it under a vendor directory by id (``vendor/megatron_lm_7617`` for
``megatron-lm-7617``). Both read it here, with the one reader.
"""

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from ._outside import BackportError, VendoredRef
from .integrity import Integrity, folder_integrity
from .manifest import FILE_NAME, ManifestError, UpstreamToml, parse_upstream

_BACKPORT_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class VendoredFolder:
    """One vendored folder and its manifest, as read (``manifest_text`` keeps the comments
    and key order the writer keeps)."""

    path: Path
    manifest: UpstreamToml
    manifest_text: str

    @classmethod
    def read(cls, path: Path, *, hashes_required: bool = True) -> "VendoredFolder":
        """``path``'s ``UPSTREAM.toml``, checked; a ``ManifestError`` in one line.
        ``hashes_required=False``: a folder a sync or ``--rehash`` is about to hash."""
        manifest = path / FILE_NAME
        try:
            text = manifest.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestError(f"cannot read {manifest}: {exc}") from exc
        return cls(path, parse_upstream(text, str(manifest), hashes_required=hashes_required), text)

    @property
    def id(self) -> str:
        return self.manifest["id"]

    @property
    def file(self) -> Path:
        return self.path / self.manifest["file"]

    @property
    def manifest_path(self) -> Path:
        return self.path / FILE_NAME

    def shown(self, name: str = "") -> str:
        """``vendor/<folder>/<name>``: how diffs and messages name the folder's files."""
        return f"{self.path.parent.name}/{self.path.name}/{name}"

    def integrity(self) -> Integrity:
        return folder_integrity(self.path, self.manifest)


def locate(ref: VendoredRef) -> Path:
    """The folder of the vendored package ``ref`` names, found without running the package
    (its ``__init__`` is loaded, later, from the hashed source like its other modules)."""
    try:
        spec = importlib.util.find_spec(ref.package)
    except (ImportError, ValueError) as exc:
        raise BackportError(f"cannot find the vendored package {ref.package}: {exc}") from exc
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise BackportError(f"the vendored package {ref.package} is not a folder on sys.path")
    return Path(locations[0])


def read_upstream(ref: VendoredRef) -> UpstreamToml:
    """The vendored package's ``UPSTREAM.toml``, its schema checked."""
    return VendoredFolder.read(locate(ref)).manifest


def check_integrity(ref: VendoredRef, upstream: UpstreamToml) -> Integrity:
    """The installed vendored package hashed now, beside ``upstream``'s record."""
    return folder_integrity(locate(ref), upstream)


def folders_under(vendor: Path) -> list[VendoredFolder]:
    """Every vendored folder; the hidden ones are a sync's staging and set-aside copies."""
    folders = sorted(path.parent for path in vendor.glob(f"*/{FILE_NAME}"))
    return [
        VendoredFolder.read(folder, hashes_required=False)
        for folder in folders
        if not folder.name.startswith(".")
    ]


def folder_of(vendor: Path, backport_id: str) -> VendoredFolder:
    """The folder of ``backport_id`` under ``vendor`` (``megatron-lm-7617`` lives in
    ``vendor/megatron_lm_7617/``), as a sync reads it: its hashes may be missing."""
    path = vendor / backport_id.replace("-", "_")
    if not _BACKPORT_ID.fullmatch(backport_id) or not (path / FILE_NAME).is_file():
        known = ", ".join(folder.id for folder in folders_under(vendor)) or "none"
        raise BackportError(f"unknown backport {backport_id!r} (known under {vendor}: {known})")
    folder = VendoredFolder.read(path, hashes_required=False)
    if folder.id != backport_id:
        raise BackportError(f"{folder.manifest_path} says id = {folder.id!r}, not {backport_id!r}")
    return folder
