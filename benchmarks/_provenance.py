"""Where a figure was measured: the machine, the code's commit, the date.

Shared by the scripts of issue 35's figures (``status_entries.py``, ``sniff_costs.py``,
``from_pr_compare.py``) so that their JSON files carry the same fields.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def code_folder() -> Path:
    """The ``backports.megatron`` package the running interpreter imports (an editable
    install points into a checkout; PYTHONPATH may put another copy first)."""
    out = subprocess.run(
        [sys.executable, "-I", "-c", "import backports.megatron as m; print(m.__path__[0])"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return Path(out.stdout.strip())


def git_state(folder: Path) -> dict[str, Any]:
    """The commit of the checkout holding ``folder``, and whether any tracked or untracked
    file of it differs from that commit (benchmarks/results/ excepted: the figures)."""
    commit = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    changed = subprocess.run(
        [
            "git",
            "-C",
            str(folder),
            "status",
            "--porcelain",
            "--",
            ":(top)",
            ":(top,exclude)benchmarks/results",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {"commit": commit or None, "dirty": bool(changed)}


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def megatron_core_version() -> str:
    from importlib.metadata import version

    return version("megatron-core")
