"""tools/bootstrap.sh: set-up that says what it does, and that checks the install itself.

Each test runs the script of a copy of this repository against a throwaway venv. The venv
sees this environment's packages (torch, megatron-core, pytest, pip, setuptools) through
a ``.pth`` path line, so nothing is downloaded. ``python -m pip`` in the script finds a
recording pip first (``PYTHONPATH``); it prints a line as pip does without a terminal and
hands an ``-e`` install on to the real pip, offline and without dependencies, so the
project really is installed editable into the venv.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.slow

PIP_LINE = "Downloading torch-9.9.9-cp312-cp312-manylinux_2_28_x86_64.whl (123.4 MB)"

_RECORDING_PIP = f"""
import json, os, runpy, sys
with open(os.environ["PIP_CALLS"], "a", encoding="utf-8") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("PIP_FAILS"):
    sys.exit("ERROR: no network")
args = sys.argv[1:]
if "-e" in args:
    print({PIP_LINE!r}, flush=True)
    project = args[args.index("-e") + 1].removesuffix("[dev]")
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != ours]
    for name in [n for n in sys.modules if n == "pip" or n.startswith("pip.")]:
        del sys.modules[name]
    sys.argv = ["pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                "-e", project]
    runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""


class Setup:
    """A repository copy, a venv without the project, and the recording pip."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "clone"
        ignore = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", ".*cache")
        shutil.copytree(ROOT, self.root, ignore=ignore)
        self.venv = tmp / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)
        self.python = self.venv / "bin" / "python"
        purelib = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
        Path(purelib, "_base_environment.pth").write_text("\n".join(ours) + "\n")
        self.fake = tmp / "recording-pip"
        (self.fake / "pip").mkdir(parents=True)
        (self.fake / "pip" / "__init__.py").write_text("")
        (self.fake / "pip" / "__main__.py").write_text(_RECORDING_PIP)
        self.calls = tmp / "pip-calls.jsonl"

    def bootstrap(self, **env: str) -> subprocess.CompletedProcess[str]:
        self.calls.write_text("")
        scrubbed = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP"))}
        extra = {"VENV": str(self.venv), "PYTHONPATH": str(self.fake), "PIP_CALLS": str(self.calls)}
        return subprocess.run(
            ["bash", "-c", 'source tools/bootstrap.sh && echo "ready: $VENV"'],
            cwd=self.root,
            env={**scrubbed, **extra, **env},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def pip_calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.calls.read_text().splitlines()]

    def real_pip(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP"))}
        subprocess.run([str(self.python), "-m", "pip", *args], env=env, check=True)

    def backports_runs(self) -> bool:
        script = self.venv / "bin" / "backports"
        return script.exists() and subprocess.run([str(script), "--version"]).returncode == 0


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "ready:" in done.stdout
    return done.stderr


def test_install_says_where_the_log_is_before_pip_runs_and_shows_pip(setup: Setup) -> None:
    err = _ok(setup.bootstrap())
    log = f"full log: {setup.venv / 'install.log'}"
    assert log in err and PIP_LINE in err
    assert err.index(log) < err.index(PIP_LINE)  # the path first, then pip's own progress
    assert "step 1/2" in err and "step 2/2" in err and "[bootstrap] done in" in err
    assert [call[:2] for call in setup.pip_calls()] == [["install", "--log"]] * 2
    assert setup.backports_runs()


def test_after_pip_uninstall_the_stamp_does_not_hide_the_broken_install(setup: Setup) -> None:
    _ok(setup.bootstrap())
    assert _ok(setup.bootstrap()) == "" and setup.pip_calls() == []  # complete: quiet
    setup.real_pip("uninstall", "-q", "-y", "megatron-backports")
    assert not setup.backports_runs()
    err = _ok(setup.bootstrap())
    assert f"{setup.venv}/bin/backports is missing" in err
    assert any("-e" in call for call in setup.pip_calls()) and setup.backports_runs()


def test_a_failed_pip_names_the_log_and_fails(setup: Setup) -> None:
    done = setup.bootstrap(PIP_FAILS="1")
    assert done.returncode == 1 and "ready:" not in done.stdout
    assert "ERROR: no network" in done.stderr  # pip's own words reach the user
    assert f"pip install failed; full log: {setup.venv / 'install.log'}" in done.stderr
    assert not (setup.venv / ".megatron-backports-installed").exists()
