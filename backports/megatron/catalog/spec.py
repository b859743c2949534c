"""The shape of a catalog entry: what one backport patches, and how to tell it is fixed."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from ..local_changes import LocalChange

if TYPE_CHECKING:  # targets.py imports this package: the type is only for the checker
    from ..targets import ResolvedTarget

__all__ = [
    "BackportSpec",
    "ImportGuard",
    "LocalChange",
    "Sniff",
    "SniffResult",
    "Target",
    "VendoredRef",
]


@dataclass(frozen=True)
class Target:
    """One upstream function or class method a backport replaces."""

    # The distribution that ships the target: version and git evidence read this one.
    distribution: str
    # Dotted modules that may define the target, newest layout first. An older path
    # may survive as a PEP 562 forwarder; the patcher rebinds where it is *defined*.
    modules: tuple[str, ...]
    # "function", or "Class.method": the method is set and restored on that class only.
    attribute: str
    # Parameter names, in order, of the *unwrapped* original ("self" included).
    parameters: tuple[str, ...]
    # Module globals the vendored code reads from the live target module.
    helpers: tuple[str, ...] = ()
    # The vendored module's attribute that replaces it; "" = the last part of ``attribute``.
    replacement: str = ""
    # "module:name" of the decorator the original carries (e.g. "megatron.core.jit:jit_fuser").
    # When the installed original is decorated, the vendored body is decorated with the
    # live decorator and installed behind a plain shim; None: never decorated.
    decorator: str | None = None

    @property
    def owner_name(self) -> str | None:
        """The class holding a method target, or None for a module-level function."""
        owner, dot, _ = self.attribute.rpartition(".")
        return owner if dot else None

    @property
    def name(self) -> str:
        """The attribute's own name (the method's, for "Class.method")."""
        return self.attribute.rpartition(".")[2]

    @property
    def replacement_name(self) -> str:
        return self.replacement or self.name


@dataclass(frozen=True)
class ImportGuard(Target):
    """Module-level code a backport corrects: nothing can be rebound once it has run.

    The module ``modules[0]`` executes inside the vendored guard (``replacement``: a
    context-manager factory taking no arguments) from the moment ``apply()`` installs it
    (the start-up hook does so before megatron's first import); ``revert`` removes the
    guard. ``attribute`` names the module-level result the guarded code decides (for
    reports); there are no parameters. The sniff gets one target whose ``original`` is the
    guard in force: ``backports.megatron.import_guards.no_guard`` for the installed code as
    it stands, or a vendored guard; it judges the module's import under it (in a child
    process: the module must not be executed here before the guard is in place).
    """

    parameters: tuple[str, ...] = ()


@dataclass(frozen=True)
class SniffResult:
    """What running the installed function(s) on tiny inputs showed."""

    fixed: bool
    summary: str  # one line for the report's reason
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VendoredRef:
    """Where the vendored replacement lives (inside ``backports.megatron._vendor``).

    ``attribute`` is the first target's replacement; every target's replacement is an
    attribute of the same vendored module.
    """

    package: str
    module: str
    attribute: str


# sniff(every resolved target, in spec.targets order) -> SniffResult; raising means
# incompatible. It must never write the live module or class (see private_globals).
Sniff = Callable[[Sequence["ResolvedTarget"]], SniffResult]


@dataclass(frozen=True)
class BackportSpec:
    """One backport: what it patches, where the target exists, and when to delete it."""

    id: str
    title: str
    # Applied and reverted together, all or none; the entry has one report.
    targets: tuple[Target, ...]
    # First release of the distribution that has the target(s) at all.
    target_since: Version
    # First release known to carry the fix; None while no release does.
    fixed_in: Version | None
    sniff: Sniff
    vendored: VendoredRef
    delete_when_landed: str
    # What this project adds around the first target's vendored code, outermost first
    # (see local_changes).
    local_changes: tuple[LocalChange, ...] = ()

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError(f"{self.id}: a catalog entry needs at least one target")
        guards = [t for t in self.targets if isinstance(t, ImportGuard)]
        if guards and (len(self.targets) != 1 or len(guards[0].modules) != 1):
            raise ValueError(f"{self.id}: an import guard is the entry's one target, on one module")

    @property
    def guard(self) -> ImportGuard | None:
        """The entry's import guard, when it guards a module's execution (else None)."""
        target = self.targets[0]
        return target if isinstance(target, ImportGuard) else None

    @property
    def target(self) -> Target:
        """The first target (single-target code and messages)."""
        return self.targets[0]
