"""One child pytest over upstream's checked-out tests: launched, timed, stopped, read back.

The child runs in its own process session, so a time limit or a stop of ours ends every
process under it (torchrun's worker included), not only the first. It takes code from the
checked-out folder (on ``PYTHONPATH``) and the environment, never from the caller's working
directory: its working directory is the private folder and ``PYTHONSAFEPATH`` is set, which
every interpreter under it (torchrun's worker too) inherits. It runs offline: the pytest
plugin refuses every connection but loopback's (``BACKPORTS_UPSTREAM_TESTS_OFFLINE``).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLUGIN = "backports.megatron._apply_for_pytest"
# python: one pytest process. torchrun: the same under ``torchrun --nproc_per_node 1``, for
# upstream's harness, which reads LOCAL_RANK and the MASTER_* rendezvous torchrun sets.
LAUNCHERS = ("python", "torchrun")
_GRACE_S = 5.0  # after SIGTERM, before SIGKILL: time for torchrun to stop its worker


@dataclass
class RunResult:
    """What one run left: outcomes by node id, first error lines, and why it stopped."""

    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, dict[str, str]] = field(default_factory=dict)
    skips: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    network: dict[str, str] = field(default_factory=dict)  # who tried to connect, to where
    timed_out: bool = False
    returncode: int | None = None
    last_line: str = ""  # the output's last line: why pytest ran no test, if it ran none


def _command(launcher: str, tests: list[str], folder: Path) -> list[str]:
    pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN]
    pytest += ["--rootdir", str(folder), *tests]
    if launcher == "torchrun":
        # --standalone: a rendezvous on a free local port, so two runs never collide.
        run = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
        return [sys.executable, "-P", *run, *pytest]
    return [sys.executable, "-P", *pytest]


def _child_env(env: dict[str, str], folder: Path, report: Path) -> dict[str, str]:
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join([str(folder), *inherited]),
        "PYTHONSAFEPATH": "1",
        "BACKPORTS_UPSTREAM_TESTS_REPORT": str(report),
        "BACKPORTS_UPSTREAM_TESTS_OFFLINE": "1",  # the plugin refuses all but loopback
    }


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End the child's whole session (what it started too): SIGTERM, a grace, SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:  # nothing of the session is left
            break
        if sig == signal.SIGTERM:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_GRACE_S)
    process.wait()


def _read(report: Path, result: RunResult) -> None:
    if not report.is_file():
        return
    data = json.loads(report.read_text(encoding="utf-8"))
    result.outcomes = {str(k): str(v) for k, v in data.get("outcomes", {}).items()}
    result.errors = {str(k): dict(v) for k, v in data.get("errors", {}).items()}
    result.skips = {str(k): str(v) for k, v in data.get("skips", {}).items()}
    result.environment = dict(data.get("environment", {}))
    result.network = {str(k): str(v) for k, v in data.get("network", {}).items()}


def _last_line(log: Path) -> str:
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_pytest(
    folder: Path,
    tests: list[str],
    env: dict[str, str],
    *,
    name: str,
    launcher: str = "python",
    timeout_s: float | None = None,
) -> RunResult:
    """Run ``tests`` in ``folder``; the report and the log go beside it as ``<name>.*``."""
    report = folder.parent / f"{name}.json"
    log = folder.parent / f"{name}.log"
    result = RunResult()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            _command(launcher, tests, folder),
            cwd=folder,
            env=_child_env(env, folder, report),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            result.returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            result.timed_out = True
        finally:  # a time limit, or our own stop (SIGTERM, Ctrl-C): the whole session goes
            _stop(process)
    _read(report, result)
    result.last_line = _last_line(log)
    return result
