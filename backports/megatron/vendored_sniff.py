"""Does the vendored replacement carry its fix? The entry's own sniff, run on it.

The probe's sniff judges the installed megatron function. Nothing else checks that what the
applier would install in its place behaves fixed: a sync to a commit from before the fix, or
a scaffold whose replacement is still the template, would install a silent no-op. Here the
entry's sniff runs on stand-in targets: each is the live resolved target (its module, its
class), with ``original`` replaced by what the applier installs there, undecorated (the
sniffs unwrap a decorated original and call its body).

In the default mode the first target's replacement is the vendored function wrapped in the
entry's local changes (``vendored.replacement_functions``, which the applier uses too).
Sniffs give the function they call private globals (``private_globals.with_globals``: a
recording kernel in place of the real one); a copy of the outer local-change wrapper would
not pass those on to the vendored function it closes over. So the stand-in is a small
trampoline: a private copy of it carries the sniff's globals, and each call wraps a copy of
the vendored function given those globals in the local changes, then calls that. The
vendored function then sees exactly what it sees when the sniff runs on it alone.
"""

import builtins
import contextlib
import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .local_changes import wrap_all
from .model import BackportSpec, SniffResult
from .private_globals import with_globals
from .targets import ResolvedTarget, resolve_target
from .vendored import replacement_functions

__all__ = ["folder_name", "sniff_replacement"]


def folder_name(spec: BackportSpec) -> str:
    """``vendor/<folder>``, as a person finds the entry's vendored code."""
    return f"vendor/{spec.vendored.package.rpartition('.')[2]}"


def sniff_replacement(
    spec: BackportSpec,
    vendored_module: types.ModuleType,
    *,
    upstream_only: bool,
    targets: Sequence[ResolvedTarget] | None = None,
) -> SniffResult:
    """The entry's sniff on what the applier would install from ``vendored_module``.

    ``upstream_only``: the vendored functions alone; else the first composed with the
    entry's local changes, as the default mode installs it. ``targets``: the resolved live
    targets in catalog order (default: resolved here, importing their modules). Never
    raises: an exception (from resolving, building or the sniff) is "not shown fixed", named
    in the summary; ``detail["unfinished"]`` says it was ``NotImplementedError`` (a
    scaffold's template).
    """
    try:
        resolved = tuple(targets) if targets is not None else _resolve(spec)
        stand_ins = _stand_ins(spec, vendored_module, resolved, upstream_only)
        result = spec.sniff(stand_ins)
        if not isinstance(result, SniffResult):
            raise TypeError(f"the sniff returned {type(result).__name__}, not a SniffResult")
    except Exception as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raised = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
        detail = {"raised": raised, "unfinished": isinstance(exc, NotImplementedError)}
        return SniffResult(False, f"the sniff raised {raised}", detail)
    return result


def _resolve(spec: BackportSpec) -> tuple[ResolvedTarget, ...]:
    return tuple(resolve_target(target, spec.id) for target in spec.targets)


def _stand_ins(
    spec: BackportSpec,
    module: types.ModuleType,
    targets: tuple[ResolvedTarget, ...],
    upstream_only: bool,
) -> tuple[ResolvedTarget, ...]:
    """Each live target with ``original`` the undecorated replacement the applier makes."""
    functions = replacement_functions(spec, module, targets[0].module_name, upstream_only=True)
    if not upstream_only and spec.local_changes:
        functions[0] = _sniffable_composition(functions[0], spec)
    return tuple(
        replace(target, original=function, installed=None, foreign=None, decorated=False)
        for target, function in zip(targets, functions, strict=True)
    )


def _trampoline(*args: Any, **kwargs: Any) -> Any:
    # Runs with the globals _sniffable_composition gives it (or a sniff's private copy of
    # them): ``_call`` is defined there, never in this module.
    return _call(globals(), args, kwargs)  # type: ignore[name-defined]  # noqa: F821


def _sniffable_composition(vendored: Callable[..., Any], spec: BackportSpec) -> Any:
    """The vendored function in the local changes, as a function whose private globals (a
    sniff's ``with_globals``) reach the vendored function inside."""
    composed = wrap_all(vendored, spec.local_changes)  # built once here: it must build
    own: dict[str, Any] = {"__builtins__": builtins}

    def call(namespace: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        overrides = {name: value for name, value in namespace.items() if name not in own}
        inner = with_globals(vendored, overrides) if overrides else vendored
        return wrap_all(inner, spec.local_changes)(*args, **kwargs)

    own["_call"] = call
    stand_in = types.FunctionType(_trampoline.__code__, own, getattr(composed, "__name__", None))
    stand_in.__qualname__ = getattr(composed, "__qualname__", stand_in.__name__)
    stand_in.__doc__ = getattr(composed, "__doc__", None)
    # A callable without a signature leaves the trampoline's (*args, **kwargs).
    with contextlib.suppress(TypeError, ValueError):
        stand_in.__signature__ = inspect.signature(composed)  # type: ignore[attr-defined]
    return stand_in
