"""What a backport is: the types every catalog entry (builtin or plugin) is made of.

A ``BackportSpec`` names its ``Target``s, the ``Sniff`` that tells from behaviour whether
the installed code has the fix (a ``SniffResult``, or ``SniffFailed``), the vendored
replacement (``VendoredRef``) and the ``LocalChange``s this project adds around it.
``Resolved`` is what a target turned out to be in this process, as a sniff sees it (each
kind records its own: ``ResolvedTarget`` for a function or method).

A builtin entry leaves out what its id implies: the vendored package
(``backports.megatron._vendor.<id with underscores>``), the vendored module (the last part
of the first target's first module), the replacement's name, and what to delete when the
fix lands. This module imports nothing of the tool but ``local_changes``, so every other
part can import it.
"""

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, Protocol, cast, runtime_checkable

from packaging.version import Version

from .local_changes import LocalChange

__all__ = [
    "UPSTREAM_ONLY",
    "VENDOR_PACKAGE",
    "WITH_LOCAL_CHANGES",
    "BackportSpec",
    "Copy",
    "LocalChange",
    "Resolved",
    "ResolvedTarget",
    "Sniff",
    "SniffFailed",
    "SniffResult",
    "Target",
    "VendoredRef",
    "module_name_of",
    "recorded_as",
]

# Where builtin entries' vendored folders are installed (vendor/<id>/ in a checkout).
VENDOR_PACKAGE = "backports.megatron._vendor"

# The two modes an installed backport runs in: upstream's vendored code alone, or with the
# local changes this project adds around it (MEGATRON_BACKPORTS_UPSTREAM_ONLY chooses).
UPSTREAM_ONLY = "upstream-only"
WITH_LOCAL_CHANGES = "local-changes"


def mode_name(upstream_only: bool) -> str:
    return UPSTREAM_ONLY if upstream_only else WITH_LOCAL_CHANGES


def module_name_of(backport_id: str) -> str:
    """The name of an entry's module and vendored folder: its id with underscores."""
    return backport_id.replace("-", "_")


class SniffFailed(RuntimeError):
    """The installed code did not behave like any version of itself: the sniff cannot tell,
    so the verdict is ``incompatible``. Every entry's sniff raises this one."""


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
    # Other names of a method's class in other releases of the distribution (upstream
    # renamed it: main's FullyShardedDataParallelV1 is 0.19.2's FullyShardedDataParallel),
    # looked up in order where ``attribute``'s class is not in the module.
    owner_renamed: tuple[str, ...] = ()

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

    def problem_in(self, targets: "Sequence[Target]") -> str | None:
        """Why this target cannot stand among an entry's ``targets``, or None (a kind with
        a rule of its own, such as the import guard, says it here)."""
        return None


@runtime_checkable
class Resolved(Protocol):
    """A target as found in this process: what every kind's record of one has (the function
    kind's ``ResolvedTarget``, the import guard's ``GuardTarget``, a module attribute's
    ``ResolvedAttribute``), and what an entry's sniff receives, one per target.

    A sniff that needs more than these reads its own kind's record (``recorded_as``).
    """

    @property
    def module_name(self) -> str:
        """The module that defines the target (an import guard's: the guarded one)."""
        ...

    @property
    def original(self) -> Any:
        """What stands there: the function, guard or object the sniff judges (ours unwrapped
        when a backport is installed)."""
        ...


@dataclass(frozen=True)
class ResolvedTarget:
    """``module`` defines ``original``; ``installed`` is our replacement if one is live.

    ``owner`` holds the attribute: the class of a "Class.method" target, else ``module``.
    ``original`` is the very object bound there (for a compiled method, torch.compile's
    wrapper: ``inspect.unwrap`` it to reach the body).
    """

    imported_as: str
    module: ModuleType
    attribute: str
    original: Callable[..., Any]
    installed: Callable[..., Any] | None
    # Why ``original`` is someone else's replacement rather than the module's own function
    # (a wrapper, or code from another file), or None.
    foreign: str | None = None
    owner: Any = None
    # Whether ``original`` is its declared decorator's wrapper around the module's body.
    decorated: bool = False
    # The very object the owner holds (a static method's ``staticmethod``); ``original``
    # when it is the function itself.
    held: Any = None

    def __post_init__(self) -> None:
        if self.owner is None:
            object.__setattr__(self, "owner", self.module)
        if self.held is None:
            object.__setattr__(self, "held", self.original)

    @property
    def module_name(self) -> str:
        return self.module.__name__

    @property
    def name(self) -> str:
        """The attribute's own name on ``owner``."""
        return self.attribute.rpartition(".")[2]

    @property
    def is_method(self) -> bool:
        return self.owner is not self.module

    @property
    def body(self) -> Callable[..., Any]:
        """The undecorated function (``original`` itself when it is not decorated)."""
        return inspect.unwrap(self.original) if self.decorated else self.original


@dataclass(frozen=True)
class SniffResult:
    """What running the installed function(s) on tiny inputs showed."""

    fixed: bool
    summary: str  # one line for the report's reason
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VendoredRef:
    """Where the vendored replacement lives: ``package.module``, attribute ``attribute``.

    ``attribute`` is the first target's replacement; every target's replacement is an
    attribute of the same vendored module. A field left empty is derived from the entry
    (see ``BackportSpec``): a builtin names only what its id does not imply.
    """

    package: str = ""
    module: str = ""
    attribute: str = ""


# sniff(every resolved target, in spec.targets order) -> SniffResult; raising (SniffFailed)
# means incompatible. It must never write the live module or class (see private_globals).
Sniff = Callable[[Sequence[Resolved]], SniffResult]


def recorded_as[R](targets: Sequence[Resolved], record: type[R]) -> Sequence[R]:
    """An entry's targets as their kind records them (``ResolvedTarget`` for functions and
    methods: the module, the owner, the held object), for a sniff that reads more than
    ``Resolved`` has. No check: a test may hand a sniff stand-ins of its own."""
    return cast(Sequence[R], targets)


@dataclass(frozen=True)
class Copy:
    """Another distribution that ships its own copy of the fixed code (megatron-fsdp's wheel
    holds the module megatron-core vendors as ``megatron.core.distributed.fsdp.src``): the
    entry's targets in ``distribution`` are judged and installed on that distribution's
    evidence alone (its version, its installed text), dated here, apart from the others."""

    distribution: str
    # As ``BackportSpec``'s, for this distribution's releases.
    target_since: Version
    bug_since: Version | None = None
    fixed_in: Version | None = None


@dataclass(frozen=True)
class Renamed:
    """A target upstream renamed (``old`` -> ``new`` in the same module, by ``change``,
    e.g. "#5944 (e4ba3a30f2d8)"). Where ``old`` is gone and ``new`` stands, the entry cannot
    install (its replacement is for the old name, which nothing there reads) and the bug
    may still be there: the verdict is ``incompatible``, naming the change, never
    ``absent`` (which would read "not needed")."""

    old: str
    new: str
    change: str


@dataclass(frozen=True)
class BackportSpec:
    """One backport: what it patches, where the target exists, and when to delete it.

    ``vendored`` and ``delete_when_landed`` may be left out (or ``VendoredRef`` fields left
    empty): they are then derived from the id, as a builtin entry lays its files out.
    """

    id: str
    title: str
    # Installed and reverted together, all or none; the entry has one report. Targets in
    # different modules are judged (and installed) as soon as one of those modules is
    # imported: the others are imported then to judge it, unless ``coupled``.
    targets: tuple[Target, ...]
    # First release of the distribution that has the target(s) at all.
    target_since: Version
    # First release known to carry the fix; None while no release does.
    fixed_in: Version | None
    sniff: Sniff
    vendored: VendoredRef = VendoredRef()
    delete_when_landed: str = ""
    # What this project adds around the first target's vendored code, outermost first
    # (see local_changes).
    local_changes: tuple[LocalChange, ...] = ()
    # The sniff starts child interpreters (seconds each): a job's processes decide from the
    # verdict cache, or, while it is cold, from the evidence that needs no sniff; `backports
    # status` and `check` run it (and fill the cache). A kind may require it (an import guard).
    sniff_in_child: bool = False
    # With ``sniff_in_child``: the sniff is costly (several child processes: a process group
    # of ranks), so only ``backports check`` and ``apply()`` run it, keeping its proof in the
    # proof store; ``status`` and a job's processes read the proof, and where none is stored
    # say "not yet checked" (needed by the evidence that needs no sniff; nothing installed).
    sniff_on_demand: bool = False
    # Targets upstream renamed since the entry was written (see ``Renamed``).
    renamed: tuple[Renamed, ...] = ()
    # First release with the bug, where it came later than the target: an older release
    # is ``absent`` (it has the target and not the bug). None: the target always had it.
    bug_since: Version | None = None
    # True: the targets' modules are left for the job to import, and the entry waits until
    # every one of them is (the reason names the one it waits for). False: the first of
    # them imported brings in the others, so a job that imports only one (LLaVA and never
    # MiMo) still gets the fix where it runs.
    coupled: bool = False
    # Other distributions shipping a copy of the same code (see ``Copy``): the targets are
    # then grouped by distribution, each group judged and installed on its own evidence
    # (``parts()``); the first target's distribution is dated by the fields above.
    copies: tuple[Copy, ...] = ()
    # Modules the installed code imports lazily on the sniff's path (#6507's builder imports
    # MiMo inside its body): imported before the sniff's clock starts, in the caller's
    # thread, because a first import on a fresh host (bytecode not yet compiled, children
    # importing beside it) can outlast the in-process limit and is not the sniff's time.
    sniff_imports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError(f"{self.id}: a catalog entry needs at least one target")
        problem = self._copies_problem()
        if problem is not None:
            raise ValueError(f"{self.id}: {problem}")
        for target in self.targets:
            problem = target.problem_in(self.targets) if isinstance(target, Target) else None
            if problem is not None:
                raise ValueError(f"{self.id}: {problem}")
        if isinstance(self.vendored, VendoredRef):  # else a plugin's mistake: spec_checks says
            object.__setattr__(self, "vendored", self._complete(self.vendored))
        if not self.delete_when_landed:
            object.__setattr__(self, "delete_when_landed", self._delete_text())

    def _copies_problem(self) -> str | None:
        """Why ``copies`` does not fit the targets, or None: each copy's distribution holds
        targets and is not the first target's (dated by the entry itself)."""
        names = [copy.distribution for copy in self.copies]
        held = {getattr(target, "distribution", None) for target in self.targets}
        if len(set(names)) != len(names):
            return f"a distribution is named twice in copies: {names}"
        for name in names:
            if name == self.target.distribution:
                return f"copies names {name}, the first target's (dated by the entry itself)"
            if name not in held:
                return f"copies names {name}, which no target is in"
        return None

    def parts(self) -> "tuple[BackportSpec, ...]":
        """The entry as judged: itself, or (with ``copies``) one entry per distribution, in
        the targets' order, each with that distribution's targets and dates."""
        if not self.copies:
            return (self,)
        dated = {copy.distribution: copy for copy in self.copies}
        own = Copy(self.target.distribution, self.target_since, self.bug_since, self.fixed_in)
        order = list(dict.fromkeys(target.distribution for target in self.targets))
        parts = []
        for name in order:
            copy = dated.get(name, own)
            parts.append(
                replace(
                    self,
                    targets=tuple(t for t in self.targets if t.distribution == name),
                    target_since=copy.target_since,
                    bug_since=copy.bug_since,
                    fixed_in=copy.fixed_in,
                    copies=(),
                )
            )
        return tuple(parts)

    @property
    def target(self) -> Target:
        """The first target (messages, and the distribution ``target_since`` dates)."""
        return self.targets[0]

    def _complete(self, ref: VendoredRef) -> VendoredRef:
        """``ref`` with every empty field derived from the id and the first target."""
        if ref.package and ref.module and ref.attribute:
            return ref
        return replace(
            ref,
            package=ref.package or f"{VENDOR_PACKAGE}.{module_name_of(self.id)}",
            module=ref.module or self.target.modules[0].rpartition(".")[2]
            if self.target.modules
            else ref.module,
            attribute=ref.attribute or self.target.replacement_name,
        )

    def _delete_text(self) -> str:
        name = module_name_of(self.id)
        text = f"Delete vendor/{name}/ and backports/megatron/catalog/{name}.py"
        if self.local_changes:
            named = ", ".join(change.name for change in self.local_changes)
            text += f"; its local changes ({named}) go with it or are proposed upstream"
        return text + "."
