"""Load vendored code from the very source bytes the integrity check hashes.

An import of ``package.module`` would take a ``.pyc`` from ``__pycache__`` (an
unchecked-hash one is never compared with its source) or an extension module named like the
file (``module.cpython-312-x86_64-linux-gnu.so``, which the import system prefers to the
``.py``) in place of the hashed source. So the vendored package and its modules are served
here, while the vendored module is loaded, from the ``.py`` files read once: whatever else
lies beside them is never run, and nothing is written beside them either (no ``.pyc``).
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from ._outside import BackportError, BackportSpec, VendoredRef, wrap_all
from .folder import locate
from .integrity import python_sources


class _HashedSourceLoader(importlib.abc.Loader):
    """Runs one module from source bytes read beforehand."""

    def __init__(self, path: Path, source: bytes) -> None:
        self._path, self._source = path, source

    def exec_module(self, module: ModuleType) -> None:
        code = compile(self._source, str(self._path), "exec", dont_inherit=True)
        exec(code, module.__dict__)


class _HashedSourceFinder(importlib.abc.MetaPathFinder):
    """Finds the vendored package and the modules of its folder, and nothing else."""

    def __init__(self, package: str, folder: Path, sources: Mapping[str, bytes]) -> None:
        self._package, self._folder, self._sources = package, folder, sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == self._package:
            file_name, is_package = "__init__.py", True
        elif fullname.rpartition(".")[0] == self._package:
            file_name, is_package = f"{fullname.rpartition('.')[2]}.py", False
        else:
            return None
        if file_name not in self._sources:
            return None  # a namespace package, or a name the folder has no source for
        origin = self._folder / file_name
        loader = _HashedSourceLoader(origin, self._sources[file_name])
        spec = importlib.machinery.ModuleSpec(
            fullname, loader, origin=str(origin), is_package=is_package
        )
        if is_package:
            spec.submodule_search_locations = [str(self._folder)]
        spec.has_location = True  # __file__ is set: inspect and tracebacks find the source
        return spec


@contextmanager
def _served_from_source(ref: VendoredRef) -> Iterator[None]:
    folder = locate(ref)
    finder = _HashedSourceFinder(ref.package, folder, python_sources(folder))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def vendored_module(ref: VendoredRef) -> ModuleType:
    """The vendored module ``ref`` names, imported from its folder's ``.py`` files (one that
    is imported already is returned as it is)."""
    name = f"{ref.package}.{ref.module}"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    with _served_from_source(ref):
        return importlib.import_module(name)


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
