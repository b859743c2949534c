"""What upstream's tests, run stock and with a backport, say about the backport.

A test counts for the backport only where it fails (or errors) stock and **passes** with
it. Failing, skipping or timing out alike proves nothing here: the environment stopped it,
not the fix. A test that passes stock and fails with the backport is the backport's fault.
Every row keeps each run's first error line, so a reader sees why a test proves nothing.
"""

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SCHEMA_VERSION = 1
PROVES = "proves the fix"
NOTHING = "proves nothing here"
BREAKS = "fails with the backport"
_FAILED = ("failed", "error")


@dataclass(frozen=True)
class Row:
    test: str
    stock: str  # passed / failed / error / skipped / timed out / not run
    backport: str
    stock_error: str = ""  # the run's first error line (or skip reason) for this test
    backport_error: str = ""
    stock_where: str = ""  # where it was raised: path:line
    backport_where: str = ""


def judge(row: Row) -> str:
    if row.stock in _FAILED and row.backport == "passed":
        return PROVES
    if row.stock == "passed" and row.backport in _FAILED:
        return BREAKS
    return NOTHING


def describe_environment(environment: Mapping[str, Any]) -> str:
    """ "torch 2.14.1, no CUDA device": what decides whether upstream's harness runs."""
    if not environment:
        return ""
    parts = [f"torch {environment['torch']}"] if "torch" in environment else []
    devices = environment.get("cuda_devices")
    if devices == 0:
        parts.append("no CUDA device")
    elif devices is not None:
        parts.append(f"{devices} CUDA device{'s' if devices != 1 else ''}")
    return ", ".join(parts)


def _error(row: Row, run: str) -> str:
    line = row.stock_error if run == "stock" else row.backport_error
    where = row.stock_where if run == "stock" else row.backport_where
    return f"{line} ({where})" if line and where else line


def _all_fail_alike(rows: Sequence[Row], environment: str) -> str | None:
    """The summary when every run of every test failed: one cause, or the first of each."""
    if not all(r.stock in _FAILED and r.backport in _FAILED for r in rows):
        return None
    runs = 2 * len(rows)
    here = f" (this machine: {environment})" if environment else ""
    causes = {(r.stock_error, r.stock_where) for r in rows}
    causes |= {(r.backport_error, r.backport_where) for r in rows}
    if len(causes) == 1:
        line, where = causes.pop()
        place = f" in upstream's test code, {where}," if where.startswith("tests/") else ""
        at = f" at {where}" if where and not place else ""
        return (
            f"all {runs} runs fail alike, stock and with the backport,{place} so they prove "
            f"nothing here{here}: {line or 'no error line'}{at}"
        )
    return (
        f"all {runs} runs fail, stock and with the backport, so they prove nothing here{here}; "
        f"first errors: stock: {_error(rows[0], 'stock')}; "
        f"with the backport: {_error(rows[0], 'backport')}"
    )


def _nothing_proven(rows: Sequence[Row], environment: str) -> str:
    if all(r.stock == "skipped" and r.backport == "skipped" for r in rows):
        return "every upstream test was skipped here: they prove nothing (see the notes)"
    alike = _all_fail_alike(rows, environment)
    if alike is not None:
        return alike
    if all("timed out" in (r.stock, r.backport) for r in rows):
        return "every test timed out in a run: they prove nothing here (raise --timeout)"
    if all(r.stock == "passed" for r in rows):
        return "no upstream test fails without the backport: they prove nothing here"
    return (
        f"no upstream test fails stock and passes with the backport: {len(rows)} "
        "prove nothing here (see each run's first error line)"
    )


def verdict(rows: Sequence[Row], environment: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """(exit status, the one-line summary): 0 only where a test proves the fix and none
    fails because of the backport."""
    judged = [judge(row) for row in rows]
    broken = [row for row, j in zip(rows, judged, strict=True) if j == BREAKS]
    if broken:
        first = _error(broken[0], "backport")
        return 1, (
            f"{len(broken)} upstream test(s) pass stock and fail with the backport"
            + (f": {first}" if first else "")
        )
    proven = judged.count(PROVES)
    if proven and rows:
        rest = len(rows) - proven
        also = f"; {rest} prove nothing here" if rest else ""
        return 0, f"{proven} test(s) fail on stock and pass with the backport{also}"
    return 1, _nothing_proven(rows, describe_environment(environment or {}))


def document(
    backport_id: str,
    rows: Sequence[Row],
    *,
    commit: str,
    launcher: str,
    timeout_s: float | None,
    environment: Mapping[str, Any],
    notes: Sequence[str],
) -> dict[str, Any]:
    """The ``--json`` object (read by tools/gpu_run.sh and tools/upstream_tests_table.py)."""
    code, summary = verdict(rows, environment)
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "upstream-tests",
        "id": backport_id,
        "commit": commit,
        "launcher": launcher,
        "timeout_s": timeout_s,
        "environment": dict(environment),
        "exit_status": code,
        "summary": summary,
        "tests": [{**asdict(row), "judgement": judge(row)} for row in rows],
        "notes": list(notes),
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _why(test: Mapping[str, Any]) -> str:
    """Each run's first error line, once where both runs agree."""
    stock = Row(**{k: v for k, v in test.items() if k != "judgement"})
    first = {run: _error(stock, run) for run in ("stock", "backport")}
    if first["stock"] == first["backport"]:
        return first["stock"]
    return "; ".join(f"{run}: {line}" for run, line in first.items() if line)


def markdown(documents: Sequence[Mapping[str, Any]]) -> str:
    """One table for several ``--json`` documents: test id, stock, backport, and for each
    test that proves nothing (or fails with the backport) each run's first error line."""
    lines = [
        "| backport | test | stock | backport | judgement | first error line |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for doc in documents:
        for test in doc["tests"]:
            why = "" if test["judgement"] == PROVES else _why(test)
            cells = (doc["id"], test["test"], test["stock"], test["backport"])
            lines.append(
                "| " + " | ".join(_cell(str(c)) for c in (*cells, test["judgement"], why)) + " |"
            )
    lines.append("")
    for doc in documents:
        where = describe_environment(doc.get("environment", {}))
        lines.append(
            f"- {doc['id']} at {doc['commit'][:12]} ({doc['launcher']}"
            + (f"; {where}" if where else "")
            + f"): exit {doc['exit_status']}, {_cell(doc['summary'])}"
        )
    return "\n".join(lines) + "\n"


def text(doc: Mapping[str, Any]) -> str:
    """The terminal form: a row per test (stock / backport), under each test that does not
    prove the fix its runs' first error lines, the notes, then ``<id>: <summary>``."""
    rows = [("test", "stock / backport")]
    rows += [(t["test"], f"{t['stock']} / {t['backport']}") for t in doc["tests"]]
    width = max(len(left) for left, _ in rows)
    lines = [f"  {left.ljust(width)}  {right}" for left, right in rows[:1]]
    for (left, right), test in zip(rows[1:], doc["tests"], strict=True):
        lines.append(f"  {left.ljust(width)}  {right}")
        if test["judgement"] != PROVES and _why(test):
            lines.append(f"      {test['judgement']}: {_why(test)}")
    lines += [f"note: {note}" for note in doc["notes"]]
    lines.append(f"{doc['id']}: {doc['summary']}")
    return "\n".join(lines)
