"""The start-up triggers in ``sys.meta_path``: which are there, dropping them, and the
hand-over to the import finder at a watched package's first lookup.

The trigger itself (``backports.megatron._Trigger``) lives in the package's ``__init__``,
which the hook line imports in every interpreter; this module is loaded only once it is
needed (megatron's first lookup, a command that decides explicitly). What runs once the
package has executed is named by a string (``"module:function"``): nothing of the api, the
catalog or the hook file is imported before then.
"""

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from ..interpreter import import_hooks as post_import

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
    name: str,
    path: Sequence[str] | None,
    target: ModuleType | None,
    after_import: str,
    **kwargs: Any,
) -> ModuleSpec | None:
    """``name``'s spec, whose loader runs ``after_import`` ("module:function", called as
    ``function(module, **kwargs)``) once, when the package has executed and sits in
    ``sys.modules``; the import finder, at ``sys.meta_path[0]``, serves every hook from here
    on. None (nothing registered) when no other finder finds ``name``: the caller keeps
    waiting for a later lookup (a ``sys.path`` set afterwards, say)."""
    post_import.register_named(
        name, FIRST_IMPORT, f"{__name__}:fired", after_import=after_import, **kwargs
    )
    spec = post_import.watched_spec(name, path, target)
    if spec is None:
        post_import.unregister(FIRST_IMPORT)
    return spec


def fired(module: ModuleType, after_import: str, **kwargs: Any) -> None:
    """The first import's hook, once: a re-import does not fire again."""
    post_import.unregister(FIRST_IMPORT)
    home, _, function = after_import.partition(":")
    # __import__, not importlib.import_module: the importlib package imports warnings.
    getattr(__import__(home, fromlist=[function]), function)(module, **kwargs)
