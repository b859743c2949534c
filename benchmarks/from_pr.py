"""``backports new --from-pr`` on real upstream pull requests: wall time, outcome, and an
independent ``backports check`` of each plugin it wrote.

    python benchmarks/from_pr.py [--mirror PATH] [--prs 6010 6099 6624 6271 new] [--out PATH]

The clone: ``git clone --mirror`` of a local mirror of NVIDIA/Megatron-LM into a scratch
folder (not timed: the venv and the clone are set-up), with ``origin`` set to GitHub's URL
as a clone from GitHub names it. ``new`` stands for the clone's newest pull ref plus one
(refused: newer than the clone). Each pull request runs as ``python -P -m
backports.megatron new --from-pr N --repo CLONE --dest DIR`` in the running interpreter
(the megatron-core installed there is the release it derives against), one at a time; its
wall time is the per-PR figure. A plugin it wrote (exit 0) is then pip-installed
(``--no-deps --target``) into a folder of the scratch space, and ``backports check --only
ID`` runs with that folder on ``PYTHONPATH``: exit 0 is what "installs and passes check"
means here. Writes JSON (default ``benchmarks/results/from_pr.json``), with the load
average before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
GITHUB = "https://github.com/NVIDIA/Megatron-LM.git"
# What each pull request should come to (issue 34).
EXPECTED = {
    6010: "proven: two classes in two files, no drift",
    6099: "proven: constructor + method, the method half sniffed",
    6624: "proven: an autograd.Function.backward that drifted",
    6271: "refused by the budget",
}
_STEPS = re.compile(r"^time per step: (.*)$", re.MULTILINE)
_ROUTE = re.compile(r"^  (\S+): route ([abc]),", re.MULTILINE)


def _clone(mirror: Path, scratch: Path) -> tuple[Path, int]:
    clone = scratch / "Megatron-LM.git"
    subprocess.run(["git", "clone", "--quiet", "--mirror", str(mirror), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "config", "remote.origin.url", GITHUB], check=True)
    refs = subprocess.run(
        ["git", "-C", str(clone), "for-each-ref", "--format=%(refname)", "refs/pull/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    newest = max(int(m.group(1)) for r in refs if (m := re.fullmatch(r"refs/pull/(\d+)/head", r)))
    return clone, newest


def _env(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    env["TMPDIR"] = str(scratch)
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    env["MEGATRON_BACKPORTS_CACHE_DIR"] = str(scratch / "verdict-cache")
    return env


def _steps(out: str) -> dict[str, float]:
    match = _STEPS.search(out)
    if match is None:
        return {}
    found = re.findall(r"([\w-]+) ([0-9.]+) s", match.group(1))
    return {name: float(seconds) for name, seconds in found}


def _check(plugin: Path, backport_id: str, scratch: Path) -> dict[str, Any]:
    """Install the written plugin where nothing else sees it, and run check on it."""
    site = scratch / f"site-{backport_id}"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    pip += ["--no-build-isolation", "--target", str(site), str(plugin)]
    installed = subprocess.run(pip, capture_output=True, text=True, cwd=scratch, check=False)
    if installed.returncode != 0:
        return {"installed": False, "pip_stderr": installed.stderr[-400:]}
    env = {**_env(scratch), "PYTHONPATH": str(site)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-P", "-m", "backports.megatron", "check", "--only", backport_id],
        capture_output=True,
        text=True,
        cwd=scratch,
        env=env,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {
        "installed": True,
        "check_exit": done.returncode,
        "check_seconds": round(time.monotonic() - start, 1),
        "check_output": lines[-4:],
    }


def _one(number: int, clone: Path, scratch: Path, label: str) -> dict[str, Any]:
    dest = scratch / f"plugin-{number}"
    argv = [sys.executable, "-P", "-m", "backports.megatron", "new", "--from-pr", str(number)]
    argv += ["--repo", str(clone), "--dest", str(dest)]
    load_before = os.getloadavg()
    start = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=scratch, env=_env(scratch), check=False
    )
    wall = time.monotonic() - start
    result: dict[str, Any] = {
        "pr": number,
        "case": label,
        "exit": done.returncode,
        "wall_seconds": round(wall, 1),
        "steps_seconds": _steps(done.stdout),
        "routes": dict(_ROUTE.findall(done.stdout)),
        "stderr": [line for line in done.stderr.splitlines() if line.strip()][:8],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "written": dest.is_dir(),
    }
    if done.returncode == 0:
        result["independent_check"] = _check(dest, f"mlm-pr-{number}", scratch)
    result["report"] = done.stdout.splitlines()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR)
    parser.add_argument("--prs", nargs="+", default=["6010", "6099", "6624", "6271", "new"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/from_pr.json")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-from-pr-"))
    try:
        start = time.monotonic()
        clone, newest = _clone(args.mirror, scratch)
        clone_seconds = time.monotonic() - start
        runs = []
        for name in args.prs:
            number = newest + 1 if name == "new" else int(name)
            label = (
                f"newer than the clone's newest pull ref (#{newest})"
                if name == "new"
                else EXPECTED.get(number, "")
            )
            runs.append(_one(number, clone, scratch, label))
            print(f"#{number}: exit {runs[-1]['exit']} in {runs[-1]['wall_seconds']} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = {
        "what": "backports new --from-pr on real pull requests (benchmarks/from_pr.py)",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": version("torch"),
            "megatron_core": version("megatron-core"),
        },
        "mirror_main": subprocess.run(
            ["git", "--git-dir", str(args.mirror), "rev-parse", "refs/heads/main"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "clone_seconds_not_counted": round(clone_seconds, 1),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
