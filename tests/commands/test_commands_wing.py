"""The commands wing (backports/megatron/commands/): a lazy registry, one exit-status set,
what the light commands leave unimported, what every command talks to, and Ctrl-C."""

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backports.megatron import api, exit_status, switches
from backports.megatron.catalog import CATALOG
from backports.megatron.catalog import _plugins as plugins
from backports.megatron.commands import COMMANDS, load, main_parser
from backports.megatron.decision import verdict_cache
from backports.megatron.job.hook_file import HOOK_FILE, START_FILE
from backports.megatron.sync import cli as sync_cli
from tests.paths import ROOT

WING = ROOT / "backports" / "megatron" / "commands"


# ---- the registry and the parser -------------------------------------------------------------


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_registered_command_is_one_module_with_its_two_functions(name):
    module = load(name)
    assert callable(module.add_arguments) and callable(module.run)
    assert Path(module.__file__).parent == WING


def test_help_lists_every_command_and_the_ids_from_the_file_names(capsys):
    with pytest.raises(SystemExit) as exit_:
        main_parser.parse(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    for name, info in COMMANDS.items():
        assert name in out and info.summary.split()[0] in out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  megatron-lm-")]
    assert listed == [spec.id for spec in CATALOG]  # the catalog's order: newest PR first


def test_the_help_names_the_switches_and_the_group_they_are_read_under():
    """Spelled out in main_parser (importing their modules would load the catalog)."""
    names = [name.partition("=")[0] for name, _ in main_parser._ENVIRONMENT]
    assert names == [*switches.NAMES, verdict_cache.CACHE, verdict_cache.CACHE_DIR]
    assert main_parser._PLUGIN_GROUP == plugins.GROUP


def test_one_set_of_exit_statuses_for_the_commands_and_sync():
    assert (sync_cli.EXIT_DONE, sync_cli.EXIT_REFUSED, sync_cli.EXIT_ERROR) == (0, 1, 2)
    assert (sync_cli.EXIT_DONE, sync_cli.EXIT_REFUSED, sync_cli.EXIT_ERROR) == (
        exit_status.DONE,
        exit_status.FAILED,
        exit_status.CANNOT_RUN,
    )
    assert exit_status.INTERRUPTED == 128 + signal.SIGINT


# ---- what the commands talk to ---------------------------------------------------------------

# The package's modules a command module may import: the public api and its words, and the
# back end that is the command's own job. The job side only through _job.
_ALLOWED = {"api", "report", "errors", "exit_status"}
_OWN_BACK_END = {
    "new": {"authoring"},
    "candidates": {"authoring"},
    "upstream_tests": {"upstream_tests"},
    "sync": {"sync"},
    "_job": {"job"},
}


def _package_imports(path: Path) -> set[str]:
    """The modules of backports.megatron (outside the wing) that ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 2:
            if node.module:
                found.add(node.module.partition(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            assert not (name or "").startswith("backports"), f"{path.name}: absolute import"
    return found


@pytest.mark.parametrize("path", sorted(WING.glob("*.py")), ids=lambda p: p.name)
def test_a_command_talks_to_the_api_and_the_job_adapter_only(path):
    allowed = _ALLOWED | _OWN_BACK_END.get(path.stem, set())
    assert _package_imports(path) <= allowed


# ---- the light commands import no catalog entry and no plugin --------------------------------

_MARKING_PLUGIN = """
from pathlib import Path
Path({mark!r}).write_text("imported")
from backports.megatron.catalog import CATALOG
SPEC = CATALOG[0]
"""

_RUN_EACH = """
import sys
from backports.megatron.cli import main
for argv in {argvs!r}:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    loaded = sorted(m for m in sys.modules if m.startswith(("backports.megatron.catalog",
        "backports.megatron.api", "marking_plugin")))
    print("RESULT", " ".join(argv), code, loaded, file=sys.stderr)
"""


@pytest.fixture
def marking_plugin(tmp_path: Path) -> tuple[Path, Path]:
    """A plugin distribution whose import writes a file: (its folder, the file)."""
    root, mark = tmp_path / "plugin", tmp_path / "imported.txt"
    info = root / "marking_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: marking-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[megatron_backports]\nmark-1 = marking_plugin:SPEC\n")
    (root / "marking_plugin.py").write_text(_MARKING_PLUGIN.format(mark=str(mark)))
    return root, mark


def _child(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    scrubbed = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    return subprocess.run(
        [sys.executable, "-P", "-c", script],
        env={**scrubbed, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_version_help_and_sync_check_import_no_entry_and_no_plugin(marking_plugin, tmp_path):
    root, mark = marking_plugin
    argvs = [["--version"], ["--help"], ["sync", "--check"], ["new", "--help"]]
    done = _child(_RUN_EACH.format(argvs=argvs), tmp_path, PYTHONPATH=str(root))
    results = [line.split(" ", 1)[1] for line in done.stderr.splitlines() if line[:6] == "RESULT"]
    assert len(results) == len(argvs), done.stderr
    for argv, result in zip(argvs, results, strict=True):
        assert result == f"{' '.join(argv)} 0 []", result
    assert not mark.exists()
    # --help named the plugin's entry point, from its metadata alone.
    assert "mark-1" in done.stdout and "plugin [marking-plugin 1.0]" in done.stdout
    # The control: a command that needs the catalog loads the plugin (and leaves the mark).
    control = _child(_RUN_EACH.format(argvs=[["check", "--only", "mark-1"]]), tmp_path,
                     PYTHONPATH=str(root), MEGATRON_BACKPORTS="0")  # fmt: skip
    assert "backports.megatron.catalog" in control.stderr and mark.exists(), control.stderr


# ---- Ctrl-C ----------------------------------------------------------------------------------

# Ctrl-C reaches a command run from a terminal; a suite started with SIGINT ignored (nohup,
# `cmd &`) would hand its children that, so the child restores what a terminal gives. torch
# and megatron.core are imported before "ready": a Ctrl-C inside torch's C++ import aborts
# the interpreter (SIGABRT, "terminate called ... <EMPTY MESSAGE>"), and megatron's bare
# `except:` around optional imports can swallow one, whatever the command does (both seen
# under a loaded parallel run, where a second into the command was still importing them).
_INTERRUPTIBLE = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import torch, megatron.core
from backports.megatron.cli import main
print("ready", file=sys.stderr, flush=True)
sys.exit(main(sys.argv[1:]))
"""


def _interrupted(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``backports ARGV`` in a fresh interpreter, press Ctrl-C (SIGINT to its process
    group, as a terminal does) a second into the command; its exit status and stderr."""
    scrubbed = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    child = subprocess.Popen(
        [sys.executable, "-P", "-c", _INTERRUPTIBLE, *argv],
        env={**scrubbed, "MEGATRON_BACKPORTS_CACHE": "0"},
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert child.stderr is not None
    before: list[str] = []  # megatron's import warnings come first
    for line in iter(child.stderr.readline, ""):
        if line.strip() == "ready":
            break
        before.append(line)
    else:
        raise AssertionError(f"the child ended before it was ready: {''.join(before)}")
    time.sleep(1.0)  # in the command now: importing megatron alone takes seconds
    assert child.poll() is None, "the command ended before the interrupt"
    os.killpg(child.pid, signal.SIGINT)
    err = child.stderr.read()
    return child.wait(timeout=120), err


@pytest.mark.slow
@pytest.mark.parametrize("command", ["status", "check", "apply"])
def test_ctrl_c_is_one_line_exit_130_and_nothing_half_written(tmp_path, command):
    site = tmp_path / "site"
    site.mkdir()
    argv = [command] + (["--site-dir", str(site)] if command != "check" else [])
    code, err = _interrupted(argv, tmp_path)
    assert (code, err) == (exit_status.INTERRUPTED, "backports: interrupted\n")
    # apply writes the hook files whole or not at all, and leaves no temp file behind.
    assert {p.name for p in site.iterdir()} <= {HOOK_FILE, START_FILE}
    assert not any(p.name.startswith(".") for p in site.iterdir())


def test_an_interrupt_anywhere_in_a_command_is_exit_130(monkeypatch, capsys, tmp_path):
    """The control in this process: the same line and status from the dispatcher itself."""

    def interrupted(only=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "status", interrupted)
    from backports.megatron import cli

    try:
        code = cli.main(["status", "--site-dir", str(tmp_path)])
    except KeyboardInterrupt:  # escaped main: pytest itself would stop the run on it
        pytest.fail("the interrupt escaped cli.main")
    assert code == exit_status.INTERRUPTED
    assert capsys.readouterr().err == "backports: interrupted\n"
