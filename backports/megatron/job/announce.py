"""The job's one warning per backport: a skip (or an install that could not reach what it
fixes) said once, by rank 0, not again in the processes it starts.

An install is logged at INFO; a backport skipped (``upstream``, ``incompatible``, ``absent``,
or ``needed`` but not proven in this environment yet) gets one ``BackportWarning``, and so
does an install with something the user must act on (objects built before a constructor
fix); a backport the user turned off gets none. The same news in a child process is not
said again (``interpreter.once_per_job``); another reason (a new sniff, another version) is.
"""

import hashlib
import logging
import warnings

from ..errors import BackportWarning
from ..interpreter import once_per_job
from ..report import Action, Report, Verdict
from ..session import SESSION

_LOG = logging.getLogger(__name__)


def _said_key(report: Report) -> str:
    """id:verdict:<digest of the reason>: another reason (a new sniff, another version) is
    news, the same one in a child process is not."""
    digest = hashlib.sha256(report.reason.encode()).hexdigest()[:12]
    return f"{report.id}:{report.verdict}:{digest}"


def _warn_shown(message: str, stacklevel: int) -> bool:
    """Warn through the user's filters; whether the warning was shown (not dropped by an
    ``ignore`` filter or a ``once`` already spent). An ``error`` filter raises, as ever."""
    with warnings.catch_warnings(record=True) as caught:  # keeps the filters as they are
        warnings.warn(message, BackportWarning, stacklevel=stacklevel + 1)
    for shown in caught:
        warnings.showwarning(shown.message, shown.category, shown.filename, shown.lineno)
    return bool(caught)


def _news(report: Report) -> str | None:
    """The warning ``report`` calls for, or None (an install is logged, not warned)."""
    if report.action is Action.INSTALLED:
        _LOG.info("installed %s: %s", report.id, report.reason)
        if report.evidence.get("existing_instances"):
            return f"megatron-backports: {report.id} installed, but {report.reason}"
        return None
    if report.action is not Action.SKIPPED or report.verdict is Verdict.DISABLED:
        return None  # a disabled backport is the user's own choice
    return f"megatron-backports: {report.id} not applied ({report.verdict}): {report.reason}"


def announce(report: Report, stacklevel: int = 3) -> None:
    """One BackportWarning per backport, verdict and reason per job. ``stacklevel`` 3 names
    the caller of the function that calls this one (``apply``)."""
    message = _news(report)
    if message is None:
        return
    said = _said_key(report)
    with SESSION.lock:
        if said in SESSION.warned:
            return
        SESSION.warned.add(said)
    # Rank 0 only, and not again in the workers and spawn children of a process that warned.
    if once_per_job.may_say(said):
        if _warn_shown(message, stacklevel):
            once_per_job.record(said)  # only what was shown: a child may show what was dropped
    else:
        _LOG.debug("%s (said once per job: by rank 0, or by a parent process)", message)


def forget(backport_id: str) -> None:
    """A later decision about ``backport_id`` is news again (after ``revert``)."""
    with SESSION.lock:
        SESSION.warned.difference_update(
            {key for key in SESSION.warned if key.startswith(f"{backport_id}:")}
        )
    once_per_job.release(f"{backport_id}:")
