"""Pick one backport's report out of what apply / status / revert (or ``--json``) return."""

from collections.abc import Iterable
from typing import Any


def report_for(reports: Iterable[Any], backport_id: str) -> Any:
    """The one report (a ``Report`` or a ``--json`` dict) with this id; fails loudly otherwise."""
    reports = list(reports)
    found = [r for r in reports if (r["id"] if isinstance(r, dict) else r.id) == backport_id]
    assert len(found) == 1, f"{len(found)} reports for {backport_id}: {reports!r}"
    return found[0]
