"""The commands' tables, fitted to the terminal they are printed on.

A report's reason runs to 300-450 characters: printed whole, every row wraps into an
unreadable block in an 80- or 120-column terminal. So, on a terminal, a table fits its
width: the columns that matter least (``optional``) are left out first while the others
leave too little room, then the last column (the reason) is cut with an ellipsis. ``-v``
and ``--json`` give the reason in full, and so does a pipe or a file: what a script or a
log reads is never cut.

Colours (the verdict, a check's ``FAIL``) only on a terminal, never under ``NO_COLOR``
(https://no-color.org): they are added after the widths are measured, so they never
change the layout.

Strings in, a string out: nothing here knows what a report is.
"""

import os
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

__all__ = ["ELLIPSIS", "MIN_LAST", "Layout", "fit_note", "layout_for", "render"]

ELLIPSIS = "…"
MIN_LAST = 40  # the reason keeps at least this much while optional columns can go
_GAP = "  "

# SGR codes: red for what fails a check, yellow for what asks a human to act.
_RED, _YELLOW, _GREEN, _RESET = "\x1b[31m", "\x1b[33m", "\x1b[32m", "\x1b[0m"
_COLOURS: Mapping[str, str] = {
    "FAIL": _RED,
    "incompatible": _RED,
    "upstream": _YELLOW,
    "ok": _GREEN,
}


@dataclass(frozen=True)
class Layout:
    """How to print: the width to fit (None: lines in full) and whether to colour."""

    width: int | None
    colour: bool


def layout_for(stream: TextIO, full: bool = False) -> Layout:
    """The layout for ``stream``: fitted and coloured on a terminal; in full elsewhere.

    ``full`` (the commands' ``-v``) keeps lines whole on a terminal too.
    """
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: treat it as a file
        tty = False
    width = shutil.get_terminal_size().columns if tty and not full else None
    colour = tty and "NO_COLOR" not in os.environ
    return Layout(width, colour)


def _line(cells: Sequence[str], widths: Sequence[int], colour: bool) -> str:
    def paint(cell: str, padded: str) -> str:
        code = _COLOURS.get(cell) if colour else None
        return f"{code}{cell}{_RESET}{padded[len(cell) :]}" if code else padded

    padded = [paint(c, c.ljust(w)) for c, w in zip(cells, widths, strict=False)]
    return _GAP.join([*padded, paint(cells[-1], cells[-1])])


def _cut(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    return text[: max(room - 1, 0)].rstrip() + ELLIPSIS


def _kept_columns(
    rows: Sequence[Sequence[str]], optional: Sequence[int], width: int | None
) -> list[int]:
    """The column indexes to print: drop ``optional`` ones, in order, while the fixed part
    leaves the last column fewer than ``MIN_LAST`` characters of ``width``."""
    kept = list(range(len(rows[0])))
    if width is None:
        return kept
    for index in optional:
        fixed = sum(max(len(row[i]) for row in rows) + len(_GAP) for i in kept[:-1])
        if width - fixed >= MIN_LAST:
            break
        kept.remove(index)
    return kept


def render(rows: Sequence[Sequence[str]], layout: Layout, optional: Sequence[int] = ()) -> str:
    """``rows`` (the first is the titles) as aligned columns; the last one runs on unpadded.

    ``optional``: indexes of columns that may be left out, first ones first, on a narrow
    terminal. With ``layout.width`` set, each line is cut to it (the last column loses its
    end to an ellipsis).
    """
    kept = _kept_columns(rows, optional, layout.width)
    table = [[row[i] for i in kept] for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(kept) - 1)]
    lines = []
    for index, cells in enumerate(table):
        if layout.width is not None:
            room = layout.width - sum(w + len(_GAP) for w in widths)
            cells = [*cells[:-1], _cut(cells[-1], room)]
        lines.append(_line(cells, widths, layout.colour and index > 0))  # titles: plain
    return "\n".join(lines)


def fit_note(note: str, layout: Layout) -> str:
    """A note under the table (the hook's path, a summary), wrapped at spaces to the width,
    its later lines indented: unlike a reason, a note is never cut, and a path in it is
    never split (a word longer than the width stands alone on its line)."""
    if layout.width is None or len(note) <= layout.width:
        return note
    return textwrap.fill(
        note,
        layout.width,
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
