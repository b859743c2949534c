"""The package internals the figure scripts call, in one place: the catalog, how a target
is resolved and what the sniff judges as the installed code (its kind), and the sniff on
the vendored code (the decision's ``sniff_vendored``). Issue 32 moves modules between
wings: re-point these imports, nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from backports.megatron.catalog import CATALOG, by_id
from backports.megatron.decision import sniff_vendored
from backports.megatron.kinds import kind_of
from backports.megatron.model import BackportSpec, SniffResult
from backports.megatron.vendored import vendored_module

__all__ = [
    "CATALOG",
    "BackportSpec",
    "SniffResult",
    "by_id",
    "entry_of_plugin",
    "in_child",
    "installed_code",
    "resolve",
    "sniff_on_vendored",
    "vendored_code",
]


def resolve(spec: BackportSpec) -> list[Any]:
    """Every target of ``spec`` resolved as the decision does (importing its modules)."""
    return [kind_of(target).resolve(target, spec.id) for target in spec.targets]


def installed_code(spec: BackportSpec, resolved: Sequence[Any]) -> list[Any]:
    """What ``spec.sniff`` judges as the installed code (the decision's ``stock``)."""
    return [
        kind_of(target).stock(target, found)
        for target, found in zip(spec.targets, resolved, strict=True)
    ]


def in_child(spec: BackportSpec) -> bool:
    """Whether the decision runs this entry's sniff as one that starts child interpreters."""
    return bool(spec.sniff_in_child or any(kind_of(t).sniff_in_child for t in spec.targets))


def sniff_on_vendored(
    spec: BackportSpec, resolved: Sequence[Any], module: ModuleType | None = None
) -> SniffResult:
    """The entry's sniff on its vendored code alone (upstream-only), as ``status`` runs it
    (or on ``module``, a vendored module of another origin, in its place)."""
    if module is None:
        module = vendored_module(spec.vendored)
    return sniff_vendored(spec, module, upstream_only=True, targets=resolved)


def vendored_code(spec: BackportSpec) -> ModuleType:
    """The entry's vendored module (a plugin's: the one its own folder holds)."""
    return vendored_module(spec.vendored)


def entry_of_plugin(backport_id: str) -> BackportSpec:
    """A plugin's entry by id: from the catalog, else (withheld there, say for sharing a
    builtin's targets) straight from its entry point's ``SPEC``."""
    try:
        return by_id(backport_id)
    except KeyError:
        pass
    from importlib.metadata import entry_points

    for point in entry_points(group="megatron_backports"):
        loaded = point.load()
        spec = getattr(loaded, "SPEC", loaded)
        if isinstance(spec, BackportSpec) and spec.id == backport_id:
            return spec
    raise KeyError(f"no plugin entry {backport_id!r} among the installed entry points")
