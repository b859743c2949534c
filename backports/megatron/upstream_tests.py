"""``backports upstream-tests ID --repo PATH``: upstream's own tests of a fix, on demand.

``UPSTREAM.toml`` may list ``upstream_tests``: pytest node ids in the upstream repository.
Their files (with the ``conftest.py``, ``__init__.py`` and helper modules of the test tree
they live in) are checked out of the user's Megatron-LM clone at the recorded SHA into a
temporary folder, and pytest runs them twice against the installed megatron-core, each
time in a child process: stock (``MEGATRON_BACKPORTS=0``, the start-up hook off) and with
the backport (``apply(only=ID, strict=True)`` from a ``-p`` plugin before collection; the
other backports skipped). One row per test; exit 1 if any test fails with the backport, or
if none fails without it (the tests then prove nothing about this fix).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import BackportError

__all__ = ["Row", "run_upstream_tests", "verdict"]

PLUGIN = "backports.megatron._apply_for_pytest"
_FAILED = ("failed", "error")


@dataclass(frozen=True)
class Row:
    test: str
    stock: str  # passed / failed / error / skipped / not run
    backport: str


def _recorded(backport_id: str) -> tuple[list[str], str]:
    from .catalog import by_id
    from .vendored import read_upstream

    try:
        spec = by_id(backport_id)
    except KeyError as exc:
        raise BackportError(f"unknown backport {backport_id!r}") from exc
    data = read_upstream(spec.vendored)
    tests = list(data.get("upstream_tests", []))
    if not tests:
        raise BackportError(f"{backport_id}: UPSTREAM.toml lists no upstream_tests")
    sha = data.get("merge_sha") or data.get("synced_sha") or data.get("head_sha")
    if not sha:
        raise BackportError(f"{backport_id}: UPSTREAM.toml records no commit to take them from")
    return tests, str(sha)


def _commit(repo_path: Path, sha: str) -> Any:
    try:
        import git
    except ImportError as exc:
        raise BackportError("upstream-tests needs gitpython: pip install gitpython") from exc
    try:
        repo = git.Repo(repo_path)
        return repo.commit(sha)
    except (git.GitError, ValueError, OSError) as exc:
        raise BackportError(
            f"{repo_path} has no commit {sha} (fetch it into that clone first): {exc}"
        ) from exc


def _files_needed(commit: Any, tests: list[str]) -> list[str]:
    """The test files, and every .py file of the test tree they sit in (helpers such as
    ``tests/unit_tests/test_utilities.py``, conftests, packages' ``__init__``)."""
    roots = {PurePosixPath(test.split("::")[0]).parts[0] for test in tests}
    wanted = []
    for item in commit.tree.traverse():
        path = PurePosixPath(item.path)
        if item.type == "blob" and path.parts[0] in roots and path.suffix == ".py":
            wanted.append(item.path)
    for test in tests:
        if test.split("::")[0] not in wanted:
            raise BackportError(f"{test.split('::')[0]} does not exist at {commit.hexsha}")
    return wanted


def _check_out(commit: Any, paths: list[str], folder: Path) -> None:
    for path in paths:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((commit.tree / path).data_stream.read())


def _outcomes(report: Path, run: str, notes: list[str]) -> dict[str, str]:
    """node id -> outcome, as the child's plugin wrote them; a note per skip reason."""
    if not report.is_file():
        return {}
    data = json.loads(report.read_text(encoding="utf-8"))
    for reason in dict.fromkeys(data.get("skips", {}).values()):
        notes.append(f"{run}: skipped: {reason}")
    return {str(k): str(v) for k, v in data.get("outcomes", {}).items()}


def _run(
    folder: Path, tests: list[str], env: dict[str, str], plugin: bool, notes: list[str]
) -> dict[str, str]:
    report = folder.parent / f"{folder.name}-{'backport' if plugin else 'stock'}.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN]
    command += ["--rootdir", str(folder), *tests]
    env = {**env, "PYTHONPATH": os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])}
    env["BACKPORTS_UPSTREAM_TESTS_REPORT"] = str(report)
    done = subprocess.run(command, cwd=folder, env=env, check=False, capture_output=True, text=True)
    run = "with the backport" if plugin else "stock"
    outcomes = _outcomes(report, run, notes)
    if not outcomes:  # pytest stopped before any test: say why, in its own last line
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        notes.append(
            f"{run}: pytest ran no test (exit {done.returncode}): {lines[-1] if lines else ''}"
        )
    return outcomes


def run_upstream_tests(
    backport_id: str, repo: Path, sha: str | None = None, notes: list[str] | None = None
) -> list[Row]:
    """Rows of (test, stock outcome, backport outcome); a BackportError in one line.
    ``notes`` collects why a run ran no test at all."""
    notes = [] if notes is None else notes
    from .catalog import CATALOG

    tests, recorded = _recorded(backport_id)
    commit = _commit(repo, sha or recorded)
    others = ",".join(spec.id for spec in CATALOG if spec.id != backport_id)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    with tempfile.TemporaryDirectory(prefix="backports-upstream-tests-") as name:
        folder = Path(name) / "upstream"
        _check_out(commit, _files_needed(commit, tests), folder)
        stock = _run(folder, tests, {**base, "MEGATRON_BACKPORTS": "0"}, False, notes)
        backported = _run(
            folder,
            tests,
            {**base, "MEGATRON_BACKPORTS_SKIP": others, "BACKPORTS_UPSTREAM_TESTS_ID": backport_id},
            True,
            notes,
        )
    names = list(dict.fromkeys([*stock, *backported])) or tests
    return [Row(n, stock.get(n, "not run"), backported.get(n, "not run")) for n in names]


def verdict(rows: list[Row]) -> tuple[int, str]:
    """(exit status, the one-line summary)."""
    broken = [row.test for row in rows if row.backport not in ("passed", "skipped")]
    caught = [row.test for row in rows if row.stock in _FAILED]
    if all(row.backport == "skipped" for row in rows):
        return 1, "every upstream test was skipped here: they prove nothing (see the notes)"
    if broken:
        return 1, f"{len(broken)} upstream test(s) do not pass with the backport"
    if not caught:
        return 1, "no upstream test fails without the backport: they prove nothing here"
    return 0, f"{len(caught)} test(s) fail on stock and pass with the backport"
