"""The objects a constructor fix cannot reach: those its class had when it was installed.

The constructor kind records them at its install (weakly: a record never keeps an optimizer
alive); the function kind routes a call of the same entry's method on one of them to the
original method, so an object built before ``apply()`` keeps the installed release's
behaviour through and through (#6099's ``count_zeros`` reads what only the fixed constructor
sets). Standard library only: both kinds import it.
"""

import threading
import weakref
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
# (backport id, class) -> the objects of that class alive when its constructor was replaced.
_BEFORE: dict[tuple[str, type], "weakref.WeakSet[Any]"] = {}


def record(backport_id: str, owner: type, objects: list[object]) -> int:
    """Keep ``objects`` as built before ``backport_id``'s constructor on ``owner``; how many
    could be kept (an object that takes no weak reference cannot)."""
    kept: weakref.WeakSet[Any] = weakref.WeakSet()
    for obj in objects:
        try:
            kept.add(obj)
        except TypeError:  # no weak reference to it: it cannot be told apart later
            continue
    with _LOCK:
        _BEFORE[(backport_id, owner)] = kept
    return len(kept)


def forget(backport_id: str, owner: type) -> None:
    with _LOCK:
        _BEFORE.pop((backport_id, owner), None)


def built_before(backport_id: str, owner: type) -> "weakref.WeakSet[Any] | None":
    """The objects recorded for ``backport_id``'s constructor on ``owner``, or None when the
    entry has no constructor there (installed)."""
    with _LOCK:
        return _BEFORE.get((backport_id, owner))


def routed(
    replacement: Callable[..., object],
    original: Callable[..., object],
    before: "weakref.WeakSet[Any]",
) -> Callable[..., object]:
    """A method calling ``original`` for an object of ``before``, ``replacement`` for any
    other; it carries ``replacement``'s markers (``__backport__``, ``__wrapped__``, ...), and
    ``__backport_body__`` names what new objects run."""

    def method(self: object, *args: object, **kwargs: object) -> object:
        try:
            old = self in before
        except TypeError:  # an object that takes no weak reference was never recorded
            old = False
        return (original if old else replacement)(self, *args, **kwargs)

    for name in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(method, name, getattr(replacement, name, None))
    method.__dict__.update(getattr(replacement, "__dict__", {}))
    method.__dict__.setdefault("__backport_body__", replacement)
    method.__backport_old_objects__ = before  # type: ignore[attr-defined]
    return method
