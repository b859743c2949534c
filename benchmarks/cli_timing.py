"""Wall and CPU time of the four probing commands, verdict cache cold and warm.

    python benchmarks/cli_timing.py [--runs 5] [--label NAME] [--out PATH]

Runs ``backports status``, ``check``, ``apply --site-dir <temp folder>`` (the hook is
written there, never into this interpreter's site-packages) and ``audit --dir <this
interpreter's site-packages>`` as ``python -m backports.megatron ...`` in the running
interpreter, each ``--runs`` times per cache state, interleaved in rounds (each round in
random order) so that the load of a shared machine falls on every command alike:

- cold: ``MEGATRON_BACKPORTS_CACHE_DIR`` is a new empty folder (nothing cached yet);
- warm: it is a folder the same command filled in a run before the timed ones.

Per run: the wall time, and the user and system CPU of the command and every process it
waited for (``RUSAGE_CHILDREN``: the audit's child and the import-guard sniff's children
included). Writes medians and every run as JSON (default
``benchmarks/results/cli_timing[_LABEL].json``), with the load average before and after.
"""

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("status", "check", "apply", "audit")


def _argv(command: str, site_dir: Path) -> list[str]:
    tool = [sys.executable, "-m", "backports.megatron"]
    if command == "apply":
        return [*tool, "apply", "--site-dir", str(site_dir)]
    if command == "audit":
        return [*tool, "audit", "--dir", sysconfig.get_paths()["purelib"]]
    return [*tool, command]


def _timed(argv: list[str], cache_dir: Path) -> dict[str, float]:
    env = {**os.environ, "MEGATRON_BACKPORTS_CACHE_DIR": str(cache_dir), "COLUMNS": "200"}
    env.pop("MEGATRON_BACKPORTS_CACHE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # check exits 1 when a backport fails its gate
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return {
        "wall_s": wall,
        "user_s": after.ru_utime - before.ru_utime,
        "sys_s": after.ru_stime - before.ru_stime,
        "exit": done.returncode,
    }


def _median(runs: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(run[key] for run in runs), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="")
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--note", default="", help="kept in the JSON (what code ran, say)")
    args = parser.parse_args()
    name = f"cli_timing_{args.label}.json" if args.label else "cli_timing.json"
    out = args.out or ROOT / "benchmarks" / "results" / name
    cases = [(command, cache) for command in args.commands for cache in ("cold", "warm")]
    runs: dict[str, list[dict[str, float]]] = {f"{c} {s}": [] for c, s in cases}
    load_before = os.getloadavg()
    # The code the commands run (PYTHONPATH may put another copy first) and its commit.
    code = subprocess.run(
        [sys.executable, "-c", "import backports.megatron as m; print(m.__path__[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    commit = subprocess.run(
        ["git", "-C", code, "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", code, "status", "--porcelain", "--", "."], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="cli-timing-") as tmp:
        site_dir = Path(tmp) / "site"
        site_dir.mkdir()
        warm = {command: Path(tmp) / f"warm-{command}" for command in args.commands}
        for command, folder in warm.items():  # fills the warm caches; not timed
            _timed(_argv(command, site_dir), folder)
        for round_number in range(args.runs):
            random.shuffle(cases)
            for command, cache in cases:
                folder = warm[command]
                if cache == "cold":
                    folder = Path(tmp) / f"cold-{command}-{round_number}"
                runs[f"{command} {cache}"].append(_timed(_argv(command, site_dir), folder))
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "code": code,
        "git": {"commit": commit or None, "modified": bool(dirty)},
        "note": args.note,
        "runs_per_case": args.runs,
        "medians": {
            case: {key: _median(timed, key) for key in ("wall_s", "user_s", "sys_s")}
            for case, timed in sorted(runs.items())
        },
        "runs": dict(sorted(runs.items())),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for case, median in result["medians"].items():
        print(f"{case:12} wall {median['wall_s']:6.2f} s  user {median['user_s']:6.2f} s")


if __name__ == "__main__":
    main()
