"""Find vendored code and its provenance, check it has not drifted, and load it."""

import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from types import ModuleType
from typing import Any

from .errors import BackportError
from .local_changes import wrap_all
from .model import BackportSpec, VendoredRef
from .upstream_schema import parse_upstream

__all__ = [
    "Integrity",
    "check_integrity",
    "drift_reason",
    "load_replacement",
    "python_files_digest",
    "read_upstream",
    "replacement_functions",
    "vendored_module",
]

_MANIFEST = "UPSTREAM.toml"


def read_upstream(ref: VendoredRef) -> dict[str, Any]:
    """The vendored package's ``UPSTREAM.toml`` as a dict, its schema checked."""
    manifest = files(ref.package) / _MANIFEST
    try:
        text = manifest.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BackportError(f"cannot read {ref.package}/{_MANIFEST}: {exc}") from exc
    return parse_upstream(text, str(manifest))


@dataclass(frozen=True)
class Integrity:
    """Whether the vendored code is byte-for-byte what ``UPSTREAM.toml`` describes.

    ``sha256`` covers the file ``UPSTREAM.toml`` names; ``files_sha256`` covers every
    ``.py`` file of the folder, so an edit to any module the loader may import is caught,
    whichever file ``file`` names.
    """

    file: str
    expected: str
    actual: str
    folder: str  # where the vendored package lives, for messages
    files_expected: str  # "" when UPSTREAM.toml has no files_sha256
    files_actual: str

    @property
    def file_ok(self) -> bool:
        return self.expected == self.actual

    @property
    def files_ok(self) -> bool:
        return bool(self.files_expected) and self.files_expected == self.files_actual

    @property
    def ok(self) -> bool:
        return self.file_ok and self.files_ok


def python_files_digest(folder: Traversable) -> str:
    """One sha256 over every ``*.py`` file directly in ``folder`` (what an import can load).

    Per file, sorted by name: ``name``, a NUL, the file's sha256 in hex, a newline. A
    ``pathlib.Path`` is a ``Traversable`` too, so ``backports sync`` hashes a source
    tree with the very function the probe uses on the installed package.
    """
    lines = sorted(
        f"{item.name}\0{hashlib.sha256(item.read_bytes()).hexdigest()}\n"
        for item in folder.iterdir()
        if item.name.endswith(".py") and item.is_file()
    )
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def check_integrity(ref: VendoredRef, upstream: dict[str, Any]) -> Integrity:
    folder = files(ref.package)
    name = str(upstream.get("file", f"{ref.module}.py"))
    data = (folder / name).read_bytes()
    return Integrity(
        file=name,
        expected=str(upstream.get("sha256", "")),
        actual=hashlib.sha256(data).hexdigest(),
        folder=str(folder),
        files_expected=str(upstream.get("files_sha256", "")),
        files_actual=python_files_digest(folder),
    )


def vendored_module(ref: VendoredRef) -> ModuleType:
    """The vendored module ``ref`` names, imported."""
    return importlib.import_module(f"{ref.package}.{ref.module}")


def _replacement_in(module: ModuleType, target_module: str | None, name: str) -> Callable[..., Any]:
    """``module``'s function ``name``; with ``target_module``, the vendored module reads its
    globals from that module at call time."""
    if target_module is not None:
        setattr(module, "__target_module__", target_module)  # noqa: B010 (a dunder by name)
    function = getattr(module, name)
    if not callable(function):
        raise BackportError(f"{module.__name__}.{name} is not callable")
    return function  # type: ignore[no-any-return]


def load_replacement(
    ref: VendoredRef, target_module: str | None, attribute: str | None = None
) -> Callable[..., Any]:
    """The vendored function ``attribute`` (default: ``ref.attribute``); with
    ``target_module``, the vendored module reads its globals from that module at call time
    (a multi-target entry binds it to its first target's module)."""
    return _replacement_in(vendored_module(ref), target_module, attribute or ref.attribute)


def replacement_functions(
    spec: BackportSpec, module: ModuleType, target_module: str, *, upstream_only: bool
) -> list[Callable[..., Any]]:
    """What replaces each target, in catalog order, before any decorator: ``module``'s
    function for each target, the first one wrapped in the entry's local changes unless
    ``upstream_only``. ``module`` reads its globals from ``target_module`` (the first
    target's defining module). The applier installs these; the probe sniffs them."""
    functions = []
    for index, target in enumerate(spec.targets):
        function = _replacement_in(
            module, target_module if index == 0 else None, target.replacement_name
        )
        if index == 0 and not upstream_only:
            function = wrap_all(function, spec.local_changes)
        functions.append(function)
    return functions


def _drift_fix(backport_id: str, origin: str) -> str:
    """What puts a drifted folder right: a handwritten one's new hashes are recorded with
    ``--rehash`` (there is no upstream text to sync); synced code is synced again."""
    if origin == "handwritten":
        return (
            f"if the edit is meant, record its hashes: backports sync --backport {backport_id} "
            "--rehash (with --vendor-dir DIR for a plugin's folder)"
        )
    return f"re-sync it (backports sync --backport {backport_id}) or undo the edit"


def drift_reason(integrity: Integrity, backport_id: str, origin: str) -> str | None:
    """Why the vendored code is not what UPSTREAM.toml describes, or None.

    The named file first, then every .py of the folder: the loader imports the module by
    name, which need not be the file UPSTREAM.toml names.
    """
    fix = _drift_fix(backport_id, origin)
    if not integrity.file_ok:
        return (
            f"vendored {integrity.file} has sha256 {integrity.actual[:12]}, UPSTREAM.toml says "
            f"{integrity.expected[:12]}: it was edited without backports sync; {fix}"
        )
    if not integrity.files_expected:
        return (
            f"vendored folder {integrity.folder}: UPSTREAM.toml has no files_sha256, so its "
            ".py files cannot be checked; re-sync it, or refresh a handwritten one with "
            "backports sync --rehash"
        )
    if not integrity.files_ok:
        return (
            f"vendored folder {integrity.folder} has files_sha256 {integrity.files_actual[:12]}, "
            f"UPSTREAM.toml says {integrity.files_expected[:12]}: a .py file in it was edited "
            f"without backports sync; {fix}"
        )
    return None
