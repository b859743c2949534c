"""Run code around a watched module's execution and right after it (as wrapt's import
hooks do), through one finder in ``sys.meta_path`` for every hook of the process.

- ``register``: ``callback(module)`` each time the module has executed (a backport's
  install, the start-up trigger's ``apply()``). A failing callback is logged and never
  breaks the import, unless its error is marked ``fatal_on_import`` (strict mode).
- ``register_around``: the module executes inside ``around(module)``, a context manager
  (an import guard: a fix to module-level code must be in place before that code runs).
  What it raises is the execution's own failure: the import fails, as any would.

Standard library only, and nothing is imported or scanned until a watched module is
imported: the start-up trigger loads this module at megatron's first lookup.
"""

import contextlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "register",
    "register_around",
    "registered",
    "take_place_of",
    "unregister",
    "watched_spec",
]

Callback = Callable[[ModuleType], None]
Around = Callable[[ModuleType], contextlib.AbstractContextManager[Any]]

_LOCK = threading.RLock()
_CALLBACKS: dict[str, dict[str, Callback]] = {}  # module name -> key -> callback
_AROUND: dict[str, dict[str, Around]] = {}  # module name -> key -> context manager factory
_LOG = logging.getLogger("backports.megatron")


class _WatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader: the module executes inside its "around" hooks, then
    its callbacks run."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        with contextlib.ExitStack() as stack:
            for around in _hooks(_AROUND, module.__name__):  # the first registered outermost
                stack.enter_context(around(module))
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
        if fullname not in _CALLBACKS and fullname not in _AROUND:
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
        spec.loader = _WatchingLoader(spec.loader)
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


def _hooks[H: (Callback, Around)](table: dict[str, dict[str, H]], module_name: str) -> list[H]:
    with _LOCK:
        # Once each, however many keys registered it (a callback may serve several keys);
        # told apart by identity, never by a hook's own __eq__ or __hash__.
        registered = table.get(module_name, {}).values()
        return list({id(hook): hook for hook in registered}.values())


def _notify(module: ModuleType) -> None:
    for callback in _hooks(_CALLBACKS, module.__name__):
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
    _add(_CALLBACKS, module_name, key, callback)


def register_around(module_name: str, key: str, around: Around) -> None:
    """Run each later execution of ``module_name`` inside ``around(module)``: a context
    manager entered just before the module's code runs and left once it has run."""
    _add(_AROUND, module_name, key, around)


def _add[H: (Callback, Around)](
    table: dict[str, dict[str, H]], module_name: str, key: str, hook: H
) -> None:
    with _LOCK:
        table.setdefault(module_name, {})[key] = hook
        _come_first()


def _come_first() -> None:
    """Put the one finder at ``sys.meta_path[0]``: a finder another library inserted in
    front of it since start-up would otherwise answer for a watched module and its hooks
    would never run. One slice assignment, the list's length kept: an import iterating it
    meanwhile may meet a finder twice, never skip one."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
        return
    place = sys.meta_path.index(_FINDER)
    if place:
        sys.meta_path[: place + 1] = [_FINDER, *sys.meta_path[:place]]


def unregister(key: str) -> None:
    """Drop every hook ``key`` registered; the finder leaves with the last hook."""
    with _LOCK:
        _drop(_CALLBACKS, key)
        _drop(_AROUND, key)
        if not _CALLBACKS and not _AROUND and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def _drop[H: (Callback, Around)](table: dict[str, dict[str, H]], key: str) -> None:
    for module_name in list(table):
        table[module_name].pop(key, None)
        if not table[module_name]:
            del table[module_name]


def registered(key: str) -> list[str]:
    """The module names ``key`` is watching, with either kind of hook."""
    with _LOCK:
        names = dict.fromkeys([*_CALLBACKS, *_AROUND])
        return [n for n in names if key in _CALLBACKS.get(n, {}) or key in _AROUND.get(n, {})]
