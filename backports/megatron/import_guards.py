"""Run a module's execution inside a guard: the install kind for fixes to module-level code.

A backport of a function rebinds it after the import; a fix to what a module does while it
executes (a probe of optional packages at import time, say) must be in place before that
execution starts. ``install`` puts a finder first in ``sys.meta_path`` that wraps the
guarded module's loader: its ``exec_module`` runs inside ``guard()``, the vendored context
manager. ``apply()`` installs it before the module's first import (the start-up hook fires
on ``megatron``'s first lookup); ``uninstall`` removes the finder. A module executed
before the install is not re-executed: a reload or a fresh import runs guarded.

Standard library only: the start-up path may import this before anything of megatron.
"""

import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["GuardInstallation", "GuardTarget", "install", "installed", "no_guard", "uninstall"]

Guard = Callable[[], contextlib.AbstractContextManager[Any]]

_LOCK = threading.RLock()
_INSTALLED: dict[str, "GuardInstallation"] = {}


@contextlib.contextmanager
def no_guard() -> Iterator[None]:
    """The guard in force when none is installed: the module's code as it stands."""
    yield


@dataclass(frozen=True)
class GuardTarget:
    """What an import guard's sniff judges: ``module_name`` imported under ``original``."""

    module_name: str
    original: Guard
    installed: Guard | None = None


@dataclass
class GuardInstallation:
    """One backport's guard, and what it did to each guarded execution so far."""

    backport_id: str
    module_name: str
    guard: Guard
    mode: str
    # One entry per guarded execution: "ok", or the exception's "Type: message".
    executions: list[str] = field(default_factory=list)

    @property
    def replacement(self) -> Guard:
        return self.guard


class _GuardedLoader(importlib.abc.Loader):
    """Delegates to the real loader; the module's code runs inside the guard."""

    def __init__(self, loader: Any, installation: GuardInstallation) -> None:
        self._loader = loader
        self._installation = installation

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        try:
            with self._installation.guard():
                self._loader.exec_module(module)
        except BaseException as exc:
            self._installation.executions.append(f"{type(exc).__name__}: {exc}")
            raise
        self._installation.executions.append("ok")

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package ...: inspect and linecache keep working.
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds guarded modules through the other finders and wraps their loaders."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        with _LOCK:
            installation = next((i for i in _INSTALLED.values() if i.module_name == fullname), None)
        if installation is None:
            return None
        busy: set[str] = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = _find_with_others(self, fullname, path, target)
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _GuardedLoader(spec.loader, installation)
        return spec


def _find_with_others(
    me: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> importlib.machinery.ModuleSpec | None:
    for finder in list(sys.meta_path):
        if finder is me:
            continue
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            return spec  # type: ignore[no-any-return]
    return None


_FINDER = _Finder()


def install(backport_id: str, module_name: str, guard: Guard, mode: str) -> bool:
    """Guard every later execution of ``module_name``; False if it was installed already."""
    with _LOCK:
        if backport_id in _INSTALLED:
            return False
        _INSTALLED[backport_id] = GuardInstallation(backport_id, module_name, guard, mode)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        return True


def installed(backport_id: str) -> GuardInstallation | None:
    with _LOCK:
        return _INSTALLED.get(backport_id)


def uninstall(backport_id: str) -> GuardInstallation | None:
    """Remove the guard (a later execution runs unguarded); the removed one, or None."""
    with _LOCK:
        removed = _INSTALLED.pop(backport_id, None)
        if not _INSTALLED and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        return removed
