"""The folder the derivation's children take this package from."""

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from backports.megatron.authoring.from_pr.child import package_root, run_command
from tests.paths import ROOT


def test_the_package_root_is_found_whatever_stands_as_backports(monkeypatch):
    """setuptools vendors a ``backports`` package of its own; once imported it may stand in
    ``sys.modules["backports"]`` (seen in the full slow run): ``import backports.megatron``
    then binds a module without ``megatron``."""
    stand_in = types.ModuleType("backports")
    stand_in.__path__ = []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "backports", stand_in)
    assert package_root() == ROOT


# ---- the children's process group: nothing outlives the derivation ------------------------

# A child that starts a grandchild (as a pull request's test may), notes its pid, then
# sleeps or exits at once: argv[1] is the pid file, argv[2] how long the child stays.
_SPAWNS = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(grandchild.pid))
time.sleep(float(sys.argv[2]))
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped by whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _gone(pid: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(("stays", "timeout", "code"), [(0.0, 60.0, 0), (120.0, 2.0, 124)])
def test_a_childs_whole_process_group_goes_when_it_ends_or_times_out(
    tmp_path, stays, timeout, code
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    argv = ["-c", _SPAWNS, str(pid_file), str(stays)]
    done = run_command(argv, tmp_path / "scratch", [], timeout=timeout)
    assert done.returncode == code, done.stderr
    assert _gone(int(pid_file.read_text()))


_TERMINATED = """
import sys
from pathlib import Path
from backports.megatron.authoring.from_pr.child import run_command
from backports.megatron.termination import sigterm_unwinds
import tempfile
with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="backports-from-pr-") as scratch:
    run_command(["-c", sys.argv[1], sys.argv[2], "120"], Path(scratch), [], timeout=600)
"""


def test_sigterm_stops_the_childs_process_group_and_removes_the_scratch_folder(tmp_path) -> None:
    """In a process of its own (SIGTERM ends it): the child and its grandchild go, the
    scratch folder goes, and the process ends as SIGTERM ends it."""
    pid_file = tmp_path / "grandchild.pid"
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    argv = [sys.executable, "-c", _TERMINATED, _SPAWNS, str(pid_file)]
    process = subprocess.Popen(argv, cwd=tmp_path, env=env)
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM
    assert _gone(grandchild)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_childs_home_and_temporary_folders_are_in_its_scratch_folder(
    tmp_path, monkeypatch
) -> None:
    """What a child writes to its home or temporary folder (torch's caches under TMPDIR,
    rustup's settings under HOME, upstream-tests' checkout) goes with the scratch folder;
    git keeps the user's own settings."""
    from backports.megatron.authoring.from_pr.child import _environment

    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[safe]\n\tdirectory = *\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    scratch = tmp_path / "scratch"
    env = _environment(scratch, None)
    for name in ("HOME", "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME"):
        assert Path(env[name]).is_relative_to(scratch), name
    assert Path(env["TMPDIR"]).is_dir() and Path(env["HOME"]).is_dir()
    assert env["GIT_CONFIG_GLOBAL"] == str(home / ".gitconfig")
