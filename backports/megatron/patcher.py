"""Install and uninstall one backport's replacements: every binding of every target, or none."""

import logging
import sys
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .targets import ResolvedTarget

__all__ = [
    "Installation",
    "Part",
    "Replacement",
    "Request",
    "install",
    "install_all",
    "installed",
    "lock",
    "uninstall",
]

# Guards installs and uninstalls (and apply's probe-then-install): one at a time.
_LOCK = threading.RLock()
_INSTALLED: dict[str, "Installation"] = {}
# Installations whose module was reloaded or re-imported: aliases elsewhere may still hold
# their replacement, and uninstall puts those back too.
_STALE: dict[str, list["Installation"]] = {}
_LOG = logging.getLogger("backports.megatron")

Site = tuple[str, str]


def lock() -> threading.RLock:
    return _LOCK


@dataclass(frozen=True)
class Replacement:
    """What to put in place of one resolved target.

    ``decorator`` is the live decorator the original carries (``target.decorated``): the
    vendored body is decorated with it, and a plain shim calling the result is installed.
    """

    target: ResolvedTarget
    vendored: Callable[..., Any]
    decorator: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Part:
    """One target as installed. ``sites`` are the (module name, attribute) pairs that held
    the original function; a method's one site is (module name, "Class.method")."""

    target: ResolvedTarget
    replacement: Callable[..., Any]
    sites: tuple[Site, ...]


@dataclass(frozen=True)
class Installation:
    """Every target of one backport, installed together."""

    backport_id: str
    parts: tuple[Part, ...]

    @property
    def target(self) -> ResolvedTarget:
        return self.parts[0].target

    @property
    def replacement(self) -> Callable[..., Any]:
        return self.parts[0].replacement

    @property
    def sites(self) -> tuple[Site, ...]:
        return tuple(site for part in self.parts for site in part.sites)


def _part_is_live(part: Part) -> bool:
    """Whether the replacement still stands where the target is defined, in the module
    object ``sys.modules`` holds now (a reload re-executes the module and rebinds the
    original; a fresh import makes a new module object)."""
    target = part.target
    module = sys.modules.get(target.module_name)
    if module is not target.module:
        return False
    try:
        owner_name = target.attribute.rpartition(".")[0]
        if target.is_method and getattr(module, owner_name, None) is not target.owner:
            return False
        return vars(target.owner).get(target.name) is part.replacement
    except Exception:
        return False


def _holds(site: Site, obj: object) -> bool:
    module = sys.modules.get(site[0])
    namespace = _live(module) if module is not None else None
    return namespace is not None and namespace.get(site[1]) is obj


def installed(backport_id: str) -> Installation | None:
    """The live installation of ``backport_id``, or None.

    One that no longer stands everywhere (reloaded or re-imported module, or rebound by
    someone else) is never reported: it moves to the stale list, which ``uninstall`` and
    the next ``install`` still clean.
    """
    with _LOCK:
        installation = _INSTALLED.get(backport_id)
        if installation is None:
            return None
        dead = [part for part in installation.parts if not _part_is_live(part)]
        if not dead:
            return installation
        del _INSTALLED[backport_id]
        _STALE.setdefault(backport_id, []).append(installation)
        _LOG.info(
            "%s is no longer bound at %s.%s (module reloaded, re-imported or rebound)",
            backport_id,
            dead[0].target.module_name,
            dead[0].target.attribute,
        )
        return None


def _copy_function(vendored: Callable[..., Any]) -> types.FunctionType:
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
    return copy


def _shim(body: Callable[..., Any], like: types.FunctionType) -> types.FunctionType:
    """A plain function calling ``body`` (a decorator's wrapper): markers set on it never
    overwrite the ``__wrapped__`` that torch.compile keeps on its own wrapper."""

    def shim(*args: Any, **kwargs: Any) -> Any:
        return body(*args, **kwargs)

    shim.__name__, shim.__qualname__ = like.__name__, like.__qualname__
    shim.__module__, shim.__doc__ = like.__module__, like.__doc__
    shim.__backport_body__ = body  # type: ignore[attr-defined]
    assert isinstance(shim, types.FunctionType)
    return shim


def _make(
    replacement: Replacement, backport_id: str, markers: dict[str, Any]
) -> Callable[..., Any]:
    """The object to install: a marked copy of the vendored function, or, for a decorated
    original, a marked shim around the live decorator applied to such a copy."""
    made = _copy_function(replacement.vendored)
    if replacement.target.decorated:
        if replacement.decorator is None:
            raise TypeError(f"{replacement.target.attribute} is decorated: no decorator given")
        made = _shim(replacement.decorator(made), made)
    made.__dict__.update(markers)
    made.__backport__ = backport_id  # type: ignore[attr-defined]
    made.__wrapped__ = replacement.target.original  # type: ignore[attr-defined]
    return made


def _live(module: object) -> dict[str, Any] | None:
    """A module's own dict, or None for an entry that cannot be read (a None placeholder, a
    module whose ``__dict__`` raises, a lazy module that fails): never our error."""
    try:
        namespace = vars(module)
        return namespace if isinstance(namespace, dict) else None
    except Exception as exc:
        _LOG.debug("skipping %r while looking for aliases: %r", module, exc)
        return None


def _matches(namespace: dict[str, Any], wanted: list[object]) -> list[tuple[str, object]]:
    """The (attribute, value) pairs of ``namespace`` whose value is one of ``wanted`` (one
    to four objects). By identity only: no value's ``__eq__`` or ``__hash__`` runs, and not
    even its type is looked at (a pointer comparison per value keeps a scan of ~128,000
    globals at ~5 ms). Spelled out per count: each ``is`` more costs a scan ~0.6 ms."""
    items = namespace.items()
    if len(wanted) == 1:
        (a,) = wanted
        return [(name, value) for name, value in items if value is a]
    if len(wanted) == 2:
        a, b = wanted
        return [(name, value) for name, value in items if value is a or value is b]
    a, b, c, d = (wanted * 2)[:4]  # three: the first stands in for the fourth
    return [
        (name, value)
        for name, value in items
        if value is a or value is b or value is c or value is d
    ]


def _bindings_of_each(objs: Sequence[object]) -> dict[int, list[Site]]:
    """Every (module, attribute) in ``sys.modules`` but ``__main__`` bound to each of ``objs``
    (aliases included), by ``id``. One pass over every module's globals per four objects: with torch
    and megatron loaded a pass reads ~128,000 of them (~5-8 ms)."""
    found: dict[int, list[Site]] = {id(obj): [] for obj in objs}
    distinct = list({id(obj): obj for obj in objs}.values())
    for start in range(0, len(distinct), 4):
        wanted = distinct[start : start + 4]
        main = sys.modules.get("__main__")
        for module_name, module in list(sys.modules.items()):
            if module is main:  # under any name (``python -m pytest``: pytest.__main__ too)
                # The user's script: its names are its own (it may keep the original to
                # compare against). A target defined there is rebound as its defining site.
                continue
            namespace = _live(module)
            if namespace is None:
                continue
            try:
                matches = _matches(namespace, wanted)
            except RuntimeError:  # another thread changed its size under us: read a copy
                matches = _matches(dict(namespace), wanted)
            for attribute, value in matches:
                found[id(value)].append((module_name, attribute))
    return found


def _rebind(sites: tuple[Site, ...], old: object, new: object, required: Site) -> None:
    """Rebind every site that still holds ``old``. A site that refuses (a read-only module)
    is skipped with a DEBUG line, unless it is ``required`` (the defining module): then
    everything this call changed is put back and the error propagates."""
    done: list[Site] = []
    try:
        for module_name, attribute in sites:
            module = sys.modules.get(module_name)
            namespace = _live(module) if module is not None else None
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


def _olds(target: ResolvedTarget) -> list[object]:
    """What may stand at a target now: the original, or our replacement of an installation
    whose other target was reloaded (stale); either gives way to the new replacement."""
    return [target.original, *([target.installed] if target.installed is not None else [])]


def _aliased_olds(target: ResolvedTarget) -> list[object]:
    """The olds to look for in every module: a method's one site is its class."""
    return [] if target.is_method else _olds(target)


def _install_part(
    target: ResolvedTarget, replacement: Callable[..., Any], aliases: dict[int, list[Site]]
) -> Part:
    """Rebind every site of the target's olds (``aliases``: where each was bound)."""
    olds = _olds(target)
    bound = vars(target.owner).get(target.name)
    if not any(bound is old for old in olds):
        raise LookupError(f"{target.module_name}.{target.attribute} is not the original")
    if target.is_method:
        # A class attribute: no module aliases; set on the class that defines it only.
        setattr(target.owner, target.name, replacement)
        return Part(target, replacement, ((target.module_name, target.attribute),))
    defining_site = (target.module_name, target.attribute)
    sites: tuple[Site, ...] = ()
    try:
        for old in olds:
            found = tuple(dict.fromkeys([defining_site, *aliases.get(id(old), ())]))
            _rebind(found, old, replacement, required=defining_site)
            sites += found
    except BaseException:
        _rebind(sites, replacement, target.original, required=defining_site)
        raise
    rebound = tuple(site for site in dict.fromkeys(sites) if _holds(site, replacement))
    return Part(target, replacement, rebound)


# One backport to install: its id, its replacements, and the markers set on each.
Request = tuple[str, Sequence[Replacement], dict[str, Any] | None]
# A target and the object made to stand in its place.
Made = tuple[ResolvedTarget, Callable[..., Any]]


def install(
    backport_id: str,
    replacements: Sequence[Replacement] | ResolvedTarget,
    vendored: Callable[..., Any] | None = None,
    markers: dict[str, Any] | None = None,
) -> tuple[Installation, bool]:
    """Install every replacement, or none; returns (installation, whether this call
    installed). ``install(id, target, vendored)`` installs one undecorated function.

    ``markers`` are set as attributes on each installed object, beside ``__backport__``.
    """
    if isinstance(replacements, ResolvedTarget):
        assert vendored is not None, "install(id, target, vendored)"
        replacements = [Replacement(replacements, vendored)]
    (outcome,) = install_all([(backport_id, replacements, markers)])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def install_all(requests: Sequence[Request]) -> list[tuple[Installation, bool] | Exception]:
    """``install`` for several backports, each all or none, with one scan for aliases for
    them all (a scan reads every module's globals). Per request: ``install``'s result,
    or the exception that left that backport uninstalled."""
    with _LOCK:
        outcomes: dict[int, tuple[Installation, bool] | Exception] = {}
        made: dict[int, list[Made]] = {}
        for index, (backport_id, replacements, markers) in enumerate(requests):
            existing = installed(backport_id)
            if existing is not None:
                outcomes[index] = (existing, False)
                continue
            try:
                made[index] = [
                    (r.target, _make(r, backport_id, markers or {})) for r in replacements
                ]
            except Exception as exc:
                outcomes[index] = exc
        # Scanned after every _make (a live decorator may import modules): between this
        # scan and the last install only the rebinding runs (setattr on modules).
        olds = [
            old for pairs in made.values() for target, _ in pairs for old in _aliased_olds(target)
        ]
        try:
            aliases = _bindings_of_each(olds)
        except Exception as exc:  # nothing rebound yet: each made request failed with it
            outcomes.update((index, exc) for index in made)
            made = {}
        for index, pairs in made.items():
            try:
                outcomes[index] = (_install_parts(requests[index][0], pairs, aliases), True)
            except Exception as exc:
                outcomes[index] = exc
        return [outcomes[index] for index in range(len(requests))]


def _install_parts(
    backport_id: str, made: list[Made], aliases: dict[int, list[Site]]
) -> Installation:
    parts: list[Part] = []
    try:
        for target, replacement in made:
            parts.append(_install_part(target, replacement, aliases))
    except BaseException:
        for part in reversed(parts):  # all or none
            _uninstall_part(part)
        raise
    installation = Installation(backport_id, tuple(parts))
    _INSTALLED[backport_id] = installation
    return installation


def uninstall(backport_id: str) -> Installation | None:
    """Put every original back wherever our replacements still stand; None if not installed.

    Stale installations (a module reloaded or re-imported) are undone too, wherever
    their replacements are still bound, so that nothing of ours is left behind.
    """
    with _LOCK:
        live = installed(backport_id)
        _INSTALLED.pop(backport_id, None)
        for installation in [*_STALE.pop(backport_id, []), *([live] if live else [])]:
            for part in reversed(installation.parts):
                _uninstall_part(part)
        return live


def _uninstall_part(part: Part) -> None:
    target = part.target
    if not target.is_method:
        late_aliases = _bindings_of_each([part.replacement])[id(part.replacement)]
        sites = tuple(dict.fromkeys([*part.sites, *late_aliases]))
        _rebind(sites, part.replacement, target.original, (target.module_name, target.name))
    # The object patched at install time, even when ``sys.modules`` now holds a fresh
    # import under its name (code that kept a reference still calls into it).
    namespace = vars(target.owner) if target.is_method else _live(target.owner)
    if namespace is not None and namespace.get(target.name) is part.replacement:
        setattr(target.owner, target.name, target.original)
