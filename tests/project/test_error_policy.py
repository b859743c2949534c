"""One error policy for every command (issue 43 item 5): the wings return reports or raise
the project's typed errors (``BackportError``); only the commands wing (``commands/``, and
``cli.py``, its face) prints them and picks the exit status.

Guarded by reading the source: outside the commands wing nothing prints, writes on stdout or
stderr, or ends the process, except where the allow-list below says why it must.
"""

import ast
import shutil
from pathlib import Path

import pytest

from backports.megatron import cli
from backports.megatron.sync import commands as sync_commands
from backports.megatron.sync.report import SyncReport
from tests.paths import ROOT

PACKAGE = ROOT / "backports" / "megatron"

# Where the commands' output and exit statuses are made.
_COMMANDS_WING = ("commands/", "cli.py")

# A module named ``*_child.py`` is the entry point of a child interpreter the tool starts:
# its stdout is its answer to the parent, its exit status the parent's to read.
_CHILD_SUFFIX = "_child.py"

# (module, enclosing function) -> why it may print or end the process itself.
_ALLOWED = {
    ("termination.py", "sigterm_unwinds"): "a SIGTERM unwound through the cleanup ends as one",
    ("sync/verify.py", "child_main"): "the sniff's child interpreter: its answer on stdout",
    ("__init__.py", "_say_hook_failed"): "the start-up hook in a job: no command to print it",
    ("catalog/_plugins.py", "_say_now"): "a plugin import that hangs: said now, from a thread",
    ("interpreter/forked_zygote.py", "fork"): "the forked zygote: a child that must never return",
}


def _is_output_or_exit(node: ast.AST) -> str | None:
    """What ``node`` does of the forbidden: print, sys.exit, a write on stdout/stderr, or
    raise SystemExit; else None."""
    if isinstance(node, ast.Raise) and node.exc is not None:
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(raised, ast.Name) and raised.id == "SystemExit":
            return "raise SystemExit"
    if not isinstance(node, ast.Call):
        return None
    called = ast.unparse(node.func)
    if called in ("print", "exit", "quit", "sys.exit", "os._exit"):
        return called
    if called in ("sys.stdout.write", "sys.stderr.write"):
        return called
    return None


def _findings(module: str, source: str) -> list[tuple[str, str, int, str]]:
    """(module, enclosing function, line, what) for each forbidden call in ``source``."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            what = _is_output_or_exit(child)
            if what is not None:
                found.append((module, inner, child.lineno, what))
            visit(child, inner)

    visit(ast.parse(source, module), "<module>")
    return found


def _findings_in(path: Path) -> list[tuple[str, str, int, str]]:
    return _findings(path.relative_to(PACKAGE).as_posix(), path.read_text(encoding="utf-8"))


def _outside_the_commands_wing() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(PACKAGE).as_posix().startswith(_COMMANDS_WING)
        and not path.name.endswith(_CHILD_SUFFIX)
    ]


def test_only_the_commands_wing_prints_or_ends_the_process() -> None:
    found = [f for path in _outside_the_commands_wing() for f in _findings_in(path)]
    offenders = [
        f"{module}:{line} {what} (in {function})"
        for module, function, line, what in found
        if (module, function) not in _ALLOWED
    ]
    assert offenders == [], "return a report or raise a BackportError; commands/ prints"
    # Each exception still stands where it says (a stale one would let the next one in).
    assert {(module, function) for module, function, _, _ in found} >= set(_ALLOWED)


def test_the_guard_sees_each_way_out() -> None:
    source = (
        "import os, sys\n"
        "print('x')\n"
        "def f():\n"
        "    sys.exit(1)\n"
        "    sys.stderr.write('y')\n"
        "    raise SystemExit(2)\n"
        "def g():\n"
        "    os._exit(3)\n"
        "CHILD = \"print('a child script in a string is not this module printing')\"\n"
    )
    seen = [(function, what) for _, function, _, what in _findings("m.py", source)]
    assert seen == [
        ("<module>", "print"),
        ("f", "sys.exit"),
        ("f", "sys.stderr.write"),
        ("f", "raise SystemExit"),
        ("g", "os._exit"),
    ]


# ---- the sync: a report returned, printed by the commands wing -------------------------------


@pytest.fixture
def vendor(tmp_path: Path) -> Path:
    copy = tmp_path / "vendor"
    shutil.copytree(ROOT / "vendor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_a_sync_check_returns_its_report_and_prints_nothing(vendor: Path, capsys) -> None:
    report = sync_commands.check(vendor)
    assert isinstance(report, SyncReport) and not report.failed
    assert report.said[-1].startswith("ok: ") and report.said[-1].endswith("UPSTREAM.toml\n")
    assert capsys.readouterr() == ("", "")


def test_drift_is_a_failed_report_that_the_command_prints_with_exit_1(vendor: Path, capsys) -> None:
    vendored = next(vendor.glob("*/UPSTREAM.toml")).parent
    source = next(p for p in sorted(vendored.glob("*.py")) if p.name != "__init__.py")
    source.write_text(source.read_text() + "\n# edited by hand\n")
    report = sync_commands.check(vendor)
    assert report.failed and any(line.startswith("drifted: ") for line in report.said)
    assert capsys.readouterr() == ("", "")
    assert cli.main(["sync", "--check", "--vendor-dir", str(vendor)]) == 1
    assert capsys.readouterr().out == "".join(report.said)
