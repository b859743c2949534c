"""What a sync says as it goes, and how it ended: the report a sync returns.

The sync never prints (one error policy for every command): it says each line to its
report, and the commands wing shows each one as it comes (a sync's diff must be on the
screen before its sniff, which takes seconds) and turns the end into an exit status. An
error is raised, never said: a ``SyncError`` (``Refused``: exit status 1).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

# Shows one piece of text as it is said (the commands wing: stdout, as it comes).
Show = Callable[[str], object]


def _keep_quiet(text: str) -> None:
    """A report nobody watches (a caller that reads ``said`` afterwards)."""


@dataclass
class SyncReport:
    """Every piece of text a sync said, in order, and whether it found what fails it."""

    show: Show = field(default=_keep_quiet, repr=False)
    said: list[str] = field(default_factory=list)
    # ``check`` found drift or a leftover of a killed sync (exit status 1).
    failed: bool = False

    def say(self, line: str) -> None:
        """One line of the sync's own words."""
        self.write(line + "\n")

    def write(self, text: str) -> None:
        """Text as it is (a diff: its lines end in their own newlines)."""
        self.said.append(text)
        self.show(text)
