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

import ast
import builtins
import contextlib
import inspect
import textwrap
import types
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .local_changes import wrap_all
from .model import BackportSpec, SniffResult
from .private_globals import with_globals
from .targets import ResolvedTarget, resolve_target
from .vendored import replacement_functions

__all__ = ["UPSTREAM_ONLY", "WITH_LOCAL_CHANGES", "folder_name", "mode_name", "sniff_replacement"]

UPSTREAM_ONLY = "upstream-only"  # the two modes an installed backport runs in
WITH_LOCAL_CHANGES = "local-changes"


def mode_name(upstream_only: bool) -> str:
    return UPSTREAM_ONLY if upstream_only else WITH_LOCAL_CHANGES


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
    in the summary. ``detail["unfinished"]``: a replacement is a stub (its body only raises
    ``NotImplementedError``, as ``backports new`` leaves it; the sniff is not run), or the
    sniff raised ``NotImplementedError``.
    """
    try:
        if spec.guard is not None:
            # An import guard: the module imported under the vendored guard (no local
            # changes, one mode); a GuardTarget stands where a ResolvedTarget would.
            from .import_guards import GuardTarget

            guard = getattr(vendored_module, spec.guard.replacement_name)
            return _sniffed(spec, [GuardTarget(spec.guard.modules[0], guard)])
        resolved = tuple(targets) if targets is not None else _resolve(spec)
        functions = replacement_functions(
            spec, vendored_module, resolved[0].module_name, upstream_only=True
        )
        stub = next((function for function in functions if _is_stub(function)), None)
        if stub is not None:
            # Known without running it, even by a sniff that catches what it calls raises.
            name = getattr(stub, "__qualname__", repr(stub))
            summary = f"{name} is a stub: its body only raises NotImplementedError"
            return SniffResult(False, summary, {"stub": name, "unfinished": True})
        return _sniffed(spec, _stand_ins(spec, functions, resolved, upstream_only))
    except Exception as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raised = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
        detail = {"raised": raised, "unfinished": isinstance(exc, NotImplementedError)}
        return SniffResult(False, f"the sniff raised {raised}", detail)


def _sniffed(spec: BackportSpec, stand_ins: Sequence[Any]) -> SniffResult:
    """The entry's sniff on ``stand_ins``; what is no ``SniffResult`` is the sniff's error."""
    result = spec.sniff(stand_ins)
    if not isinstance(result, SniffResult):
        raise TypeError(f"the sniff returned {type(result).__name__}, not a SniffResult")
    return result


def _resolve(spec: BackportSpec) -> tuple[ResolvedTarget, ...]:
    return tuple(resolve_target(target, spec.id) for target in spec.targets)


def _is_stub(function: Callable[..., Any]) -> bool:
    """Whether ``function``'s body (past a docstring) is one ``raise NotImplementedError``,
    as ``backports new`` writes the replacement it leaves to the author."""
    code = getattr(function, "__code__", None)
    if code is None or "NotImplementedError" not in code.co_names:
        return False  # the common case, decided without reading the source
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    definition = tree.body[0] if tree.body else None
    if not isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def _stand_ins(
    spec: BackportSpec,
    functions: list[Callable[..., Any]],
    targets: tuple[ResolvedTarget, ...],
    upstream_only: bool,
) -> tuple[ResolvedTarget, ...]:
    """Each live target with ``original`` the undecorated replacement the applier makes
    (``functions``: the vendored ones alone, in catalog order)."""
    functions = list(functions)
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
