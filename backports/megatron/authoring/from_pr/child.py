"""Run the pull request's code where it cannot reach this process: a child interpreter.

``python -I`` (no environment variables read, no user site, not the caller's folder on
``sys.path``) in a private scratch folder, with ``sys.path`` extended explicitly by the
folders it needs: this package's and the staged plugin's. Tools started as commands
(pip, ``backports``) get ``-P`` and ``PYTHONPATH`` instead, since they need an environment.
"""

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Variables that would change what a child does behind the derivation's back.
_SCRUBBED_PREFIXES = ("MEGATRON_BACKPORTS", "PYTHON", "BACKPORTS_UPSTREAM_TESTS")

# Builtin entries the derivation's children skip (``skipping``): a builtin that carries the
# same pull request patches the same targets and installs first, so the plugin is proven
# where that builtin is off, as a user who prefers the plugin runs it.
_SKIPPED: list[str] = []
# After SIGTERM, before SIGKILL: time for a child to stop its own children and clean up.
_GRACE_S = 10.0


@contextlib.contextmanager
def skipping(ids: list[str]) -> Iterator[None]:
    """Every child started inside runs with ``MEGATRON_BACKPORTS_SKIP`` naming ``ids``."""
    before = list(_SKIPPED)
    _SKIPPED[:] = ids
    try:
        yield
    finally:
        _SKIPPED[:] = before


def package_root() -> Path:
    """The folder holding ``backports/megatron`` of this installation."""
    # By its full name: ``import backports.megatron`` binds ``sys.modules["backports"]``,
    # which setuptools' vendored ``backports`` package may have replaced in this process.
    package = importlib.import_module("backports.megatron")
    return Path(str(package.__file__)).resolve().parents[2]


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def last_line(self) -> str:
        lines = [line for line in (self.stdout + self.stderr).splitlines() if line.strip()]
        return lines[-1] if lines else ""


def _environment(scratch: Path, extra_path: list[Path] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    env["MEGATRON_BACKPORTS_CACHE_DIR"] = str(scratch / "verdict-cache")
    if _SKIPPED:
        env["MEGATRON_BACKPORTS_SKIP"] = ",".join(_SKIPPED)
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    # Whatever a child writes to its home or temporary folder (torch's compile caches,
    # upstream-tests' checkout, rustup's settings...) stays in the scratch folder, which goes
    # when the derivation ends, however it ends. Git keeps the user's own settings.
    gitconfig = Path.home() / ".gitconfig"
    if "GIT_CONFIG_GLOBAL" not in env and gitconfig.is_file():
        env["GIT_CONFIG_GLOBAL"] = str(gitconfig)
    for name, folder in (("HOME", "home"), ("TMPDIR", "tmp"), ("TMP", "tmp"), ("TEMP", "tmp")):
        (scratch / folder).mkdir(parents=True, exist_ok=True)
        env[name] = str(scratch / folder)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in extra_path)
    return env


def _run(argv: list[str], scratch: Path, env: dict[str, str], timeout: float) -> Done:
    """``argv`` in its own process group, which goes whole when it ends, times out, or this
    process is stopped (Ctrl-C, SIGTERM): nothing the pull request's code started outlives
    it. Its output goes to files, not pipes, which a grandchild left behind would hold open."""
    start = time.monotonic()
    with (
        tempfile.TemporaryFile("w+", dir=scratch, errors="replace") as out,
        tempfile.TemporaryFile("w+", dir=scratch, errors="replace") as err,
    ):
        process = subprocess.Popen(
            argv,
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        late = ""
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode, late = 124, f"\ntimed out after {timeout:.0f} s"
        finally:
            stop_group(process)
        out.seek(0)
        err.seek(0)
        return Done(returncode, out.read(), err.read() + late, time.monotonic() - start)


def _signal_group(pgid: int, sig: int) -> bool:
    """Whether any process of the group was there to take ``sig`` (0: only look)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """End every process of ``process``'s group: SIGTERM, a grace for them to clean up
    (``upstream-tests`` stops its own pytest and removes its folder), then SIGKILL."""
    deadline = time.monotonic() + _GRACE_S
    if _signal_group(process.pid, signal.SIGTERM):
        while time.monotonic() < deadline:
            if process.poll() is not None and not _signal_group(process.pid, 0):
                break
            time.sleep(0.05)
        else:
            _signal_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_GRACE_S)


def run_module(
    module: str,
    request: dict[str, Any],
    scratch: Path,
    paths: list[Path],
    timeout: float,
    *,
    inherited: bool = False,
) -> tuple[dict[str, Any] | None, Done]:
    """``python -I -c`` running ``module.main([request, answer])``, ``paths`` first on
    ``sys.path``; the answer file's JSON (None when it wrote none). ``inherited``: ``-P``
    with ``paths`` as ``PYTHONPATH`` instead, for a child whose own children need them."""
    scratch.mkdir(parents=True, exist_ok=True)
    request_file = scratch / f"{module.rpartition('.')[2]}-request.json"
    answer_file = scratch / f"{module.rpartition('.')[2]}-answer.json"
    request_file.write_text(json.dumps(request), encoding="utf-8")
    answer_file.unlink(missing_ok=True)
    boot = (
        "import sys; sys.path[:0] = sys.argv[1:-2]\n"
        f"from {module} import main\n"
        "sys.exit(main(sys.argv[-2:]))\n"
    )
    flag, env = (
        ("-P", _environment(scratch, paths)) if inherited else ("-I", _environment(scratch, None))
    )
    argv = [sys.executable, flag, "-c", boot, *map(str, paths), str(request_file), str(answer_file)]
    done = _run(argv, scratch, env, timeout)
    if not answer_file.is_file():
        return None, done
    return json.loads(answer_file.read_text(encoding="utf-8")), done


def run_command(argv: list[str], scratch: Path, paths: list[Path], timeout: float) -> Done:
    """``python -P <argv>`` with ``paths`` as ``PYTHONPATH``, in ``scratch``."""
    scratch.mkdir(parents=True, exist_ok=True)
    return _run([sys.executable, "-P", *argv], scratch, _environment(scratch, paths), timeout)
