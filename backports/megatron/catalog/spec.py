"""The shape of a catalog entry: what one backport patches, and how to tell it is fixed."""

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from packaging.version import Version

from ..local_changes import LocalChange

__all__ = ["BackportSpec", "LocalChange", "SniffResult", "Target", "VendoredRef"]


@dataclass(frozen=True)
class Target:
    """The upstream function a backport replaces."""

    distribution: str
    # Dotted modules that may define the function, newest layout first. An older path
    # may survive as a PEP 562 forwarder; the patcher rebinds where it is *defined*.
    modules: tuple[str, ...]
    attribute: str
    # Parameter names, in order, that the vendored code was written against.
    parameters: tuple[str, ...]
    # Module globals the vendored code reads from the live target module.
    helpers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SniffResult:
    """What running the installed function on tiny inputs showed."""

    fixed: bool
    summary: str  # one line for the report's reason
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VendoredRef:
    """Where the vendored replacement lives (inside ``backports.megatron._vendor``)."""

    package: str
    module: str
    attribute: str


# sniff(defining module, original function) -> SniffResult; raising means incompatible.
Sniff = Callable[[ModuleType, Callable[..., Any]], SniffResult]


@dataclass(frozen=True)
class BackportSpec:
    """One backport: what it patches, where the target exists, and when to delete it."""

    id: str
    title: str
    target: Target
    # First release of the distribution that has the target at all.
    target_since: Version
    # First release known to carry the fix; None while no release does.
    fixed_in: Version | None
    sniff: Sniff
    vendored: VendoredRef
    delete_when_landed: str
    # What this project adds around the vendored code, outermost first (see local_changes).
    local_changes: tuple[LocalChange, ...] = ()
