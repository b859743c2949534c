"""Install and uninstall one replacement function: every binding of the original, or none."""

import sys
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .targets import ResolvedTarget

__all__ = ["Installation", "install", "installed", "lock", "uninstall"]

# Guards installs, uninstalls and the probe's temporary kernel swap: one at a time.
_LOCK = threading.RLock()
_INSTALLED: dict[str, "Installation"] = {}


def lock() -> threading.RLock:
    return _LOCK


@dataclass(frozen=True)
class Installation:
    """What was rebound: ``sites`` are (module name, attribute) pairs that held the original."""

    backport_id: str
    target: ResolvedTarget
    replacement: Callable[..., Any]
    sites: tuple[tuple[str, str], ...]


def installed(backport_id: str) -> Installation | None:
    return _INSTALLED.get(backport_id)


def _copy_function(
    vendored: Callable[..., Any],
    backport_id: str,
    original: Callable[..., Any],
    markers: dict[str, Any],
) -> Callable[..., Any]:
    """A fresh function object, so markers never land on the vendored module's own function."""
    if not isinstance(vendored, types.FunctionType):
        raise TypeError(f"vendored replacement is {type(vendored).__name__}, not a function")
    copy = types.FunctionType(
        vendored.__code__,
        vendored.__globals__,
        vendored.__name__,
        vendored.__defaults__,
        vendored.__closure__,
    )
    copy.__kwdefaults__ = vendored.__kwdefaults__
    copy.__doc__ = vendored.__doc__
    copy.__qualname__ = vendored.__qualname__
    copy.__module__ = vendored.__module__
    copy.__annotations__ = dict(vendored.__annotations__)
    copy.__dict__.update(vendored.__dict__)
    copy.__dict__.update(markers)
    copy.__backport__ = backport_id  # type: ignore[attr-defined]
    copy.__wrapped__ = original  # type: ignore[attr-defined]
    return copy


def _bindings_of(obj: object) -> Iterator[tuple[str, str]]:
    """Every (module, attribute) in ``sys.modules`` bound to ``obj`` (aliases included)."""
    for module_name, module in list(sys.modules.items()):
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for attribute, value in list(namespace.items()):
            if value is obj:
                yield module_name, attribute


def _rebind(sites: tuple[tuple[str, str], ...], old: object, new: object) -> None:
    done: list[tuple[str, str]] = []
    try:
        for module_name, attribute in sites:
            module = sys.modules.get(module_name)
            if module is not None and vars(module).get(attribute) is old:
                setattr(module, attribute, new)
                done.append((module_name, attribute))
    except BaseException:
        # Nothing half-patched: put back what this call already changed.
        for module_name, attribute in done:
            setattr(sys.modules[module_name], attribute, old)
        raise


def install(
    backport_id: str,
    target: ResolvedTarget,
    vendored: Callable[..., Any],
    markers: dict[str, Any] | None = None,
) -> tuple[Installation, bool]:
    """Rebind the original everywhere; returns (installation, whether this call installed).

    ``markers`` are set as attributes on the installed copy, beside ``__backport__``.
    """
    with _LOCK:
        existing = _INSTALLED.get(backport_id)
        if existing is not None:
            return existing, False
        replacement = _copy_function(vendored, backport_id, target.original, markers or {})
        defining_site = (target.module_name, target.attribute)
        sites = tuple(dict.fromkeys([defining_site, *_bindings_of(target.original)]))
        if vars(target.module).get(defining_site[1]) is not target.original:
            raise LookupError(f"{target.module_name}.{defining_site[1]} is not the original")
        _rebind(sites, target.original, replacement)
        installation = Installation(backport_id, target, replacement, sites)
        _INSTALLED[backport_id] = installation
        return installation, True


def uninstall(backport_id: str) -> Installation | None:
    """Put the original back wherever our replacement still stands; None if not installed."""
    with _LOCK:
        installation = _INSTALLED.pop(backport_id, None)
        if installation is not None:
            late_aliases = _bindings_of(installation.replacement)
            sites = tuple(dict.fromkeys([*installation.sites, *late_aliases]))
            _rebind(sites, installation.replacement, installation.target.original)
        return installation
