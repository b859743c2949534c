"""Carry one pull request's change onto the installed text of a symbol that drifted.

A three-way merge of the symbol alone (``git merge-file``: the installed text is "ours",
the pull request's base the ancestor, its new text "theirs") applies this pull request's
hunks and nothing else: a later commit that rewrote the symbol upstream (for #6624, #6252's
``ctx.input_dtype``) never comes along, as it would with a copy of the merged text. A hunk
that does not apply cleanly stops the derivation and is shown.
"""

import subprocess
import tempfile
from pathlib import Path

from .errors import NotProven, Reason

_MARKERS = ("<<<<<<< ", "||||||| ", "=======", ">>>>>>> ")


class Conflict(NotProven):
    """A hunk of the pull request does not apply to the installed text (shown)."""

    default_reason = Reason.CONFLICT

    def base_lines(self) -> list[str]:
        """The pull request's base side of the first conflicting hunk (diff3's middle)."""
        lines = str(self).splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith(_MARKERS[1])), None)
        if start is None:
            return []
        end = next((i for i in range(start, len(lines)) if lines[i] == _MARKERS[2]), start + 1)
        return lines[start + 1 : end]


def _first_conflict(text: str) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(_MARKERS[0]))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(_MARKERS[3]))
    return "\n".join(lines[start : end + 1])


def merge_symbol(installed: str, base: str, new: str, name: str) -> str:
    """``installed`` with the change ``base`` -> ``new`` applied; ``Conflict`` if it does
    not apply. Git runs on three files in a private folder, never in a repository."""
    with tempfile.TemporaryDirectory(prefix="backports-from-pr-merge-") as folder:
        paths = []
        for label, text in (("installed", installed), ("base", base), ("pr", new)):
            path = Path(folder) / label
            path.write_text(text, encoding="utf-8")
            paths.append(str(path))
        labels = ["-L", "installed", "-L", "pull request's base", "-L", "pull request"]
        done = subprocess.run(
            ["git", "merge-file", "-p", "--diff3", *labels, *paths],
            cwd=folder,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode < 0 or done.returncode > 127:
        raise NotProven(f"git merge-file failed on {name}: {done.stderr.strip()}")
    if done.returncode > 0:
        hunk = _first_conflict(done.stdout)
        raise Conflict(
            f"{name}: {done.returncode} hunk(s) of the pull request do not apply to the "
            f"installed text (the first is below)\n{hunk}"
        )
    return done.stdout
