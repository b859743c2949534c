"""Every backport: the ones this package carries (one module per upstream pull request), and
those other distributions register under the entry-point group ``megatron_backports``.

A builtin is found, not registered: every module ``catalog/<id with underscores>.py`` that
defines ``SPEC`` (a ``BackportSpec``) is one, so adding a builtin edits no list. ``CATALOG``
holds the builtins, newest pull request first; ``MEGATRON_LM_<PR>`` names each one.
``entries()`` is the catalog every command reads: the builtins, then the plugins'. The model
types are ``backports.megatron.model``'s, re-exported here for plugins.
"""

import importlib
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import BackportError
from ..kinds.added import AddedAttribute
from ..kinds.constructor import Constructor
from ..kinds.import_guard import ImportGuard
from ..kinds.module_attribute import ModuleAttribute
from ..model import (
    BackportSpec,
    Copy,
    LocalChange,
    Renamed,
    Resolved,
    SniffFailed,
    SniffResult,
    Target,
    VendoredRef,
)
from ..session import SESSION

if TYPE_CHECKING:  # plugins are loaded on first use, never when this package is imported
    from ._plugins import Loaded, Withheld

__all__ = [
    "CATALOG",
    "AddedAttribute",
    "BackportSpec",
    "Constructor",
    "Copy",
    "ImportGuard",
    "LocalChange",
    "ModuleAttribute",
    "Renamed",
    "Resolved",
    "SniffFailed",
    "SniffResult",
    "Target",
    "VendoredRef",
    "by_id",
    "entries",
    "origin",
    "reload",
    "select",
    "select_withheld",
    "source",
    "withheld",
]


def _newest_first(name: str) -> list[tuple[int, str]]:
    """Sort key: module names with their numbers compared as numbers, highest first."""
    return [(-int(part), "") if part.isdigit() else (0, part) for part in re.split(r"(\d+)", name)]


def _found() -> dict[str, BackportSpec]:
    """Every builtin entry by module name: the modules of this package that define ``SPEC``."""
    # A listing of the folder, not pkgutil (whose import costs every process at start-up).
    names = {
        entry.name.removesuffix(".py")
        for folder in __path__
        for entry in os.scandir(folder)
        if entry.name.endswith(".py") and not entry.name.startswith("_") and entry.is_file()
    }
    found = {}
    for name in sorted(names, key=_newest_first):
        spec = getattr(importlib.import_module(f"{__name__}.{name}"), "SPEC", None)
        if isinstance(spec, BackportSpec):
            found[name] = spec
    return found


_BUILTINS = _found()
CATALOG: tuple[BackportSpec, ...] = tuple(_BUILTINS.values())


def __getattr__(name: str) -> BackportSpec:
    """``MEGATRON_LM_7617`` and the like: the builtin whose module is that name, lowered."""
    spec = _BUILTINS.get(name.lower()) if name.isupper() else None
    if spec is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return spec


def _load() -> "Loaded":
    """The builtins and the plugins, loaded on first use, once per session (kept on it with
    the builtins it was built from: a test that swaps CATALOG sees its own)."""
    with SESSION.lock:
        kept = SESSION.catalog
        if kept is None or kept[0] is not CATALOG:
            from . import _plugins

            kept = SESSION.catalog = (CATALOG, _plugins.load(CATALOG))
        loaded: Loaded = kept[1]
        return loaded


def reload() -> None:
    """Forget the loaded plugins: the next use reads the entry points again (tests, and a
    process that installed or removed a plugin, or changed MEGATRON_BACKPORTS_SKIP_PLUGINS)."""
    with SESSION.lock:
        SESSION.catalog = None


def entries() -> tuple[BackportSpec, ...]:
    """Every usable catalog entry: the builtins first, then the plugins' in entry-point order."""
    return _load().entries


def withheld() -> "tuple[Withheld, ...]":
    """Plugins and ids that contribute nothing (a failed import, a duplicate id, a skip)."""
    return _load().withheld


def source(backport_id: str) -> str:
    """Where an entry comes from: ``"builtin"`` or ``"<distribution> <version>"``."""
    loaded = _load()
    if backport_id in loaded.sources:
        return loaded.sources[backport_id]
    return next((w.source for w in loaded.withheld if w.id == backport_id), "builtin")


def origin(backport_id: str) -> tuple[str, str] | None:
    """(distribution name, entry-point module) of a plugin's entry; None for a builtin."""
    return _load().origins.get(backport_id)


def _known() -> str:
    return ", ".join([*(spec.id for spec in entries()), *(w.id for w in withheld())])


def by_id(backport_id: str) -> BackportSpec:
    """The catalog entry with this id; ``KeyError`` names the known ids."""
    for spec in entries():
        if spec.id == backport_id:
            return spec
    raise KeyError(f"unknown backport {backport_id!r}; known: {_known()}")


def _ids(only: str | Iterable[str]) -> list[str]:
    return list(dict.fromkeys([only] if isinstance(only, str) else only))


def select(only: str | Iterable[str] | None) -> list[BackportSpec]:
    """The entries named by ``only`` (an id or ids; None: all), each once, in the order given.

    A withheld id is known but has no entry: it is left out here (``select_withheld`` has
    it). An unknown id is the caller's mistake, so it raises ``BackportError`` naming the
    known ids.
    """
    if only is None:
        return list(entries())
    held = {w.id for w in withheld()}
    ids = [i for i in _ids(only) if i not in held]
    try:
        return [by_id(backport_id) for backport_id in ids]
    except KeyError as exc:
        raise BackportError(exc.args[0]) from None


def select_withheld(only: str | Iterable[str] | None) -> "list[Withheld]":
    """The withheld records ``only`` names (None: all)."""
    if only is None:
        return list(withheld())
    wanted = set(_ids(only))
    return [w for w in withheld() if w.id in wanted]
