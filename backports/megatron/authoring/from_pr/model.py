"""What each step of ``--from-pr`` finds, as plain frozen data the next step reads."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Commit:
    """One SHA the derivation rests on, and whether the clone confirmed what it is."""

    role: str  # "head", "merge" or "base"
    sha: str  # full 40 hex
    verified: bool
    how: str  # how it was found, and checked (or why not)


@dataclass(frozen=True)
class PullRequest:
    number: int
    head: Commit | None  # None: a squash merge in a clone without refs/pull/N/head
    merge: Commit | None  # None while the pull request is open
    base: Commit  # merge^ (a squash merge), or merge-base(head, main) (open)
    main_ref: str
    twins: tuple[str, ...] = ()  # commits naming (#N) that are not on main: discarded

    @property
    def new(self) -> Commit:
        """The side of the pull request's change: the merge commit, else its head."""
        side = self.merge or self.head
        assert side is not None  # resolve_pull_request refuses a pull request with neither
        return side


# Shapes a function swap carries; any other changed symbol is outside what a backport holds.
CARRIABLE = frozenset(
    {
        "function",
        "method",
        "new helper",
        "new constant",
        "new method",
        "new class attribute",
        "changed constant",
    }
)


@dataclass(frozen=True)
class Symbol:
    """One changed unit of an upstream file: a function, a method, a class body, a module
    statement. ``tags`` say its shape; ``lines`` count the diff lines inside it."""

    path: str  # the file at the new side (the old one, for a removed file)
    qualname: str  # "fn", "Class.method", "Class" (its body), "NAME" or "<module:L>"
    kind: str  # one of CARRIABLE, or "class body", "import", "module statement", ...
    tags: tuple[str, ...]
    lines: int
    old_path: str | None = None  # the file at the base side, if the symbol was there
    inner: tuple[str, ...] = ()  # nested defs the hunks fell in (the unit carries them)

    @property
    def carriable(self) -> bool:
        return self.kind in CARRIABLE

    @property
    def shown(self) -> str:
        return f"{self.path}::{self.qualname}"


@dataclass(frozen=True)
class Located:
    """Where a changed symbol is in the installed distribution, and how it compares.

    ``status``: "identical" (the installed text is the pull request's base), "drifted"
    (installed differs from the base), "absent" (not installed anywhere), "new" (the pull
    request adds it; not installed), "not shipped" (its file is not part of the installed
    distribution, e.g. megatron/training).
    """

    symbol: Symbol
    status: str
    module: str | None = None  # the installed module that defines it
    qualname: str | None = None  # its name there (a rename shows here)
    how: str = ""  # "same path", "moved from ...", "renamed ... (body fingerprint)"
    notes: tuple[str, ...] = field(default=())
