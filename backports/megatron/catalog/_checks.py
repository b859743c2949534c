"""Is a plugin's catalog entry well formed? Every field checked when the plugin is loaded.

A builtin entry is checked by this project's tests; a plugin's arrives from another
distribution. One field of the wrong type (``target_since="0.19"``, ``modules=()``) would
otherwise surface in the middle of ``apply()``, which then installs nothing, builtins
included. ``problem(spec)`` names the first bad field in one line, so that the loader
withholds that plugin and every other backport keeps working.
"""

import re
from collections.abc import Callable

from packaging.version import Version

from ..model import BackportSpec, LocalChange, Target, VendoredRef

# An id is a name on the command line, in an environment variable and in a file name.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _kind(value: object) -> str:
    return type(value).__name__


def _text(name: str, value: object, pattern: re.Pattern[str] | None = None) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"{name} is {value!r} ({_kind(value)}), not a non-empty str"
    if pattern is not None and not pattern.fullmatch(value):
        return f"{name} {value!r} is not a valid name"
    return None


def _strings(name: str, value: object, *, empty: bool, dotted: bool = False) -> str | None:
    if not isinstance(value, tuple):
        return f"{name} is a {_kind(value)}, not a tuple of str"
    if not value and not empty:
        return f"{name} is empty: it needs at least one"
    for index, item in enumerate(value):
        if _text(name, item, _DOTTED if dotted else None) is not None:
            return f"{name} holds {item!r} at [{index}], not a non-empty {'dotted ' * dotted}name"
    return None


def _on_demand(spec: BackportSpec) -> str | None:
    """``sniff_on_demand`` is a bool, and only for a sniff in child processes (one in this
    process costs milliseconds: every caller runs it)."""
    value = spec.sniff_on_demand
    if not isinstance(value, bool):
        return f"sniff_on_demand is a {_kind(value)}, not a bool"
    if value and not spec.sniff_in_child:
        return "sniff_on_demand needs sniff_in_child (a sniff in this process always runs)"
    return None


def _target(index: int, target: object) -> str | None:
    where = f"targets[{index}]"
    if not isinstance(target, Target):
        return f"{where} is a {_kind(target)}, not a Target"
    checks: list[Callable[[], str | None]] = [
        lambda: _text("distribution", target.distribution),
        lambda: _strings("modules", target.modules, empty=False, dotted=True),
        lambda: _text("attribute", target.attribute, _DOTTED),
        lambda: _strings("parameters", target.parameters, empty=True),
        lambda: _strings("helpers", target.helpers, empty=True),
        lambda: (
            None
            if isinstance(target.replacement, str)
            else f"replacement is a {_kind(target.replacement)}, not a str"
        ),
        lambda: _decorator(target.decorator),
    ]
    for check in checks:
        bad = check()
        if bad is not None:
            return f"{where}.{bad}"
    return None


def _decorator(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value.count(":") != 1 or not all(value.split(":")):
        return f"decorator is {value!r}, not None or 'module:name'"
    return None


def _vendored(value: object) -> str | None:
    if not isinstance(value, VendoredRef):
        return f"vendored is a {_kind(value)}, not a VendoredRef"
    for name in ("package", "module", "attribute"):
        bad = _text(f"vendored.{name}", getattr(value, name), _DOTTED)
        if bad is not None:
            return bad
    return None


def _versions(spec: BackportSpec) -> str | None:
    if not isinstance(spec.target_since, Version):
        return f"target_since is {spec.target_since!r} ({_kind(spec.target_since)}), not a Version"
    for name in ("fixed_in", "bug_since"):
        value = getattr(spec, name)
        if value is not None and not isinstance(value, Version):
            return f"{name} is {value!r} ({_kind(value)}), not a Version or None"
    return None


def _targets(value: object) -> str | None:
    if not isinstance(value, tuple) or not value:
        return f"targets is {_kind(value)} {value!r:.60}, not a non-empty tuple of Target"
    for index, target in enumerate(value):
        bad = _target(index, target)
        if bad is not None:
            return bad
    return None


def _local_changes(value: object) -> str | None:
    if not isinstance(value, tuple):
        return f"local_changes is a {_kind(value)}, not a tuple of LocalChange"
    for index, change in enumerate(value):
        if not isinstance(change, LocalChange):
            return f"local_changes[{index}] is a {_kind(change)}, not a LocalChange"
        if not callable(change.wrap):
            return f"local_changes[{index}].wrap is not callable"
    return None


def problem(spec: BackportSpec) -> str | None:
    """The first field of ``spec`` that is not what the catalog needs, in one line; None if
    every field is well formed. The message starts with the field's name."""
    checks: list[Callable[[], str | None]] = [
        lambda: _text("id", spec.id, _ID),
        lambda: _text("title", spec.title),
        lambda: _targets(spec.targets),
        lambda: _versions(spec),
        lambda: None if callable(spec.sniff) else f"sniff is a {_kind(spec.sniff)}, not callable",
        lambda: _vendored(spec.vendored),
        lambda: _text("delete_when_landed", spec.delete_when_landed),
        lambda: _local_changes(spec.local_changes),
        lambda: (
            None
            if isinstance(spec.sniff_in_child, bool)
            else f"sniff_in_child is a {_kind(spec.sniff_in_child)}, not a bool"
        ),
        lambda: _on_demand(spec),
    ]
    for check in checks:
        bad = check()
        if bad is not None:
            return bad
    return None
