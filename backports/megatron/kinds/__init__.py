"""Target kinds: what a backport replaces, and how, behind one protocol.

A catalog entry names its targets; each target's model class (``model.Target`` for a
function or method, ``ImportGuard``, ``ModuleAttribute``, ``Constructor``) belongs to one
kind, and only that kind knows how to find it, fingerprint it, show it to a sniff, install
and uninstall it. Nothing outside this package asks which kind a target is: the decision
path and the installer call the protocol below. Adding a kind is one module here (its model
class and its ``Kind``, built on ``_base.BaseKind``, which holds the defaults most kinds
share), one line in ``_KINDS``, and its tests.

Importing this package imports no kind module: ``kind_of`` loads the one a target's class
names (the job's start-up path pays only for the kinds its catalog uses).
"""

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from ..model import Resolved, Target

__all__ = [
    "Installation",
    "Kind",
    "Part",
    "Resolved",
    "TargetMissing",
    "kind_of",
]

# (module name, attribute): one place that holds a replaced object.
Site = tuple[str, str]

# A kind's own record of a target found in this process (``model.ResolvedTarget``,
# ``import_guard.GuardTarget``, ...) is a ``model.Resolved``: every one has ``original`` and
# ``module_name``, and only the kind that made it reads the rest. What a kind gives out is
# typed ``Resolved``; what it takes back is its own record (``Own``), which the protocol
# cannot name (each kind takes its own type), so that one stays unchecked at this boundary.
Own = Any


class TargetMissing(LookupError):
    """No candidate module defines the target."""


@dataclass(frozen=True)
class Part:
    """One target as installed: what stood there (``resolved.original``), what stands now
    (``replacement``), where (``sites``), and the kind's own record (a guard's executions)."""

    kind: "Kind"
    backport_id: str
    target: Target
    resolved: Resolved
    replacement: object
    sites: tuple[Site, ...]
    record: object = None


@dataclass(frozen=True)
class Installation:
    """Every target of one backport, installed together, in one mode."""

    backport_id: str
    mode: str
    parts: tuple[Part, ...]
    # What the install found and said (instances built before a constructor fix, ...).
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def sites(self) -> tuple[Site, ...]:
        return tuple(site for part in self.parts for site in part.sites)

    def replaced(self) -> Iterator[tuple[object, object]]:
        """(what stood there, what stands now) per target: the record ``applied()`` and
        ``status`` read for objects that cannot carry ``__backport__``."""
        for part in self.parts:
            yield part.resolved.original, part.replacement


class Kind(Protocol):
    """How one kind of target is found, judged, shown to a sniff, installed and removed.

    ``resolved`` is the kind's own record of a target found in this process; it has at least
    ``original`` (what stands there now, ours unwrapped) and ``module_name``.
    """

    name: str
    # True: installed before its module executes (an import guard); False: once the
    # module that defines the target has been imported (``find`` says when).
    before_import: bool
    # True: judging it needs child interpreters (the entry's sniff always runs in one).
    sniff_in_child: bool

    def find(self, target: Target, backport_id: str) -> Resolved | None:
        """The target among what this process has imported, importing nothing; None while
        its module is not imported (or, for a kind installed before the import, never)."""

    def resolve(self, target: Target, backport_id: str) -> Resolved:
        """The target, importing its candidate modules; ``TargetMissing`` says why not."""

    def refusal(self, target: Target, resolved: Own, reads: Sequence[str]) -> str | None:
        """Why this target must not be replaced (another patch stands there, or it is not
        the shape the vendored code was written against), or None. ``reads``: module
        globals the vendored code looks up on the live module."""

    def fingerprint(self, target: Target, resolved: Own) -> dict[str, object] | None:
        """What decides the verdict about this target, for the verdict cache's key; None
        when it cannot be keyed (the probe then runs)."""

    def stock(self, target: Target, resolved: Own) -> Resolved:
        """What the entry's sniff judges as the installed code."""

    def replacement(self, target: Target, vendored_module: ModuleType) -> object:
        """The vendored object that replaces this target (before any local change)."""

    def stand_in(self, target: Target, resolved: Own, replacement: object) -> Resolved:
        """What the entry's sniff judges as the vendored code: ``resolved`` with
        ``replacement`` where the original stands."""

    def aliases(self, resolved: Own) -> list[object]:
        """Objects whose module-level bindings the installer must find (one shared scan)."""

    def install(
        self,
        backport_id: str,
        target: Target,
        resolved: Own,
        replacement: object,
        markers: Mapping[str, object],
        aliases: dict[int, list[Site]],
    ) -> Part:
        """Put ``replacement`` in place (every binding, or none); the part installed."""

    def uninstall(self, part: Part) -> None:
        """Put back what ``part`` replaced, wherever its replacement still stands."""

    def is_live(self, part: Part) -> bool:
        """Whether ``part``'s replacement still stands where the target is defined."""

    def bound(self, resolved: Own) -> object:
        """The very object the defining site holds now (what ``revert`` must put back)."""

    def evidence(self, target: Target, resolved: Own) -> dict[str, object]:
        """The target as found, for the report."""

    def existing(self, resolved: Own) -> int:
        """How many objects built before an install would keep the original's behaviour
        (a constructor fix cannot reach them); 0 for every other kind."""

    def after_install(self, parts: Sequence[Part]) -> tuple[str, dict[str, object]]:
        """A note for the report once these parts are installed ("" and {} for none)."""

    def reverted(self, parts: Sequence[Part]) -> str:
        """What ``revert`` did to these parts, for its report ("restored the original at
        ...")."""

    def unlike_any_version(self, target: Target, resolved: Own) -> AbstractContextManager[bool]:
        """For the contract kit: while the block runs, the target is a shape no version of
        it has (True), or the kind has no shape to differ (False)."""


# model class name -> the module of this package that defines its kind. The base class
# ``Target`` (a function or a method) is the function kind's.
_KINDS = {
    "Target": "function",
    "ImportGuard": "import_guard",
    "ModuleAttribute": "module_attribute",
    "Constructor": "constructor",
    "AddedAttribute": "added",
}


def kind_of(target: Target) -> Kind:
    """The kind that handles ``target``, found from its model class (a plugin's subclass
    of a model class is that class's kind)."""
    for cls in type(target).__mro__:
        home = _KINDS.get(cls.__name__)
        if home is not None and cls.__module__.startswith(_MODEL_PACKAGE):
            module = __import__(f"{__name__}.{home}", fromlist=["KIND"])
            kind: Kind = module.KIND
            return kind
    raise TypeError(f"{type(target).__name__} is no kind of target this package knows")


_MODEL_PACKAGE = __name__.rpartition(".")[0]  # backports.megatron
