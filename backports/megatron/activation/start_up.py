"""The start-up triggers in ``sys.meta_path``: which are there, dropping them, and the
hand-over to the post-import finder at a watched package's first lookup.

The trigger itself (``backports.megatron._Trigger``) lives in the package's ``__init__``,
which the hook line imports in every interpreter; this module is loaded only once it is
needed (megatron's first lookup, a command that decides explicitly).
"""

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from . import post_import

__all__ = ["FIRST_IMPORT", "MARKER", "active", "deactivate", "hand_over", "triggers"]

MARKER = "__megatron_backports_trigger__"  # backports.megatron._TRIGGER
FIRST_IMPORT = "start-up trigger"  # the post_import key of the trigger's one callback


def triggers() -> list[Any]:
    """The start-up triggers in ``sys.meta_path`` (fired ones included)."""
    return [finder for finder in sys.meta_path if getattr(finder, MARKER, False)]


def active() -> bool:
    """Whether a trigger in this interpreter still waits for megatron's first import."""
    return any(not trigger.fired for trigger in triggers())


def deactivate() -> None:
    """Drop the triggers (the CLI and ``audit``'s probe decide explicitly). Not from a finder:
    removing from ``sys.meta_path`` while the import system iterates it skips an entry."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not getattr(finder, MARKER, False)]
    post_import.unregister(FIRST_IMPORT)


def hand_over(
    trigger: object,
    name: str,
    path: Sequence[str] | None,
    target: ModuleType | None,
    after_import: Callable[[ModuleType], None],
) -> ModuleSpec | None:
    """``name``'s spec, whose loader runs ``after_import(module)`` once, when the package
    has executed and sits in ``sys.modules``. The post-import finder takes the ``trigger``'s
    place: one finder from here on. None (nothing to watch) when no other finder finds
    ``name``."""

    def once(module: ModuleType) -> None:
        post_import.unregister(FIRST_IMPORT)  # a re-import does not fire again
        after_import(module)

    post_import.take_place_of(trigger)
    post_import.register(name, FIRST_IMPORT, once)
    spec = post_import.watched_spec(name, path, target)
    if spec is None:
        post_import.unregister(FIRST_IMPORT)
    return spec
