"""Run code around a watched module's execution and right after it (as wrapt's import
hooks do), through one finder in ``sys.meta_path`` for every hook of the process.

- ``register``: ``callback(module)`` each time the module has executed (a backport's
  install, the start-up trigger's ``apply()``). A failing callback is logged and never
  breaks the import, unless its error is marked ``fatal_on_import`` (strict mode).
  ``register_named``: the callback named by a ``"module:function"`` string, imported only
  when the hook fires (as wrapt's post-import hooks are named).
- ``register_around``: the module executes inside ``around(module)``, a context manager
  (an import guard: a fix to module-level code must be in place before that code runs).
  What it raises is the execution's own failure: the import fails, as any would.
- ``after_package_import``: a callback put off until the import of the module's package
  that is still in progress on this thread has finished (a backport decided there would
  meet the package's partially initialised modules: a circular import).

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

Callback = Callable[[ModuleType], None]
Around = Callable[[ModuleType], contextlib.AbstractContextManager[Any]]

_LOCK = threading.RLock()
_CALLBACKS: dict[str, dict[str, Callback]] = {}  # module name -> key -> callback
_AROUND: dict[str, dict[str, Around]] = {}  # module name -> key -> context manager factory
_LOG = logging.getLogger(__name__)


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
        _call(callback, module)


# ---- after the package's import ------------------------------------------------------------

_MONITORING_TOOLS = (4, 3)  # ids free of the debugger (0), coverage (1), profilers (2, 5)
_TOOL: list[int] = []  # the id this process holds, once taken
_AFTER: dict[Any, list[tuple[Callback, ModuleType]]] = {}  # module code -> waiting callbacks


def after_package_import(module: ModuleType, callback: Callback) -> bool:
    """Call ``callback(module)`` as soon as the outermost module of ``module``'s top-level
    package whose import is in progress on this thread (``import megatron.core`` importing
    ``tensor_parallel.layers`` through a chain of its modules) has executed: its body has run,
    every module it imported is whole. Whether it was put off: False when no such import is
    in progress (call it now) or ``sys.monitoring`` has no tool id free."""
    code = _outermost_in_progress(module)
    if code is None or not _monitoring():
        return False
    with _LOCK:
        _AFTER.setdefault(code, []).append((callback, module))
    sys.monitoring.set_local_events(_TOOL[0], code, sys.monitoring.events.PY_RETURN)
    return True


def _outermost_in_progress(module: ModuleType) -> Any:
    """The code of the outermost module of ``module``'s top-level package still executing
    its body on this thread's stack, or None."""
    top = module.__name__.partition(".")[0]
    found = None
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if (
            frame.f_code.co_name == "<module>"
            and isinstance(name, str)
            and name != module.__name__
            and name.partition(".")[0] == top
            and getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False)
        ):
            found = frame.f_code
        frame = frame.f_back  # type: ignore[assignment]
    return found


def _monitoring() -> bool:
    """A ``sys.monitoring`` tool id of ours (PEP 669: an event on one code object costs
    nothing elsewhere), with its PY_RETURN callback; False when every id we may use is
    taken."""
    with _LOCK:
        if _TOOL:
            return True
        for tool in _MONITORING_TOOLS:
            try:
                sys.monitoring.use_tool_id(tool, "megatron-backports")
            except ValueError:
                continue
            sys.monitoring.register_callback(tool, sys.monitoring.events.PY_RETURN, _returned)
            _TOOL.append(tool)
            return True
        return False


def _returned(code: Any, offset: int, value: object) -> object:
    """A module body we wait for has run: its waiting callbacks, in the order they came. A
    fatal one raises here, in the module's import (strict mode), as ``_notify`` does."""
    with _LOCK:
        waiting = _AFTER.pop(code, None)
    if waiting is None:
        return sys.monitoring.DISABLE
    sys.monitoring.set_local_events(_TOOL[0], code, 0)
    for callback, module in waiting:
        _call(callback, module)
    return None


def _call(callback: Callback, module: ModuleType) -> None:
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


def register(module_name: str, key: str, callback: Callback) -> None:
    """Call ``callback(module)`` each time ``module_name`` finishes executing: once per
    import, even when registered under several keys (each key is unregistered alone)."""
    _add(_CALLBACKS, module_name, key, callback)


def register_named(module_name: str, key: str, path: str, **kwargs: Any) -> None:
    """``register`` a callback named "module:function", called as ``function(module,
    **kwargs)``; its module is imported only when the hook fires."""

    def named(module: ModuleType) -> None:
        home, _, name = path.partition(":")
        # __import__, not importlib.import_module: the importlib package imports warnings.
        function = getattr(__import__(home, fromlist=[name]), name)
        function(module, **kwargs)

    register(module_name, key, named)


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
        _audit_imports()


def _come_first() -> None:
    """Put the one finder at ``sys.meta_path[0]``: a finder another library inserted in
    front of it would otherwise answer for a watched module and its hooks would never run.
    One slice assignment, the list's length kept: an import iterating it meanwhile may meet
    a finder twice, never skip one."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
        return
    place = sys.meta_path.index(_FINDER)
    if place:
        sys.meta_path[: place + 1] = [_FINDER, *sys.meta_path[:place]]


_AUDITING: list[bool] = []  # one audit hook per process (they cannot be removed)


def _audit_imports() -> None:
    """At each import, bring the one finder back to ``sys.meta_path[0]`` while it has hooks:
    a finder another library inserted in front of it since (typeguard's, jaxtyping's import
    hooks) would otherwise answer for a watched module, and its hooks (a backport's install,
    an import guard) would never run. The ``import`` audit event is raised by every
    ``import`` statement and ``__import__`` before any finder is asked; ``importlib.
    import_module`` raises none, so the finder moves back at the next import statement of any
    module (and ``apply()`` catches up with a watched module imported meanwhile)."""
    if _AUDITING:
        return
    _AUDITING.append(True)

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "import" and (_CALLBACKS or _AROUND):
            meta_path = sys.meta_path
            if not meta_path or meta_path[0] is not _FINDER:
                with _LOCK:
                    if _CALLBACKS or _AROUND:
                        _come_first()

    sys.addaudithook(audit)


def unregister(key: str) -> None:
    """Drop every hook ``key`` registered; the finder leaves with the last hook (the audit
    hook stays, inert: it acts only for a module some hook watches)."""
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
