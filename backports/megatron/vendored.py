"""Find vendored code and its provenance, check it has not drifted, and load it."""

import hashlib
import importlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from .errors import BackportError
from .model import VendoredRef
from .upstream_schema import manifest_problems

__all__ = [
    "Integrity",
    "check_integrity",
    "load_replacement",
    "python_files_digest",
    "read_upstream",
]

_MANIFEST = "UPSTREAM.toml"


def read_upstream(ref: VendoredRef) -> dict[str, Any]:
    """The vendored package's ``UPSTREAM.toml`` as a dict, its schema checked."""
    manifest = files(ref.package) / _MANIFEST
    try:
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BackportError(f"cannot read {ref.package}/{_MANIFEST}: {exc}") from exc
    problems = manifest_problems(data)
    if problems:
        raise BackportError(f"{manifest} is not a valid {_MANIFEST}: {'; '.join(problems)}")
    return data


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
    ``pathlib.Path`` is a ``Traversable`` too, so tools/sync_upstream.py hashes a source
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


def load_replacement(
    ref: VendoredRef, target_module: str | None, attribute: str | None = None
) -> Callable[..., Any]:
    """The vendored function ``attribute`` (default: ``ref.attribute``); with
    ``target_module``, the vendored module reads its globals from that module at call time
    (a multi-target entry binds it to its first target's module)."""
    module = importlib.import_module(f"{ref.package}.{ref.module}")
    if target_module is not None:
        setattr(module, "__target_module__", target_module)  # noqa: B010 (a dunder by name)
    name = attribute or ref.attribute
    function = getattr(module, name)
    if not callable(function):
        raise BackportError(f"{module.__name__}.{name} is not callable")
    return function  # type: ignore[no-any-return]
