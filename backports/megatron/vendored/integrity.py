"""Whether a vendored folder is byte for byte what its ``UPSTREAM.toml`` records, and the one
message that says how it is not (the probe's reason, ``backports sync --check``'s line, the
contract kit's assertion).

``sha256`` covers the file ``UPSTREAM.toml`` names; ``files_sha256`` covers every ``.py``
file directly in the folder, so an edit to any module an import may load is caught,
whichever file ``file`` names. The loader (``loading``) runs those very source files, never
a ``.pyc`` or an extension module beside them, so the hash covers what runs.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

from .manifest import FILE_NAME, UpstreamToml


def python_sources(folder: Traversable) -> dict[str, bytes]:
    """Every ``*.py`` file directly in ``folder``: name -> its bytes (what an import of the
    package's modules reads, and what ``files_sha256`` covers)."""
    return {
        item.name: item.read_bytes()
        for item in folder.iterdir()
        if item.name.endswith(".py") and item.is_file()
    }


def digest_of(sources: Mapping[str, bytes]) -> str:
    """``files_sha256`` of ``sources``: per file, sorted by name, ``name``, a NUL, the file's
    sha256 in hex, a newline; the sha256 of all of that."""
    lines = sorted(
        f"{name}\0{hashlib.sha256(data).hexdigest()}\n" for name, data in sources.items()
    )
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def python_files_digest(folder: Traversable) -> str:
    """One sha256 over every ``*.py`` file directly in ``folder`` (``digest_of``). A
    ``pathlib.Path`` is a ``Traversable`` too, so ``backports sync`` hashes a staged copy with
    the very function the probe uses on the installed package."""
    return digest_of(python_sources(folder))


@dataclass(frozen=True)
class Integrity:
    """The hashes ``UPSTREAM.toml`` records beside the hashes of the files as they are."""

    file: str
    expected: str
    actual: str  # "" when the file cannot be read (``file_error`` says why)
    folder: str  # where the vendored folder lives, for messages
    files_expected: str  # "" when UPSTREAM.toml has no files_sha256
    files_actual: str
    file_error: str = ""

    @property
    def file_ok(self) -> bool:
        return not self.file_error and self.expected == self.actual

    @property
    def files_ok(self) -> bool:
        return bool(self.files_expected) and self.files_expected == self.files_actual

    @property
    def ok(self) -> bool:
        return self.file_ok and self.files_ok


def folder_integrity(folder: Path, manifest: UpstreamToml) -> Integrity:
    """The folder's files hashed now, beside what ``manifest`` records."""
    name = manifest["file"]
    try:
        actual, error = hashlib.sha256((folder / name).read_bytes()).hexdigest(), ""
    except OSError as exc:
        actual, error = "", exc.strerror or type(exc).__name__
    return Integrity(
        file=name,
        expected=manifest.get("sha256", ""),
        actual=actual,
        folder=str(folder),
        files_expected=manifest.get("files_sha256", ""),
        files_actual=python_files_digest(folder),
        file_error=error,
    )


def _fix(backport_id: str, origin: str) -> str:
    """What puts a drifted folder right: a handwritten one's new hashes are recorded with
    ``--rehash`` (there is no upstream text to sync); synced code is synced again."""
    if origin == "handwritten":
        return (
            f"if the edit is meant, record its hashes: backports sync --backport {backport_id} "
            "--rehash (with --vendor-dir DIR for a plugin's folder)"
        )
    return f"re-sync it (backports sync --backport {backport_id} --sha SHA) or undo the edit"


def drift_reason(integrity: Integrity, backport_id: str, origin: str) -> str | None:
    """Why the vendored code is not what ``UPSTREAM.toml`` records, in one line that names
    what puts it right; None when it is. The named file first, then every ``.py`` of the
    folder (the loader imports the module by name, which need not be the named file)."""
    fix = _fix(backport_id, origin)
    where = integrity.folder
    if integrity.file_error:
        return f"vendored {where}/{integrity.file} cannot be read ({integrity.file_error}); {fix}"
    if not integrity.expected:
        return f"vendored {where}: {FILE_NAME} has no sha256 for {integrity.file}; {fix}"
    if not integrity.file_ok:
        return (
            f"vendored {where}/{integrity.file} has sha256 {integrity.actual[:12]}, {FILE_NAME} "
            f"says {integrity.expected[:12]}: it was edited without backports sync; {fix}"
        )
    if not integrity.files_expected:
        return (
            f"vendored folder {where}: {FILE_NAME} has no files_sha256, so its .py files cannot "
            f"be checked; {fix}"
        )
    if not integrity.files_ok:
        return (
            f"vendored folder {where} has files_sha256 {integrity.files_actual[:12]}, "
            f"{FILE_NAME} says {integrity.files_expected[:12]}: a .py file in it was edited "
            f"without backports sync; {fix}"
        )
    return None
