"""Install and uninstall one replacement function: every binding of the original, or none."""

import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .targets import ResolvedTarget

__all__ = ["Installation", "install", "installed", "lock", "uninstall"]

# Guards installs and uninstalls (and apply's probe-then-install): one at a time.
_LOCK = threading.RLock()
_INSTALLED: dict[str, "Installation"] = {}
# Installations whose module was reloaded or re-imported: aliases elsewhere may still hold
# their replacement, and uninstall puts those back too.
_STALE: dict[str, list["Installation"]] = {}
_LOG = logging.getLogger("backports.megatron")


def lock() -> threading.RLock:
    return _LOCK


@dataclass(frozen=True)
class Installation:
    """What was rebound: ``sites`` are (module name, attribute) pairs that held the original."""

    backport_id: str
    target: ResolvedTarget
    replacement: Callable[..., Any]
    sites: tuple[tuple[str, str], ...]


def _is_live(installation: Installation) -> bool:
    """Whether the replacement still stands where the target is defined, in the module
    object ``sys.modules`` holds now (a reload re-executes the module and rebinds the
    original; a fresh import makes a new module object)."""
    module = sys.modules.get(installation.target.module_name)
    if module is not installation.target.module:
        return False
    try:
        return vars(module).get(installation.target.attribute) is installation.replacement
    except Exception:
        return False


def _holds(site: tuple[str, str], obj: object) -> bool:
    module = sys.modules.get(site[0])
    namespace = _namespace(module) if module is not None else None
    return namespace is not None and namespace.get(site[1]) is obj


def installed(backport_id: str) -> Installation | None:
    """The live installation of ``backport_id``, or None.

    One that no longer stands (reloaded or re-imported module, or rebound by someone
    else) is never reported: it moves to the stale list, which ``uninstall`` still cleans.
    """
    with _LOCK:
        installation = _INSTALLED.get(backport_id)
        if installation is None or _is_live(installation):
            return installation
        del _INSTALLED[backport_id]
        _STALE.setdefault(backport_id, []).append(installation)
        _LOG.info(
            "%s is no longer bound at %s.%s (module reloaded, re-imported or rebound)",
            backport_id,
            installation.target.module_name,
            installation.target.attribute,
        )
        return None


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


def _namespace(module: object) -> dict[str, Any] | None:
    """A module's dict, or None for an entry that cannot be read (a None placeholder, a
    module whose ``__dict__`` raises, a lazy module that fails): never our error."""
    try:
        namespace = vars(module)
        return dict(namespace) if isinstance(namespace, dict) else None
    except Exception as exc:
        _LOG.debug("skipping %r while looking for aliases: %r", module, exc)
        return None


def _bindings_of(obj: object) -> Iterator[tuple[str, str]]:
    """Every (module, attribute) in ``sys.modules`` bound to ``obj`` (aliases included)."""
    for module_name, module in list(sys.modules.items()):
        namespace = _namespace(module)
        for attribute, value in (namespace or {}).items():
            if value is obj:
                yield module_name, attribute


def _rebind(
    sites: tuple[tuple[str, str], ...], old: object, new: object, required: tuple[str, str]
) -> None:
    """Rebind every site that still holds ``old``. A site that refuses (a read-only module)
    is skipped with a DEBUG line, unless it is ``required`` (the defining module): then
    everything this call changed is put back and the error propagates."""
    done: list[tuple[str, str]] = []
    try:
        for module_name, attribute in sites:
            module = sys.modules.get(module_name)
            namespace = _namespace(module) if module is not None else None
            if namespace is None or namespace.get(attribute) is not old:
                continue
            try:
                setattr(module, attribute, new)
            except Exception as exc:
                if (module_name, attribute) == required:
                    raise
                _LOG.debug("skipping alias %s.%s: %r", module_name, attribute, exc)
                continue
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
        existing = installed(backport_id)
        if existing is not None:
            return existing, False
        replacement = _copy_function(vendored, backport_id, target.original, markers or {})
        defining_site = (target.module_name, target.attribute)
        sites = tuple(dict.fromkeys([defining_site, *_bindings_of(target.original)]))
        if vars(target.module).get(defining_site[1]) is not target.original:
            raise LookupError(f"{target.module_name}.{defining_site[1]} is not the original")
        _rebind(sites, target.original, replacement, required=defining_site)
        rebound = tuple(site for site in sites if _holds(site, replacement))
        installation = Installation(backport_id, target, replacement, rebound)
        _INSTALLED[backport_id] = installation
        return installation, True


def uninstall(backport_id: str) -> Installation | None:
    """Put the original back wherever our replacement still stands; None if not installed.

    Stale installations (their module reloaded or re-imported) are undone too, wherever
    their replacement is still bound, so that nothing of ours is left behind.
    """
    with _LOCK:
        live = installed(backport_id)
        _INSTALLED.pop(backport_id, None)
        for installation in [*_STALE.pop(backport_id, []), *([live] if live else [])]:
            late_aliases = _bindings_of(installation.replacement)
            sites = tuple(dict.fromkeys([*installation.sites, *late_aliases]))
            defining = (installation.target.module_name, installation.target.attribute)
            _rebind(sites, installation.replacement, installation.target.original, defining)
            _restore_in_module_object(installation)
        return live


def _restore_in_module_object(installation: Installation) -> None:
    """The module object patched at install time, even when ``sys.modules`` now holds a
    fresh import under its name (code that kept a reference still calls into it)."""
    module, attribute = installation.target.module, installation.target.attribute
    namespace = _namespace(module)
    if namespace is not None and namespace.get(attribute) is installation.replacement:
        setattr(module, attribute, installation.target.original)
