"""Step six: the most valuable candidates first.

Sorted by, in turn: fix-like; reachable from a training path; needed (the release lacks
it: missing, drifted or partial); carryable by ``--from-pr`` as far as it can tell without
a child; then the fix score; then the newest merge first.
"""

from .model import Candidate


def _key(candidate: Candidate) -> tuple[bool, bool, bool, bool, int, str]:
    return (
        candidate.fix.fix_like,
        candidate.reach.reachable,
        candidate.needed,
        candidate.from_pr.carryable,
        candidate.fix.score,
        candidate.merge.date,
    )


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    """``candidates`` most valuable first, each with its ``rank`` (1 = first) set."""
    ordered = sorted(candidates, key=_key, reverse=True)
    for place, candidate in enumerate(ordered, start=1):
        candidate.rank = place
    return ordered
