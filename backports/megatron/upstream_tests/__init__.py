"""``backports upstream-tests ID --repo PATH``: upstream's own tests of a fix, on demand.

``UPSTREAM.toml`` may list ``upstream_tests``: pytest node ids in the upstream repository.
Their files (with the ``conftest.py``, ``__init__.py`` and helper modules of the test tree
they live in) are checked out of the user's Megatron-LM clone at the recorded SHA into a
temporary folder, and pytest runs them twice against the installed megatron-core, each
time in a child process: stock (``MEGATRON_BACKPORTS=0``, the start-up hook off) and with
the backport (``apply(only=ID, strict=True)`` from a ``-p`` plugin before collection; the
other backports skipped). One row per test, with each run's first error line
(judgement.py says when a test counts). Each run has a time limit (its unfinished
tests are ``timed out``); ``--launcher torchrun`` runs it under ``torchrun
--nproc_per_node 1`` for upstream's harness, which needs a process group. A SIGTERM stops
the child and removes the temporary folder before this process ends. The runs are
offline: a connection to anything but loopback fails, and a test that tried says it
needs the network.

This module is the one place that reads the catalog and the vendored manifests.
"""

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BackportError
from ..termination import sigterm_unwinds
from . import checkout as upstream_checkout
from .child import LAUNCHERS, RunResult, run_pytest
from .judgement import Row, verdict
from .judgement import document as _document

__all__ = ["LAUNCHERS", "Result", "Row", "document", "run", "run_upstream_tests", "verdict"]


@dataclass
class Result:
    """Everything one ``upstream-tests`` run found."""

    backport_id: str
    commit: str
    rows: list[Row]
    launcher: str
    timeout_s: float | None
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# What each run sets itself. The rest of the caller's MEGATRON_BACKPORTS_* (the verdict
# cache's place, plugins left out, upstream-only) goes on to both runs.
_DECIDED_HERE = ("MEGATRON_BACKPORTS", "MEGATRON_BACKPORTS_SKIP", "MEGATRON_BACKPORTS_SAID")


def _recorded(backport_id: str) -> tuple[list[str], str]:
    from ..catalog import by_id
    from ..vendored import read_upstream

    try:
        spec = by_id(backport_id)
    except KeyError as exc:  # its message names the known ids
        raise BackportError(str(exc.args[0])) from exc
    data = read_upstream(spec.vendored)
    tests = list(data.get("upstream_tests", []))
    if not tests:
        raise BackportError(f"{backport_id}: UPSTREAM.toml lists no upstream_tests")
    sha = data.get("merge_sha") or data.get("synced_sha") or data.get("head_sha")
    if not sha:
        raise BackportError(f"{backport_id}: UPSTREAM.toml records no commit to take them from")
    return tests, str(sha)


def _other_ids(backport_id: str) -> str:
    from ..catalog import entries  # the plugins' entries too: the hook would apply them

    return ",".join(spec.id for spec in entries() if spec.id != backport_id)


def _covers(requested: str, name: str) -> bool:
    """Whether the node id ``name`` is ``requested`` or one of its tests / parameters."""
    return name == requested or name.startswith((f"{requested}[", f"{requested}::"))


def _rows(tests: list[str], stock: RunResult, backported: RunResult) -> list[Row]:
    """One row per test either run reported; a requested test no run reported is ``not
    run``, or ``timed out`` in a run stopped at its limit."""
    names = list(dict.fromkeys([*stock.outcomes, *backported.outcomes]))
    reported = set(names)
    names += [t for t in tests if not any(_covers(t, n) for n in reported)]

    def outcome(run: RunResult, name: str) -> str:
        return run.outcomes.get(name, "timed out" if run.timed_out else "not run")

    def error(run: RunResult, name: str, key: str) -> str:
        found = run.errors.get(name, {}).get(key, "")
        if not found and key == "line" and name not in run.outcomes:
            found = "" if run.timed_out else run.last_line
        return found

    return [
        Row(
            name,
            outcome(stock, name),
            outcome(backported, name),
            error(stock, name, "line"),
            error(backported, name, "line"),
            error(stock, name, "where"),
            error(backported, name, "where"),
        )
        for name in names
    ]


def _notes(run: RunResult, label: str, timeout_s: float | None) -> list[str]:
    notes = [f"{label}: skipped: {reason}" for reason in dict.fromkeys(run.skips.values())]
    if run.network:
        tried = ", ".join(sorted(set(run.network.values()))[:3])
        notes.append(
            f"{label}: {len(run.network)} test(s) or the collection need the network "
            f"(refused: {tried}): upstream-tests runs offline"
        )
    if run.timed_out:
        notes.append(f"{label}: stopped at its time limit ({timeout_s:g} s)")
    elif not run.outcomes:  # pytest stopped before any test: say why, in its own last line
        notes.append(f"{label}: pytest ran no test (exit {run.returncode}): {run.last_line}")
    return notes


def run(
    backport_id: str,
    repo: Path,
    sha: str | None = None,
    *,
    launcher: str = "python",
    timeout_s: float | None = 600.0,
    log_dir: Path | None = None,
) -> Result:
    """Check out and run ``backport_id``'s upstream tests, stock and with the backport."""
    if launcher not in LAUNCHERS:
        raise BackportError(f"unknown launcher {launcher!r} (one of {', '.join(LAUNCHERS)})")
    tests, recorded = _recorded(backport_id)
    commit = upstream_checkout.resolve_commit(repo, sha or recorded)
    paths = upstream_checkout.files_for_tests(repo, commit, tests)
    base = {k: v for k, v in os.environ.items() if k not in _DECIDED_HERE}
    stock_env = {**base, "MEGATRON_BACKPORTS": "0"}
    backport_env = {
        **base,
        "MEGATRON_BACKPORTS_SKIP": _other_ids(backport_id),
        "BACKPORTS_UPSTREAM_TESTS_ID": backport_id,
    }
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="backports-upstream-") as name:
        folder = Path(name) / "upstream"
        upstream_checkout.check_out(repo, commit, paths, folder)
        options: dict[str, Any] = {"launcher": launcher, "timeout_s": timeout_s}
        stock = run_pytest(folder, tests, stock_env, name="stock", **options)
        backported = run_pytest(folder, tests, backport_env, name="backport", **options)
        if log_dir is not None:
            _keep_logs(Path(name), log_dir, backport_id)
    notes = _notes(stock, "stock", timeout_s) + _notes(backported, "with the backport", timeout_s)
    environment = stock.environment or backported.environment
    rows = _rows(tests, stock, backported)
    return Result(backport_id, commit, rows, launcher, timeout_s, environment, notes)


def document(result: Result) -> dict[str, Any]:
    """``result`` as the ``--json`` object."""
    return _document(
        result.backport_id,
        result.rows,
        commit=result.commit,
        launcher=result.launcher,
        timeout_s=result.timeout_s,
        environment=result.environment,
        notes=result.notes,
    )


def _keep_logs(scratch: Path, log_dir: Path, backport_id: str) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    for run_name in ("stock", "backport"):
        log = scratch / f"{run_name}.log"
        if log.is_file():
            (log_dir / f"{backport_id}-{run_name}.log").write_bytes(log.read_bytes())


def run_upstream_tests(
    backport_id: str, repo: Path, sha: str | None = None, notes: list[str] | None = None
) -> list[Row]:
    """Rows of (test, stock outcome, backport outcome, ...); a BackportError in one line.
    ``notes`` collects why a run ran no test at all."""
    result = run(backport_id, repo, sha)
    if notes is not None:
        notes.extend(result.notes)
    return result.rows
