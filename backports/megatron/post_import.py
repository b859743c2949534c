"""Run callbacks right after a named module is first imported (as wrapt's import hooks do).

Standard library only, and nothing is imported or scanned until a watched module is
imported: the job-start hook loads this module into every interpreter.
"""

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["register", "registered", "take_place_of", "unregister", "watched_spec"]

Callback = Callable[[ModuleType], None]

_LOCK = threading.RLock()
_CALLBACKS: dict[str, dict[str, Callback]] = {}  # module name -> key -> callback
_LOG = logging.getLogger("backports.megatron")


class _NotifyingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks for the executed module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _notify(module)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package ...: inspect and linecache keep working.
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds watched modules through the other finders and wraps their loaders."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _CALLBACKS:
            return None
        busy: set[str] = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = self._find_with_others(fullname, path, target)
        finally:
            busy.discard(fullname)
        if spec is not None and spec.loader is None and spec.submodule_search_locations:
            # A namespace package (``megatron``): the import system would give it this
            # loader itself, as CPython's own _init_module_attrs does.
            namespace = importlib.machinery.NamespaceLoader.__new__(
                importlib.machinery.NamespaceLoader
            )
            namespace._path = spec.submodule_search_locations  # type: ignore[attr-defined]
            spec.loader = namespace
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _NotifyingLoader(spec.loader)
        return spec

    def _find_with_others(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec  # type: ignore[no-any-return]
        return None


_FINDER = _Finder()


def _notify(module: ModuleType) -> None:
    with _LOCK:
        # Once each, however many keys registered it (a callback may serve several keys);
        # told apart by identity, never by a callback's own __eq__ or __hash__.
        registered = _CALLBACKS.get(module.__name__, {}).values()
        callbacks = list({id(callback): callback for callback in registered}.values())
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:
            # A backport must never break the import it watches, unless it asks to
            # (strict mode raises an error marked with `fatal_on_import`).
            if getattr(exc, "fatal_on_import", False):
                raise
            _LOG.error("post-import hook for %s failed: %r", module.__name__, exc)


def watched_spec(
    fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
) -> importlib.machinery.ModuleSpec | None:
    """A registered module's spec as the other finders find it, its loader wrapped to run
    the callbacks: for the start-up trigger, which is asked first and hands the lookup on."""
    return _FINDER.find_spec(fullname, path, target)


def take_place_of(finder: object) -> None:
    """Stand where ``finder`` (the start-up trigger) stands in ``sys.meta_path``: one
    finder for every post-import hook, never two in series. Same index, same length: an
    import iterating the list meanwhile skips nothing."""
    with _LOCK:
        places = [i for i, found in enumerate(sys.meta_path) if found is finder]
        if places and _FINDER not in sys.meta_path:
            sys.meta_path[places[0]] = _FINDER


def register(module_name: str, key: str, callback: Callback) -> None:
    """Call ``callback(module)`` each time ``module_name`` finishes executing: once per
    import, even when registered under several keys (each key is unregistered alone)."""
    with _LOCK:
        _CALLBACKS.setdefault(module_name, {})[key] = callback
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def unregister(key: str) -> None:
    with _LOCK:
        for module_name in list(_CALLBACKS):
            _CALLBACKS[module_name].pop(key, None)
            if not _CALLBACKS[module_name]:
                del _CALLBACKS[module_name]
        if not _CALLBACKS and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def registered(key: str) -> list[str]:
    """The module names ``key`` is watching."""
    with _LOCK:
        return [name for name, callbacks in _CALLBACKS.items() if key in callbacks]
