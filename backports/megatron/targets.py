"""Find the function a backport patches: the module that defines it, and the original."""

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .catalog import Target

__all__ = ["ResolvedTarget", "TargetMissing", "find_loaded_target", "resolve_target"]


class TargetMissing(LookupError):
    """No candidate module defines the target function."""


@dataclass(frozen=True)
class ResolvedTarget:
    """``module`` defines ``original``; ``installed`` is our replacement if one is live."""

    imported_as: str
    module: ModuleType
    attribute: str
    original: Callable[..., Any]
    installed: Callable[..., Any] | None
    # Why ``original`` is someone else's replacement rather than the module's own function
    # (a wrapper, or code from another file), or None.
    foreign: str | None = None

    @property
    def module_name(self) -> str:
        return self.module.__name__


def _is_missing_module(exc: ModuleNotFoundError, name: str) -> bool:
    """True when ``name`` itself (or a parent) is absent, not something it imports."""
    return exc.name is not None and (name == exc.name or name.startswith(exc.name + "."))


def _unwrap(function: Callable[..., Any], backport_id: str) -> tuple[Any, Any]:
    if getattr(function, "__backport__", None) == backport_id:
        return function.__wrapped__, function  # type: ignore[attr-defined]
    return function, None


def _source_file(path: str | None) -> str | None:
    return os.path.realpath(path) if path else None


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


def _resolve_in(module: ModuleType, target: Target, backport_id: str) -> ResolvedTarget | None:
    # getattr, not vars(): a PEP 562 forwarder hands out the function of the new module.
    function = getattr(module, target.attribute, None)
    if function is None:
        return None
    original, installed = _unwrap(function, backport_id)
    if not inspect.isfunction(original):
        raise TypeError(f"{module.__name__}.{target.attribute} is {type(original).__name__}")
    # Rebind where the function lives, never on a forwarder; fall back to the module we
    # found it in only when the defining module does not hold it under this name.
    defining = sys.modules.get(original.__module__) or module
    bound = vars(defining).get(target.attribute)
    if bound is None or (bound is not original and bound is not installed):
        defining = module
    return ResolvedTarget(
        module.__name__,
        defining,
        target.attribute,
        original,
        installed,
        _foreign(original, defining),
    )


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
    """Import the candidate modules in order until one provides the target function."""
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
