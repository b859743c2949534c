"""The errors a sync reports: each a ``BackportError``, so one base class covers every
user-facing error of the tool (exit status 2 from ``backports sync``, nothing written)."""

from ..errors import BackportError


class SyncError(BackportError):
    """Base of every error the sync reports (exit status 2, nothing written)."""


class UsageError(SyncError):
    """A bad argument or manifest: ``--backport``, ``--sha``, ``--repo``, ``UPSTREAM.toml``."""


class FetchError(SyncError):
    """The upstream repository, or the ref asked for, could not be fetched."""


class RevisionError(SyncError):
    """The SHA names no commit, or more than one, in the fetched repository."""


class SourceError(SyncError):
    """The upstream source does not hold the symbol as a usable function or method."""


class RewriteError(SyncError):
    """The code cannot be vendored with live look-ups, or the result is broken."""


class WriteError(SyncError):
    """The staged folder could not be written or swapped into place."""


class Interrupted(SyncError):
    """Ctrl-C: the message says which pair of files the vendored folder holds."""


class Refused(SyncError):
    """The commit's code does not show the fix (exit status 1; ``--force`` writes it)."""
