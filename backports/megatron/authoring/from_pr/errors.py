"""What ``backports new --from-pr`` raises: one line each, with the exit status it means.

``BadInput`` (exit 2): the arguments cannot be acted on (no such clone, a destination that
exists). ``Refused`` (exit 1, nothing written): the pull request is not in the clone, or the
fix is too big to carry. ``NotProven`` (exit 1): a step could not show the backport works;
``--keep-unfinished`` writes what was derived so far. ``AlreadyPresent`` (exit 0): the
installed release already has the change; nothing is written.
"""

from ...errors import BackportError


class FromPrError(BackportError):
    """Every error of ``--from-pr``; ``exit_code`` is the command's exit status, ``report``
    what was derived before it (a line each; printed before the error's line)."""

    exit_code = 1
    report: tuple[str, ...] | list[str] = ()


class BadInput(FromPrError):
    exit_code = 2


class Refused(FromPrError):
    """Nothing to derive: the pull request is not there, or too big to carry."""


class AlreadyPresent(FromPrError):
    """The installed release already has the pull request's change: nothing to carry, so
    nothing is written, and that is no failure (exit 0)."""

    exit_code = 0


class TooBig(FromPrError):
    """The pull request's code is too deeply nested or too big to analyse (a
    ``RecursionError`` or ``MemoryError`` in any step): exit 1, nothing written."""


class NotProven(FromPrError):
    """A step could not prove the backport; what it derived up to there may be kept."""
