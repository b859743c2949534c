"""What each step of ``backports candidates`` finds, as plain frozen data the next reads."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """The merges looked at: first-parent commits of ``main_ref`` after ``base``."""

    base: str  # the installed release's branch point (or --since's commit), full SHA
    tip: str  # main's tip
    main_ref: str
    how: str  # which point was used and why
    release_branch: str | None = None  # the installed release's branch, where the clone has it


@dataclass(frozen=True)
class Merge:
    """One first-parent commit of main in the range (a squash merge, as a rule)."""

    sha: str
    parent: str | None
    pr: int | None  # from the subject's trailing "(#N)"
    subject: str
    body: str
    date: str  # the committer date, ISO 8601
    files: tuple[str, ...]


@dataclass(frozen=True)
class SymbolState:
    """One symbol a merge changes, against the installed megatron-core.

    ``state``: "missing" (installed = the merge's parent), "present" (installed = the
    merge), "drifted" (neither), "absent" (the merge changes code the release does not
    have), "new" (the merge adds it; not installed), "not shipped" (its file is outside the
    installed distribution), "no code change" (comments or formatting only).
    """

    path: str
    qualname: str
    kind: str
    state: str
    lines: int
    how: str = ""


@dataclass(frozen=True)
class FixSignal:
    score: int
    category: str  # "numerics", "crash", "memory", "fix", "refactor", "feature", "other"
    words: tuple[str, ...]  # the words that counted
    tests: tuple[str, ...]  # test files the merge adds or changes
    issues: tuple[str, ...]  # issues it links ("#1234")

    @property
    def fix_like(self) -> bool:
        return self.score >= FIX_LIKE


FIX_LIKE = 3  # the score from which a merge counts as a fix (see signals.py)


@dataclass(frozen=True)
class Reach:
    reachable: bool
    where: str  # "training", "inference", "experimental", or the other entry point's name
    why: str


@dataclass(frozen=True)
class Carrier:
    id: str
    source: str  # "builtin" or "<distribution> <version>"
    match: str  # "pr and merge sha", or "pr number (merge sha differs: ...)"


@dataclass(frozen=True)
class FromPrVerdict:
    """What ``backports new --from-pr`` would say before any child runs."""

    verdict: str  # "carryable", "too big", "absent", "no swap", "conflict", "present", "no pr"
    detail: str
    figures: str = ""

    @property
    def carryable(self) -> bool:
        return self.verdict == "carryable"


@dataclass
class Candidate:
    merge: Merge
    symbols: tuple[SymbolState, ...]
    state: str  # the merge's own state: see states.merge_state
    fix: FixSignal
    reach: Reach
    carried_by: tuple[Carrier, ...]
    release_commit: str | None  # a commit on the release branch naming the pull request
    from_pr: FromPrVerdict
    notes: tuple[str, ...] = ()
    derived: dict[str, Any] | None = None  # --derive's outcome
    rank: int = 0

    @property
    def needed(self) -> bool:
        """The installed release lacks (some of) it."""
        return self.state in ("missing", "drifted", "partial")
