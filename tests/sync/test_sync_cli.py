"""``backports sync``: the installed command, its exit codes, and its tools/ wrapper."""

from __future__ import annotations

import ast
import subprocess
import sys

from backports.megatron import cli
from backports.megatron.errors import BackportError
from backports.megatron.sync import errors as sync_errors
from tests.paths import ROOT


def test_backports_sync_checks_the_vendored_folders(capsys) -> None:
    assert cli.main(["sync", "--check"]) == 0
    assert "vendored folder(s) match their UPSTREAM.toml" in capsys.readouterr().out


def test_backports_sync_reports_an_error_in_one_line_with_exit_2(capsys) -> None:
    assert cli.main(["sync", "--backport", "no-such-one", "--sha", "a" * 40]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("backports sync: error: unknown backport 'no-such-one'")
    assert "\n" not in err


def test_ctrl_c_in_backports_sync_exits_130_in_one_line(capsys, monkeypatch) -> None:
    """The shell's convention, as every command: one line, nothing written (issue 36.5)."""
    from backports.megatron.sync import commands

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "check", interrupted)
    assert cli.main(["sync", "--check"]) == 130
    err = capsys.readouterr().err
    assert err == "backports sync: error: interrupted; nothing written\n"


def test_every_sync_error_is_a_backport_error() -> None:
    classes = [
        value
        for value in vars(sync_errors).values()
        if isinstance(value, type)
        and issubclass(value, Exception)
        and value.__module__ == sync_errors.__name__
    ]
    assert classes  # the module defines its errors
    for cls in classes:
        assert issubclass(cls, BackportError), cls.__name__


def test_the_tool_is_a_thin_wrapper_of_the_installed_sync() -> None:
    tree = ast.parse((ROOT / "tools" / "sync_upstream.py").read_text())
    defs = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert defs == ["main"]
    run = subprocess.run(
        [sys.executable, "tools/sync_upstream.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr


def test_scaffold_templates_do_not_import_the_scaffold() -> None:
    """The texts import the plan's model alone, never the scaffold's logic (its package)."""
    path = ROOT / "backports" / "megatron" / "authoring" / "scaffold" / "templates.py"
    tree = ast.parse(path.read_text())
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert [(n.level, n.module) for n in relative] == [(1, "model")]
