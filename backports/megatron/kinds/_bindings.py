"""Every module binding of an object, and rebinding them all or none.

A module-level function or object is held by its defining module and by every module that
imported it by name (``from x import f``): a replacement must stand at each of them, or a
caller going through an alias keeps the original. One scan of ``sys.modules`` finds them for
several objects at once (with torch and megatron loaded it reads ~128,000 globals: ~5-8 ms).
"""

import logging
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

_LOG = logging.getLogger(__name__)

# (module name, attribute): one place that holds an object.
Site = tuple[str, str]

# What one scan found for several objects, read by ``bindings_of_each`` inside
# ``one_scan_for``'s block (per thread).
_SCANNED = threading.local()


def live_namespace(module: object) -> dict[str, object] | None:
    """A module's own dict, or None for an entry that cannot be read (a None placeholder, a
    module whose ``__dict__`` raises, a lazy module that fails): never our error."""
    try:
        namespace = vars(module)
        return namespace if isinstance(namespace, dict) else None
    except Exception as exc:
        _LOG.debug("skipping %r while looking for aliases: %r", module, exc)
        return None


def holds(site: Site, obj: object) -> bool:
    """Whether the module named ``site[0]`` binds ``obj`` as ``site[1]`` now."""
    module = sys.modules.get(site[0])
    namespace = live_namespace(module) if module is not None else None
    return namespace is not None and namespace.get(site[1]) is obj


def _matches(
    namespace: dict[str, object], wanted: list[object], ids: frozenset[int]
) -> list[tuple[str, object]]:
    """The (attribute, value) pairs of ``namespace`` whose value is one of ``wanted``
    (``ids``: their ids, their own while the caller holds them). By identity only: no
    value's ``__eq__`` or ``__hash__`` runs, not even its type is looked at. Up to four
    objects, a pointer comparison per value and object (a scan of ~128,000 globals: ~5 ms;
    spelled out per count, as each ``is`` more costs ~0.6 ms), in passes of four up to
    ``_FEW``; more, each value's ``id`` looked up in a set (~3 times one ``is``, but one
    pass instead of one per four)."""
    items = namespace.items()
    if len(wanted) == 1:
        (a,) = wanted
        return [(name, value) for name, value in items if value is a]
    if len(wanted) == 2:
        a, b = wanted
        return [(name, value) for name, value in items if value is a or value is b]
    if len(wanted) <= 4:
        a, b, c, d = (wanted * 2)[:4]  # three: the first stands in for the fourth
        return [
            (name, value)
            for name, value in items
            if value is a or value is b or value is c or value is d
        ]
    if len(wanted) <= _FEW:  # measured: up to 12, passes of four beat the set
        return [
            pair
            for at in range(0, len(wanted), 4)
            for pair in _matches(namespace, wanted[at : at + 4], ids)
        ]
    if ids.isdisjoint(map(id, namespace.values())):  # in C: most modules hold none
        return []
    return [(name, value) for name, value in items if id(value) in ids]


# With megatron loaded (3,600 modules): 8 objects, two passes of four 54 ms, the set 100 ms;
# 45 objects, twelve passes 326 ms, the set 90 ms.
_FEW = 12


@contextmanager
def one_scan_for(objs: Iterable[object]) -> Iterator[None]:
    """Within the block, ``bindings_of_each`` of any of ``objs`` answers from one scan made
    at its start. For a revert of many parts: each looks for the aliases of its own
    replacement made since the install, and one scan for all (~0.1 s with torch and
    megatron loaded) replaces one per part (16 backports: 33). Sound while the block only
    puts originals back: no module starts to hold one of ``objs`` during it, and every
    rebinding checks that the site still holds the object before it changes it."""
    held = list(objs)  # the ids below are these objects' own while the block holds them
    previous = getattr(_SCANNED, "found", None)
    _SCANNED.found = bindings_of_each(held) if held else {}
    try:
        yield
    finally:
        _SCANNED.found = previous
        del held


def bindings_of_each(objs: Sequence[object]) -> dict[int, list[Site]]:
    """Every (module, attribute) in ``sys.modules`` but ``__main__`` bound to each of ``objs``
    (aliases included), by ``id``: one pass over every module's globals, or none inside
    ``one_scan_for``'s block for objects it scanned for."""
    scanned: dict[int, list[Site]] | None = getattr(_SCANNED, "found", None)
    if scanned is not None and all(id(obj) in scanned for obj in objs):
        return {id(obj): list(scanned[id(obj)]) for obj in objs}
    found: dict[int, list[Site]] = {id(obj): [] for obj in objs}
    if not found:
        return found
    wanted, ids = list({id(obj): obj for obj in objs}.values()), frozenset(found)
    main = sys.modules.get("__main__")
    for module_name, module in list(sys.modules.items()):
        if module is main:  # under any name (``python -m pytest``: pytest.__main__ too)
            # The user's script: its names are its own (it may keep the original to
            # compare against). A target defined there is rebound as its defining site.
            continue
        namespace = live_namespace(module)
        if namespace is None:
            continue
        try:
            matches = _matches(namespace, wanted, ids)
        except RuntimeError:  # another thread changed its size under us: read a copy
            matches = _matches(dict(namespace), wanted, ids)
        for attribute, value in matches:
            found[id(value)].append((module_name, attribute))
    return found


def rebind(sites: Sequence[Site], old: object, new: object, required: Site) -> None:
    """Rebind every site that still holds ``old``. A site that refuses (a read-only module)
    is skipped with a DEBUG line, unless it is ``required`` (the defining module): then
    everything this call changed is put back and the error propagates."""
    done: list[Site] = []
    try:
        for module_name, attribute in sites:
            module = sys.modules.get(module_name)
            namespace = live_namespace(module) if module is not None else None
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


def rebind_everywhere(
    defining: Site, olds: Sequence[object], new: object, aliases: dict[int, list[Site]]
) -> tuple[Site, ...]:
    """Put ``new`` at the defining site and at every alias (``aliases``: where each of
    ``olds`` was bound) of each of ``olds``; the sites that hold ``new`` afterwards. All or
    none: a failure at the defining site puts back every site this call changed."""
    sites: tuple[Site, ...] = ()
    try:
        for old in olds:
            found = tuple(dict.fromkeys([defining, *aliases.get(id(old), ())]))
            rebind(found, old, new, required=defining)
            sites += found
    except BaseException:
        rebind(sites, new, olds[0], required=defining)
        raise
    return tuple(site for site in dict.fromkeys(sites) if holds(site, new))


def restore_everywhere(
    sites: Sequence[Site], new: object, original: object, defining: Site
) -> None:
    """Put ``original`` back wherever ``new`` still stands: the recorded sites and any alias
    made since the install (a module imported afterwards that took the name)."""
    late = bindings_of_each([new])[id(new)]
    rebind(tuple(dict.fromkeys([*sites, *late])), new, original, defining)
