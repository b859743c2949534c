"""``--derive K``: ``backports new --from-pr N`` on the top K candidates that still need
carrying (needed, not carried by an entry, with a pull-request number) and that ``--from-pr``
would not refuse before its first child (its verdict ``carryable``: a refused one's outcome
is its verdict already), one child each.

Each child is a fresh interpreter (``python -I``: no code from the caller's folder or
environment) run in a private scratch folder; the plugin it writes goes to
``./mlm-pr-<N>-backport`` of the caller's folder, as ``backports new --from-pr`` would
put it. Its exit status and its last line are the candidate's outcome.
"""

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .model import Candidate

# Shows one line of progress as it comes (the commands wing: stderr).
Progress = Callable[[str], object]


def to_derive(candidates: list[Candidate], count: int) -> list[Candidate]:
    """The first ``count`` ranked candidates still to carry."""
    wanted = [
        c
        for c in candidates
        if c.needed and not c.carried_by and c.merge.pr is not None and c.from_pr.carryable
    ]
    return wanted[:count]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def derive_one(candidate: Candidate, clone: Path, into: Path) -> dict[str, Any]:
    number = candidate.merge.pr
    dest = into / f"mlm-pr-{number}-backport"
    argv = [sys.executable, "-I", "-m", "backports.megatron", "new", "--from-pr", str(number)]
    argv += ["--repo", str(clone), "--dest", str(dest)]
    with tempfile.TemporaryDirectory(prefix="backports-candidates-") as scratch:
        done = subprocess.run(
            argv, cwd=scratch, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
        )
    said = _last_line(done.stderr) if done.returncode else _last_line(done.stdout)
    return {
        "exit": done.returncode,
        "dest": str(dest) if done.returncode == 0 or dest.exists() else None,
        "said": said,
    }


def derive(
    candidates: list[Candidate], count: int, clone: Path, into: Path, progress: Progress
) -> None:
    """Each chosen candidate's ``derived`` outcome, set in rank order; a line to ``progress``
    before each child (the commands wing shows it on stderr)."""
    chosen = to_derive(candidates, count)
    for place, candidate in enumerate(chosen, start=1):
        progress(f"backports candidates: deriving #{candidate.merge.pr} ({place}/{len(chosen)})")
        candidate.derived = derive_one(candidate, clone, into)
