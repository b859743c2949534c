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
import subprocess
import sys
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
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in extra_path)
    return env


def _run(argv: list[str], scratch: Path, env: dict[str, str], timeout: float) -> Done:
    import time

    start = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Done(124, out, f"timed out after {timeout:.0f} s", time.monotonic() - start)
    return Done(done.returncode, done.stdout, done.stderr, time.monotonic() - start)


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
