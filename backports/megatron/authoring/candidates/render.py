"""The last step: the ranked table for an 80-column terminal, or the JSON document with
every field. Strings from upstream (subjects, bodies, paths) reach a terminal only through
``printable``: a control character in a commit message is shown escaped, never obeyed."""

import json
import re
import textwrap
import unicodedata
from dataclasses import asdict
from typing import Any

from .model import Candidate, Range

WIDTH = 80
SCHEMA_VERSION = 1
_SHORT_STATE = {"not shipped": "outside", "no code change": "cosmetic"}
_SHORT_REACH = {"training": "train", "inference": "infer", "experimental": "exper"}
# (heading, width) of each column but the last (the subject takes what is left).
_COLUMNS = (("#", 3), ("PR", 6), ("state", 8), ("fix", 8), ("reach", 5), ("carried", 7),
            ("from-pr", 9))  # fmt: skip


def printable(text: str) -> str:
    """``text`` with every control or format character escaped (``\\x1b``, ``\\u202e``)."""
    out = []
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _cells(c: Candidate) -> list[str]:
    carried = "-"
    if c.carried_by:
        carried = "builtin" if c.carried_by[0].source == "builtin" else "plugin"
    return [
        str(c.rank),
        f"#{c.merge.pr}" if c.merge.pr else "-",
        _SHORT_STATE.get(c.state, c.state),
        c.fix.category if c.fix.fix_like or c.fix.category == "refactor" else "-",
        _SHORT_REACH.get(c.reach.where, "other"),
        carried,
        c.from_pr.verdict,
        printable(c.merge.subject),
    ]


def _row(cells: list[str]) -> str:
    parts = []
    used = 0
    for (_, width), cell in zip(_COLUMNS, cells, strict=False):
        parts.append(_cut(cell, width).ljust(width))
        used += width + 1
    parts.append(_cut(cells[-1], WIDTH - used))
    return " ".join(parts).rstrip()


def _wrapped(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def table(candidates: list[Candidate], head: dict[str, Any]) -> str:
    """The header lines, then one row per candidate, most valuable first."""
    span: Range = head["range"]
    main = re.sub(r"^refs/(heads|remotes)/", "", span.main_ref)
    lines = _wrapped(
        printable(
            f"{head['installed']} installed; clone {head['clone']} ({main} at {span.tip[:10]})"
        )
    )
    lines += _wrapped(printable(f"range: after {span.base[:12]}, the {span.how}"))
    counts = head["counts"]
    lines += _wrapped(
        f"{counts['merges']} merges; {counts['listed']} change megatron/ code (below); "
        f"{counts['left_out']} left out (no megatron/ Python: examples/, tests/, docs, CI); "
        f"{counts['carried']} carried by an entry, {counts['present']} already present"
    )
    lines.append("")
    lines.append(_row([name for name, _ in _COLUMNS] + ["subject"]))
    lines += [_row(_cells(c)) for c in candidates]
    for c in candidates:
        if c.derived is not None:
            said = printable(str(c.derived.get("said", "")))
            lines += _wrapped(f"--derive #{c.merge.pr}: exit {c.derived['exit']}: {said}")
    return "\n".join(lines)


def _candidate(c: Candidate) -> dict[str, Any]:
    return {
        "rank": c.rank,
        "pr": c.merge.pr,
        "sha": c.merge.sha,
        "parent": c.merge.parent,
        "subject": c.merge.subject,
        "body": c.merge.body,
        "date": c.merge.date,
        "files": list(c.merge.files),
        "state": c.state,
        "needed": c.needed,
        "symbols": [asdict(s) for s in c.symbols],
        "fix": {**asdict(c.fix), "fix_like": c.fix.fix_like},
        "reach": asdict(c.reach),
        "carried_by": [asdict(carrier) for carrier in c.carried_by],
        "release_commit": c.release_commit,
        "from_pr": {**asdict(c.from_pr), "carryable": c.from_pr.carryable},
        "derived": c.derived,
        "notes": list(c.notes),
    }


def document(candidates: list[Candidate], head: dict[str, Any]) -> str:
    """The JSON document: what was read, and every candidate with every field."""
    return json.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "installed": head["installed"],
            "clone": head["clone"],
            "range": asdict(head["range"]),
            "counts": head["counts"],
            "seconds": head["seconds"],
            "candidates": [_candidate(c) for c in candidates],
        },
        indent=2,
    )
