"""Run a module's function with some of its globals replaced, without touching the module.

The probe's behaviour sniff needs the installed function to call a recording kernel instead
of the real one. Swapping ``SparseMLA`` on the live module would hand that recorder (and its
all-zero outputs) to a training thread that calls the attention at the same moment. A copy
of the function whose globals are a private dict sees the override; the module and every
other caller see nothing.

Vendored functions read their target's globals through ``_live_target()`` (hand-written and
synced files alike: ``tools/sync_rewrite.py`` writes it); a private copy of one gets a
``_live_target`` that returns a view of the module with the same overrides.
"""

import types
from collections.abc import Callable, Mapping

__all__ = ["LIVE_TARGET", "ModuleView", "with_globals"]

LIVE_TARGET = "_live_target"


class ModuleView:
    """Attribute reads go to ``module()`` at call time, except the names in ``overrides``."""

    def __init__(self, module: Callable[[], object], overrides: Mapping[str, object]) -> None:
        self._module = module
        self._overrides = dict(overrides)

    def __getattr__(self, name: str) -> object:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._module(), name)


def with_globals(function: object, overrides: Mapping[str, object]) -> types.FunctionType:
    """A copy of ``function`` that sees ``overrides`` in place of those module globals.

    The copy's globals are a snapshot of the module's dict plus the overrides; the module
    itself is never written. A vendored function's ``_live_target()`` is answered by a
    ``ModuleView`` of the live target with the same overrides.
    """
    if not isinstance(function, types.FunctionType):
        raise TypeError(f"cannot give private globals to a {type(function).__name__}")
    namespace: dict[str, object] = {**function.__globals__, **overrides}
    live_target = function.__globals__.get(LIVE_TARGET)
    if callable(live_target) and LIVE_TARGET not in overrides:
        view = ModuleView(live_target, overrides)
        namespace[LIVE_TARGET] = lambda: view
    copy = types.FunctionType(
        function.__code__,
        namespace,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__dict__.update(function.__dict__)
    copy.__qualname__, copy.__module__ = function.__qualname__, function.__module__
    copy.__doc__ = function.__doc__
    return copy
