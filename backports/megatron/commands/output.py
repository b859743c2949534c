"""What every command prints, and how: the table, the JSON, the notes, and a stdout that
outlives its reader.

**The table fits the terminal.** A report's reason runs to 300-450 characters: printed whole,
every row wraps into an unreadable block in an 80- or 120-column terminal. So on a terminal
a table fits its width: the columns that matter least are left out first while the others
leave the last column (the reason) too little room; then the start every reason shares
("megatron-core 0.19.2 lacks the fix: ") is said once under the table instead of on every
row, so that what differs between rows shows; what is still too long is cut with an
ellipsis. ``-v`` and ``--json`` give the reason in full, and so does a pipe or a file: what a
script or a log reads is never cut. Colours (the verdict, a check's ``FAIL``) only on a
terminal, never under ``NO_COLOR`` (https://no-color.org), added after the widths are
measured.

**JSON.** ``--json`` prints a bare list of reports, and readers outside this repository rely on
that (docs/activation.md: ``status --json`` prints a JSON list), so it stays a list. A list has
no room for what a reader wants beside it (the format's version, the counts, the notes), hence
``--format json-object``, chosen by name: a reader of the list is never handed an object::

    {"schema_version": 1, "command": "status", "summary": {...}, "reports": [...],
     "notes": [...], "warnings": [...]}

``summary`` always holds ``total`` and the counts per ``verdict`` and ``action``; a command adds
its own keys (``check``: ``ok``, ``failed``). A new key is no new version; a key removed or
changing meaning is. A document is built whole before it is written: never half of one.

**Notes.** The command prints its own words: other packages' known import notices are hidden
(``-v`` shows them), and a ``BackportWarning`` becomes a ``warning:`` line, on stderr in every
format. The table's other notes (the hook, a summary) follow it on stdout; with JSON, stdout
holds the JSON alone and they go to stderr.

**A reader that hangs up** (`backports check | head -1`) changes no exit status: once the pipe
is closed, what is written is dropped and the command runs on to its own end. A stdout that
is closed (`>&-`) is the same, and one line on stderr says the output went nowhere.

**Text from others is shown, never obeyed.** Commit subjects, PR titles, file names and a
plugin's reasons may hold terminal escapes: every command's stdout and stderr show control
characters escaped (``\x1b``), whatever the command printed them with (``terminal_safe``).
"""

import argparse
import errno
import json
import logging
import math
import os
import re
import shutil
import sys
import textwrap
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from ..errors import BackportWarning
from ..report import Report

# ---- the table -------------------------------------------------------------------------------

ELLIPSIS = "…"
MIN_LAST = 40  # the reason keeps at least this much while optional columns can go
_GAP = "  "
_PHRASE_END = ": "  # a shared start is dropped only up to the end of a whole phrase

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


def _shared_start(cells: Sequence[str]) -> str:
    """The start every cell shares, up to the end of its last whole phrase (``": "``), where
    there are several cells and each has more to say after it; else ""."""
    if len(cells) < 2:
        return ""
    common = os.path.commonprefix(list(cells))  # noqa: RUF071 (characters are what we want)
    end = common.rfind(_PHRASE_END)
    shared = common[: end + len(_PHRASE_END)] if end > 0 else ""
    return shared if shared and all(len(cell) > len(shared) for cell in cells) else ""


def render(rows: Sequence[Sequence[str]], layout: Layout, optional: Sequence[int] = ()) -> str:
    """``rows`` (the first is the titles) as aligned columns; the last one runs on unpadded.
    Each cell is ``terminal_safe`` first: measured as it is shown, and the colours added
    after are the only escapes in the result.

    ``optional``: indexes of columns that may be left out, first ones first, on a narrow
    terminal. With ``layout.width`` set, each line is cut to it (the last column loses its
    end to an ellipsis); where a cut would hide what differs between rows, the start all
    rows share is dropped from them and said once, on a line under the table.
    """
    rows = [[terminal_safe(cell) for cell in row] for row in rows]  # measured as shown
    kept = _kept_columns(rows, optional, layout.width)
    table = [[row[i] for i in kept] for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(kept) - 1)]
    shared = ""
    if layout.width is not None:
        room = layout.width - sum(w + len(_GAP) for w in widths)
        last = [cells[-1] for cells in table[1:]]
        if any(len(cell) > room for cell in last):
            shared = _shared_start(last)
        table = [table[0]] + [[*cells[:-1], cells[-1][len(shared) :]] for cells in table[1:]]
        table = [[*cells[:-1], _cut(cells[-1], room)] for cells in table]
    lines = [_line(cells, widths, layout.colour and i > 0) for i, cells in enumerate(table)]
    if shared:
        lines.append(fit_note(f'(every {table[0][-1]} above begins "{shared.strip()}")', layout))
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


def two_columns(rows: Sequence[tuple[str, str]]) -> str:
    """Plain aligned pairs, indented (help texts, the upstream tests' table)."""
    width = max(len(left) for left, _ in rows)
    return "\n".join(f"  {left.ljust(width)}  {right}" for left, right in rows)


# ---- the reports' columns ------------------------------------------------------------------

Column = tuple[str, Callable[[Report], str]]


def _upstream_label(report: Report) -> str:
    upstream = report.evidence.get("upstream") or {}
    repo = str(upstream.get("repo") or "")
    name = repo.removesuffix(".git").removeprefix("https://github.com/")
    return f"{name}#{upstream['pr']}" if upstream.get("pr") else "-"


def core_version(report: Report) -> str:
    """The probed megatron-core's version (the installed one, or an audit's candidate)."""
    return str((report.evidence.get("distribution") or {}).get("version") or "-")


ID: Column = ("id", lambda r: r.id)
VERDICT: Column = ("verdict", lambda r: str(r.verdict))
ACTION: Column = ("action", lambda r: str(r.action))
REASON: Column = ("reason", lambda r: r.reason)
UPSTREAM: Column = ("upstream", _upstream_label)
_CORE: Column = ("megatron-core", core_version)
_SOURCE: Column = ("source", lambda r: r.source)
STATUS_COLUMNS = (ID, UPSTREAM, _CORE, VERDICT, ACTION, _SOURCE, REASON)

# Left out first on a narrow terminal: what the id already says (upstream), what every row
# shares (megatron-core, candidate), where the entry comes from (source).
_OPTIONAL = ("source", "upstream", "megatron-core", "candidate")


def _report_table(reports: list[Report], columns: Sequence[Column], layout: Layout) -> str:
    titles = [title for title, _ in columns]
    rows = [titles, *([cell(r) for _, cell in columns] for r in reports)]
    optional = [titles.index(title) for title in _OPTIONAL if title in titles]
    return render(rows, layout, optional)


# ---- JSON ----------------------------------------------------------------------------------

FORMATS = ("table", "json", "json-object")
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
    warned: Sequence[str],
) -> dict[str, Any]:
    """The ``--format json-object`` document for ``command``'s ``reports``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "summary": {**summary(reports), **(extra_summary or {})},
        "reports": list(reports),
        "notes": list(notes),
        "warnings": [w.removeprefix("warning: ") for w in warned],
    }


def _jsonable(value: Any) -> Any:
    """``value`` as strict JSON: what a sniff's detail holds that JSON has no word for (an
    object, a set, bytes, NaN) becomes its ``repr``; keys become strings."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, str | int | float):
        return value
    return repr(value)


def emit(
    args: argparse.Namespace,
    reports: list[Report],
    notes: list[str],
    columns: Sequence[Column] = STATUS_COLUMNS,
    json_extra: Sequence[Column] = (),
    extra_summary: dict[str, Any] | None = None,
) -> None:
    """Reports as JSON or a table on stdout; warnings on stderr whatever the format.

    ``json_extra``: table columns that are no ``Report`` field, added to each JSON object.
    """
    warned = [*args.warning_notes, *(n for n in notes if n.startswith("warning:"))]
    notes = [n for n in notes if not n.startswith("warning:")]
    for note in warned:
        print(note, file=sys.stderr)
    if args.format == "table":
        layout = layout_for(sys.stdout, full=args.verbose)
        write_painted(_report_table(reports, columns, layout) + "\n")
        for note in notes:
            print(fit_note(note, layout))
        return
    data = [{**r.to_dict(), **{title: cell(r) for title, cell in json_extra}} for r in reports]
    shown: Any = data
    if args.format == "json-object":
        shown = document(args.command, data, extra_summary, notes, warned)
    sys.stdout.write(json.dumps(_jsonable(shown), indent=2, allow_nan=False) + "\n")
    for note in notes:
        print(note, file=sys.stderr)


# ---- other packages' notices, our warnings -------------------------------------------------

# Importing megatron-core on a machine without CUDA, Transformer Engine, Apex or absl prints
# about a dozen lines of torch and megatron notices before the command's table. They describe
# the machine, not the backports, and bury the result: exactly these are hidden.
# (category, start of the message) of notices raised with warnings.warn at import time.
KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (UserWarning, "Transformer Engine and Apex are not installed"),  # megatron.core.optimizer
    (UserWarning, "Apex is not installed"),  # megatron.core.models
    (UserWarning, "absl.logging is not installed"),  # megatron.core.hyper_comm_grid
    (DeprecationWarning, "The following imports from `dynamic_context.py`"),
    # megatron.core.models.mimo, imported by #6010's targets
    (UserWarning, "MimoModelConfig is experimental"),
    # megatron.core.extensions.transformer_engine_spec_provider without Transformer Engine,
    # reached by megatron-lm-6357's sniff (it builds a small model's layer spec on CPU)
    (UserWarning, "Only transformer-engine>=1.7.0 supports MoE experts"),
)

# (logger, start of the message) of notices logged at import time.
KNOWN_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("torch.utils.cpp_extension", "No CUDA runtime is found"),  # a CPU-only machine
)


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextmanager
def import_notices_hidden() -> Iterator[None]:
    """Hide the known import notices while the block runs (any other warning or log record
    still shows); restore the filters afterwards."""
    dropped = [(logging.getLogger(name), _DropPrefix(prefix)) for name, prefix in KNOWN_LOG_RECORDS]
    with warnings.catch_warnings():
        for category, prefix in KNOWN_WARNINGS:
            warnings.filterwarnings("ignore", message=re.escape(prefix), category=category)
        for logger, drop in dropped:
            logger.addFilter(drop)
        try:
            yield
        finally:
            for logger, drop in dropped:
                logger.removeFilter(drop)


@contextmanager
def root_logging_kept_off_stdout() -> Iterator[None]:
    """Python's last-resort handler (stderr, warnings and up) put on the root logger while
    the command runs, where it has none. Importing ``megatron.training`` (a target module of
    megatron-lm-6321) runs ``logging.basicConfig`` with a handler on stdout at INFO, which
    would print this tool's own INFO records into its table or JSON; basicConfig does nothing
    once the root logger has a handler, so what shows and where is as without that import."""
    root, handler = logging.getLogger(), logging.lastResort
    if root.handlers or handler is None:
        yield
        return
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


@contextmanager
def warnings_as_notes(notes: list[str]) -> Iterator[None]:
    """Collect each ``BackportWarning`` as a ``warning:`` note; others show as usual."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", BackportWarning)  # the api warns once by itself
        show = warnings.showwarning

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if issubclass(category, BackportWarning):
                notes.append(f"warning: {message}")
            else:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        yield


# ---- the command's streams: a stdout that outlives its reader, text shown escaped ------------

# What a terminal would act on rather than show: the C0 controls but tab and newline, DEL,
# the C1 controls (U+009B is a CSI on its own) and the bidirectional overrides and isolates
# (they reorder what is shown: CVE-2021-42574).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: "re.Match[str]") -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown escaped, as Python writes it in a
    string (ESC is ``\\x1b``): tab and newline stay. Commit subjects, PR titles, file names
    and a plugin's reasons come from others; printed raw, ``"\\x1b]0;...\\x07"`` would
    retitle the user's terminal and ``"\\x1b[2J"`` clear it."""
    return _CONTROLS.sub(_escaped, text)


_CLOSED = "backports: stdout is closed: the output was dropped"


class _CommandStream:
    """``sys.stdout`` or ``sys.stderr`` for one command.

    Every write is shown escaped (``terminal_safe``), to a terminal, a pipe or a file alike (a
    log is read on a terminal later); only ``write_painted`` (the table, whose cells were
    escaped before the colours were added) writes as is. JSON holds no control character
    anyway (``json.dumps`` escapes them).

    Once the stream cannot take more, what is written is dropped and the command runs on to
    its own exit status: a reader that hung up (EPIPE: `backports check | head -1`), or a
    stream that is closed (`>&-`: no stream at all, or EBADF). A ``BrokenPipeError`` or an
    ``AttributeError`` on None in the middle of the command would otherwise decide it. The
    file descriptor is pointed at /dev/null, so the interpreter's last flush at exit has
    nowhere to fail.
    """

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self.gone = stream is None  # writes are dropped from now on
        self.closed_under_us = stream is None  # gone for want of a stream, not of a reader
        self.dropped = False  # something written went nowhere for want of a stream

    def write(self, text: str) -> int:
        return self.write_painted(terminal_safe(text))

    def write_painted(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)  # type: ignore[union-attr]
            except (OSError, ValueError) as exc:
                self._hang_up(exc)
        self.dropped |= self.closed_under_us
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()  # type: ignore[union-attr]
            except (OSError, ValueError) as exc:
                self._hang_up(exc)
                self.dropped |= self.closed_under_us

    def isatty(self) -> bool:
        return not self.gone and _isatty(self._stream)

    def _hang_up(self, exc: OSError | ValueError) -> None:
        """Drop what follows where ``exc`` says the stream is gone; raise it where not (a
        full disk, a character the encoding lacks: the command's error, as ever)."""
        if isinstance(exc, BrokenPipeError):
            pass  # the reader hung up
        elif isinstance(exc, OSError) and exc.errno == errno.EBADF:
            self.closed_under_us = True  # `>&-` after start, or opened for reading only
        elif isinstance(exc, ValueError) and getattr(self._stream, "closed", False) is True:
            self.closed_under_us = True  # closed in this process
        else:
            raise exc
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # type: ignore[union-attr]
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _isatty(stream: TextIO | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or odd: treat it as a file
        return False


def write_painted(text: str) -> None:
    """``text`` on stdout as it is: its colour codes are ours, and every other part of it
    was made ``terminal_safe`` already."""
    stream = sys.stdout
    painted = getattr(stream, "write_painted", None)
    (painted or stream.write)(text)


@contextmanager
def command_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` for the block: text shown escaped, writes after the
    stream is gone dropped; if stdout was closed (not a reader that hung up), one line on
    stderr says so at the end. The exit status stays the command's own: ``check``'s is
    what CI reads, and it must not turn green or red with where its table went.

    Where CPython and pip differ: CPython with no stdout at all (``sys.stdout`` is None)
    prints nothing and goes on, as here; when its last flush fails it exits 120, and pip
    says ``ERROR: Pipe to stdout was broken`` and exits 1. A closed stdout is said (the
    output someone asked for went nowhere); a reader that hung up is not (`| head -1` had
    what it wanted), as a program killed by SIGPIPE says nothing.
    """
    stdout, stderr = sys.stdout, sys.stderr
    ours_out, ours_err = _CommandStream(stdout), _CommandStream(stderr)
    sys.stdout, sys.stderr = ours_out, ours_err
    try:
        yield
    finally:
        try:
            ours_out.flush()  # here, while a closed pipe is still dropped
            if ours_out.dropped:
                print(_CLOSED, file=ours_err)
            ours_err.flush()
        finally:
            sys.stdout, sys.stderr = stdout, stderr


stdout_outliving_its_reader = command_streams  # the name it had
