"""The start-up trigger: the code the hook file runs in every interpreter of the environment.

``backports apply`` embeds this file, compiled, in the hook file's ``.pth`` line (see
``activation``), so interpreter start-up reads none of our files and imports nothing:
importing our namespace package alone would cost a few percent of ``python -c pass``.
It runs in a fresh namespace, not as ``backports.megatron._startup``: keep it
self-contained, with only ``os`` and ``sys`` (both loaded before any ``.pth`` line runs),
and cheap to execute (no class statement: the finder is a ``SimpleNamespace``).

``install`` puts a finder at the front of ``sys.meta_path`` that finds nothing. The first
lookup of a watched top-level package (``megatron``) calls
``backports.megatron.activation.fire``, which runs ``apply()``: that registers the
post-import hooks that patch the target modules when they are imported.
"""

import os
import sys

# Not typing.TYPE_CHECKING: importing typing would cost start-up time (mypy knows the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARKER = "__megatron_backports_trigger__"  # how triggers are told apart in sys.meta_path
trigger: "Any" = None


def find_spec(fullname: str, path: object = None, target: object = None) -> None:
    """The trigger's ``find_spec``: never finds a module; the first watched lookup fires."""
    if fullname in trigger.packages and not trigger.fired:
        # Inert from now on, but left in sys.meta_path: this runs while the import system
        # iterates that list, and removing an entry would skip the next one.
        trigger.fired = True
        try:
            from backports.megatron.activation import fire
        except ImportError:
            return None  # megatron-backports is gone and left its hook file behind
        fire(trigger.config)
    return None


def install(packages: "tuple[str, ...]", config: "dict[str, Any]") -> "Any":
    """Watch for the first import of ``packages``; returns the trigger, None if disabled.

    ``config`` holds ``apply()``'s arguments (``only``, ``strict``).
    """
    global trigger
    # switches.ENABLE and switches.FALSE, spelled out: start-up imports nothing of ours
    # (tests/test_switches.py keeps them equal). Other values are switches.py's to judge.
    if os.environ.get("MEGATRON_BACKPORTS", "").strip().lower() in ("0", "false", "off", "no"):
        return None
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, MARKER, False)]
    namespace: Any = type(sys.implementation)  # types.SimpleNamespace, without importing types
    trigger = namespace(
        find_spec=find_spec, packages=frozenset(packages), config=config, fired=False
    )
    setattr(trigger, MARKER, True)
    sys.meta_path.insert(0, trigger)
    already = sorted(trigger.packages.intersection(sys.modules))
    if already:
        find_spec(already[0])
    return trigger
