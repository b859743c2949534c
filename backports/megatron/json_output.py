"""``--format json-object``: the reports in one JSON object, with a schema version and a summary.

``--json`` prints a bare list of reports, and readers outside this repository rely on that
(DESIGN.md: ``status --json`` prints a JSON list), so it stays a list. A list has no room
for what a reader wants beside it (the format's version, the counts, the notes), hence this
second format, chosen by name: a reader of the list can never be handed an object.

    {"schema_version": 1, "command": "status", "summary": {...}, "reports": [...],
     "notes": [...], "warnings": [...]}

``summary`` always holds ``total`` and the counts per ``verdict`` and ``action``; a
command adds its own keys (``check``: ``ok``, ``failed``). A new key is no new version; a
key removed or changing meaning is.
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SCHEMA_VERSION", "document", "summary"]

SCHEMA_VERSION = 1


def summary(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts over ``reports`` (as ``Report.to_dict()`` gives them)."""
    return {
        "total": len(reports),
        "verdicts": dict(Counter(str(r["verdict"]) for r in reports)),
        "actions": dict(Counter(str(r["action"]) for r in reports)),
    }


def document(
    command: str,
    reports: Sequence[Mapping[str, Any]],
    extra_summary: Mapping[str, Any] | None,
    notes: Sequence[str],
    warnings: Sequence[str],
) -> dict[str, Any]:
    """The JSON object for ``command``'s ``reports``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "summary": {**summary(reports), **(extra_summary or {})},
        "reports": list(reports),
        "notes": list(notes),
        "warnings": [w.removeprefix("warning: ") for w in warnings],
    }
