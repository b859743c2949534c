"""What ``backports new --from-pr`` raises: one line each, with the exit status it means.

``BadInput`` (exit 2): the arguments cannot be acted on (no such clone, a destination that
exists). ``Refused`` (exit 1, nothing written): the pull request is not in the clone, or the
fix is not a shape a backport carries. ``NotProven`` (exit 1): a step could not show the
backport works; ``--keep-unfinished`` writes what was derived so far. ``AlreadyPresent``
(exit 0): the installed release already has the change; nothing is written.

Every refusal and every failed proof names one ``Reason``: a short code the command prints
after the line, and the next step a person takes (``docs/from-pr.md`` lists them all).
"""

import enum

from ...errors import BackportError


class Reason(enum.Enum):
    """Why ``--from-pr`` wrote no proven plugin: ``code`` (printed) and the next step."""

    NOT_IN_CLONE = ("not-in-clone", "fetch the pull request's commits into the clone")
    UNREADABLE = ("unreadable", "the clone's source is not what upstream ships: check the clone")
    OUTSIDE_RELEASE = (
        "outside-the-release",
        "the fix needs code the installed release lacks: carry the upstream change it needs "
        "first, or wait for a release that has it",
    )
    CONFLICT = (
        "conflict",
        "carry the upstream change named first, or port the hunk by hand (adding-a-backport.md)",
    )
    OVER_BUDGET = (
        "over-budget",
        "carry the part that fixes the bug by hand (backports new --pr N --repo ... --target "
        "...), or wait for the release",
    )
    SHAPE = (
        "shape",
        "no kind carries that change: carry it by hand (backports new --pr N --repo ... "
        "--target ...)",
    )
    NO_ROUTE = (
        "no-route",
        "write the sniff by hand: --keep-unfinished writes the plugin with a sniff to finish",
    )
    NOT_PROVEN = (
        "not-proven",
        "read the proof's lines above; --keep-unfinished writes the plugin to finish by hand",
    )

    @property
    def code(self) -> str:
        return self.value[0]

    @property
    def next_step(self) -> str:
        return self.value[1]


class FromPrError(BackportError):
    """Every error of ``--from-pr``; ``exit_code`` is the command's exit status, ``reason``
    (refusals and failed proofs) its named reason, ``report`` what was derived before it (a
    line each; printed before the error's line)."""

    exit_code = 1
    default_reason: Reason | None = None
    report: tuple[str, ...] | list[str] = ()

    def __init__(self, message: str, reason: Reason | None = None) -> None:
        super().__init__(message)
        self.reason = reason or self.default_reason


class BadInput(FromPrError):
    exit_code = 2


class Refused(FromPrError):
    """Nothing to derive: the pull request is not there, or not a shape a backport carries."""

    default_reason = Reason.SHAPE


class AlreadyPresent(FromPrError):
    """The installed release already has the pull request's change: nothing to carry, so
    nothing is written, and that is no failure (exit 0)."""

    exit_code = 0


class TooBig(FromPrError):
    """The pull request's code is too deeply nested or too big to analyse (a
    ``RecursionError`` or ``MemoryError`` in any step): exit 1, nothing written."""


class NotProven(FromPrError):
    """A step could not prove the backport; what it derived up to there may be kept."""

    default_reason = Reason.NOT_PROVEN
