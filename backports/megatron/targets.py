"""Find what a backport patches: the module (and class) that defines it, and the original."""

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from .model import ResolvedTarget, Target

__all__ = [
    "ResolvedTarget",
    "TargetMissing",
    "all_loaded",
    "compiled_body",
    "find_loaded_target",
    "live_decorator",
    "resolve_target",
]


class TargetMissing(LookupError):
    """No candidate module defines the target function or method."""


def _is_missing_module(exc: ModuleNotFoundError, name: str) -> bool:
    """True when ``name`` itself (or a parent) is absent, not something it imports."""
    return exc.name is not None and (name == exc.name or name.startswith(exc.name + "."))


def _unwrap(function: Callable[..., Any], backport_id: str) -> tuple[Any, Any]:
    if getattr(function, "__backport__", None) == backport_id:
        return function.__wrapped__, function  # type: ignore[attr-defined]
    return function, None


def _source_file(path: str | None) -> str | None:
    return os.path.realpath(path) if path else None


def compiled_body(obj: object) -> Any:
    """The function torch.compile wrapped, when ``obj`` is its wrapper; else None.

    torch.compile's wrapper carries the body both as ``_torchdynamo_orig_callable`` and as
    ``__wrapped__``; a third party's ``functools.wraps`` around it copies the first but sets
    its own ``__wrapped__``, so it is not mistaken for the decorator.
    """
    body = getattr(obj, "_torchdynamo_orig_callable", None)
    if body is not None and getattr(obj, "__wrapped__", None) is body:
        return body
    return None


def _foreign(original: Callable[..., Any], defining: ModuleType) -> str | None:
    """Why ``original`` is not the defining module's own function, or None.

    Another patch in place shows as a wrapper (``__wrapped__``, as ``functools.wraps``
    leaves it) or as code compiled from another file than the module's source.
    """
    name = f"{getattr(original, '__module__', '?')}.{getattr(original, '__qualname__', '?')}"
    wrapped = getattr(original, "__wrapped__", None)
    if wrapped is not None:
        # functools.wraps copies the wrapped function's names: its code says who it is.
        code = getattr(original, "__code__", None)
        who = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})" if code else name
        return f"already wrapped by another patch: {who} wraps {name}"
    module_file = getattr(defining, "__file__", None)
    if not module_file or not module_file.endswith(".py"):
        return None  # no source to compare with (a sourceless or built-in module)
    code_file = original.__code__.co_filename
    if _source_file(code_file) != _source_file(module_file):
        return f"already replaced by another patch: {name} is defined in {code_file}"
    return None


def _function_of(obj: Any) -> Any:
    """The function a class holds: a staticmethod's own, else ``obj``."""
    return obj.__func__ if isinstance(obj, staticmethod) else obj


def _probe(*args: Any, **kwargs: Any) -> None:
    """What ``_declared_body`` decorates to learn the shape of a decorator's wrapper."""


def _declared_body(function: Any, decorator: str) -> Any:
    """The function ``function`` wraps, when it is the declared decorator's wrapper (a
    ``functools.wraps`` closure such as ``torch.no_grad``'s or ``custom_bwd``'s): its code
    is the very code that decorator gives every function it wraps. Else None."""
    wrapped = getattr(function, "__wrapped__", None)
    if wrapped is None or not inspect.isfunction(function):
        return None
    try:
        made = live_decorator(decorator)(_probe)
    except Exception:
        return None
    return (
        inspect.unwrap(function) if getattr(made, "__code__", None) is function.__code__ else None
    )


def _body_of(
    original: Any, target: Target, where: str, owner: type | None = None
) -> tuple[Any, str | None]:
    """(the undecorated body when ``original`` is the declared decorator's wrapper, else
    None; why it cannot be patched, or None). A staticmethod of an ``autograd.Function``
    (its ``forward`` / ``backward``, which torch only reads off the class) is judged by its
    function: the replacement installed there is a plain function, as the class reads it."""
    function = _function_of(original)
    body = compiled_body(function)
    if body is not None and target.decorator is None:
        return None, "compiled by torch.compile, but the catalog entry declares no decorator"
    if body is None and target.decorator is not None:
        body = _declared_body(function, target.decorator)
    if not inspect.isfunction(body or function):
        raise TypeError(f"{where} is {type(original).__name__}")
    if function is not original and not _is_autograd_function(owner):
        raise TypeError(f"{where} is a staticmethod outside an autograd.Function")
    return body, None


def _is_autograd_function(owner: type | None) -> bool:
    return any(
        c.__name__ == "Function" and c.__module__ == "torch.autograd.function"
        for c in getattr(owner, "__mro__", ())
    )


def _resolve_function(
    module: ModuleType, target: Target, backport_id: str
) -> ResolvedTarget | None:
    # getattr, not vars(): a PEP 562 forwarder hands out the function of the new module.
    function = getattr(module, target.attribute, None)
    if function is None:
        return None
    original, installed = _unwrap(function, backport_id)
    # Rebind where the function lives, never on a forwarder; fall back to the module we
    # found it in only when the defining module does not hold it under this name.
    defining = sys.modules.get(original.__module__) or module
    bound = vars(defining).get(target.attribute)
    if bound is None or (bound is not original and bound is not installed):
        defining = module
    return _resolved(module, target, original, installed, defining)


def _resolve_method(module: ModuleType, target: Target, backport_id: str) -> ResolvedTarget | None:
    owner_name = target.owner_name
    assert owner_name is not None
    owner = getattr(module, owner_name, None)
    if not isinstance(owner, type) or target.name not in vars(owner):
        return None  # no such class, or the method is inherited: not defined here
    # vars(), not getattr(): the exact object in the class dict is what revert puts back.
    original, installed = _unwrap(vars(owner)[target.name], backport_id)
    defining = sys.modules.get(owner.__module__) or module
    if getattr(defining, owner_name, None) is not owner:
        defining = module
    return _resolved(module, target, original, installed, defining, owner)


def _resolved(
    module: ModuleType,
    target: Target,
    original: Any,
    installed: Any,
    defining: ModuleType,
    owner: type | None = None,
) -> ResolvedTarget:
    """The target as found in ``module``: its body checked, and whether it is foreign."""
    body, refused = _body_of(original, target, f"{module.__name__}.{target.attribute}", owner)
    return ResolvedTarget(
        module.__name__,
        defining,
        target.attribute,
        original,
        installed,
        refused or _foreign(body or _function_of(original), defining),
        owner,
        decorated=body is not None,
    )


def _resolve_in(module: ModuleType, target: Target, backport_id: str) -> ResolvedTarget | None:
    if target.owner_name is None:
        return _resolve_function(module, target, backport_id)
    return _resolve_method(module, target, backport_id)


def find_loaded_target(target: Target, backport_id: str) -> ResolvedTarget | None:
    """The target among modules already imported, importing nothing."""
    for name in target.modules:
        module = sys.modules.get(name)
        if module is not None:
            found = _resolve_in(module, target, backport_id)
            if found is not None:
                return found
    return None


def resolve_target(target: Target, backport_id: str) -> ResolvedTarget:
    """Import the candidate modules in order until one provides the target."""
    tried: list[str] = []
    for name in target.modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not _is_missing_module(exc, name):
                raise
            tried.append(f"{name} (no such module)")
            continue
        found = _resolve_in(module, target, backport_id)
        if found is not None:
            return found
        tried.append(f"{name} (no {target.attribute})")
    raise TargetMissing("; ".join(tried))


def all_loaded(targets: Sequence[Target], backport_id: str) -> bool:
    """Whether every target is defined by a module already imported (importing nothing)."""
    return all(find_loaded_target(target, backport_id) is not None for target in targets)


def live_decorator(path: str) -> Callable[..., Any]:
    """The decorator named "module:name", read now: megatron may switch it at run time
    (``megatron.core.jit`` rebinds ``jit_fuser``)."""
    module_name, _, name = path.partition(":")
    decorator = getattr(importlib.import_module(module_name), name)
    if not callable(decorator):
        raise TypeError(f"decorator {path} is {type(decorator).__name__}, not callable")
    return decorator  # type: ignore[no-any-return]
