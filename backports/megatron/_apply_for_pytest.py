"""A pytest plugin (``-p backports.megatron._apply_for_pytest``) for ``upstream-tests``.

In the child pytest that runs upstream's tests: with ``BACKPORTS_UPSTREAM_TESTS_ID`` set,
it applies that backport (strictly: a refusal fails the run) before any test module is
collected; in both runs it writes each test's outcome, by node id, to the JSON file
``BACKPORTS_UPSTREAM_TESTS_REPORT`` names.
"""

import json
import os
from typing import Any

_outcomes: dict[str, str] = {}
_skips: dict[str, str] = {}  # node id -> why it was skipped (a CUDA-only test on CPU, ...)


def pytest_configure(config: Any) -> None:
    backport_id = os.environ.get("BACKPORTS_UPSTREAM_TESTS_ID")
    if backport_id:
        from backports.megatron import apply

        apply(backport_id, strict=True)


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" or report.outcome != "passed":
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
        else:
            outcome = str(report.outcome)
        if _outcomes.get(report.nodeid) in (None, "passed"):
            _outcomes[report.nodeid] = outcome
        if report.skipped and isinstance(report.longrepr, tuple):
            _skips[report.nodeid] = str(report.longrepr[-1]).removeprefix("Skipped: ")


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _outcomes[report.nodeid] = "error"
    elif report.skipped and isinstance(report.longrepr, tuple):
        # A module-level skip (a test file that needs a GPU or Transformer Engine): its
        # tests are never collected, so the file is the row, with the reason as a note.
        _outcomes[report.nodeid] = "skipped"
        _skips[report.nodeid] = str(report.longrepr[-1]).removeprefix("Skipped: ")


def pytest_unconfigure(config: Any) -> None:
    path = os.environ.get("BACKPORTS_UPSTREAM_TESTS_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"outcomes": _outcomes, "skips": _skips}, handle)
