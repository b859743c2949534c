"""``backports status`` with all 11 builtin entries against 7 (the four of issue 35
skipped), verdict cache cold and warm: issue 35's "at most 20% slower warm"; with
``--cold-and-warm``, all entries with the proof store off and warm: issue 43's "cold status
in seconds".

    python benchmarks/status_entries.py [--runs 3] [--warm-only] [--out PATH]
    python benchmarks/status_entries.py --cold-and-warm [--runs 3]
        (writes benchmarks/results/status_cold_warm.json)

Each run is the CLI as a user runs it, in a fresh interpreter: ``python -m
backports.megatron status --json`` with the running interpreter, its working directory a
new empty temporary folder. Four cases:

- ``11 cold`` / ``7 cold``: ``MEGATRON_BACKPORTS_CACHE_DIR`` a new empty folder;
- ``11 warm`` / ``7 warm``: a folder the same case filled in a run before the timed ones;
- ``7``: ``MEGATRON_BACKPORTS_SKIP`` names #6010, #6099, #6624 and #6890;
- ``--cold-and-warm``, every builtin entry (however many the catalog holds: the JSON says
  how many): ``all off``: ``MEGATRON_BACKPORTS_CACHE=0``, the proof store off: what a fresh
  CI runner pays, every sniff run; ``all off-fresh``: the same, each sniff child a fresh
  interpreter (``MEGATRON_BACKPORTS_ZYGOTE=0``: as before issue 43, no zygote importing
  torch once); ``all warm``: the store filled by a run before.

The cases are interleaved, each round in random order, so the load of a shared machine
falls on every case alike; ``--runs`` rounds, the median taken. Per run: the wall time and
the user + system CPU of the child and everything it waited for (``RUSAGE_CHILDREN``
deltas: #6964's and #6890's sniff children on a cold cache), the exit status and the
verdicts ``status --json`` printed, the load average just before it (the machine may be
shared: CPU seconds are the figure that load changes least). Writes
``benchmarks/results/status_entries.json`` (``--cold-and-warm``: ``status_cold_warm.json``)
with the machine, the load average before and after, the commit and the date.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _provenance

ROOT = Path(__file__).resolve().parents[1]
NEW_IN_ISSUE_35 = ("megatron-lm-6010", "megatron-lm-6099", "megatron-lm-6624", "megatron-lm-6890")
CASES = ("11 cold", "11 warm", "7 cold", "7 warm")
COLD_AND_WARM = ("all off", "all off-fresh", "all warm")
COMMAND = "python -m backports.megatron status --json"
GOAL = 1.20  # warm with 11 entries: at most 20% slower than warm with 7
# Issue 43, on an otherwise idle 2-core machine: the proof store off, at most 12 s of CPU
# (children included) and 15 s wall; warm, at most 7 s wall.
OFF_CPU_S, OFF_WALL_S, WARM_WALL_S = 12.0, 15.0, 7.0


def _env(
    entries: str, cache_dir: Path, store_off: bool = False, fresh: bool = False
) -> dict[str, str]:
    env = {**os.environ, "MEGATRON_BACKPORTS_CACHE_DIR": str(cache_dir), "COLUMNS": "200"}
    for name in (
        "MEGATRON_BACKPORTS_CACHE",
        "MEGATRON_BACKPORTS_SKIP",
        "MEGATRON_BACKPORTS_ZYGOTE",
        "PYTHONPATH",
    ):
        env.pop(name, None)
    if fresh:
        env["MEGATRON_BACKPORTS_ZYGOTE"] = "0"
    if entries == "7":  # "11" and "all": every builtin entry
        env["MEGATRON_BACKPORTS_SKIP"] = ",".join(NEW_IN_ISSUE_35)
    if store_off:
        env["MEGATRON_BACKPORTS_CACHE"] = "0"
    return env


def _timed(
    entries: str, cache_dir: Path, scratch: Path, store_off: bool = False, fresh: bool = False
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "backports.megatron", "status", "--json"]
    load = _provenance.load_average()
    with tempfile.TemporaryDirectory(dir=scratch) as cwd:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(
            argv,
            env=_env(entries, cache_dir, store_off, fresh),
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"status exited {done.returncode}:\n{done.stderr[-2000:]}")
    listed = json.loads(done.stdout)
    verdicts = collections.Counter(entry["verdict"] for entry in listed)
    hits = sum(1 for e in listed if (e.get("evidence", {}).get("cache") or {}).get("hit"))
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    return {
        "wall_s": round(wall, 3),
        "user_s": round(user, 3),
        "sys_s": round(system, 3),
        "cpu_s": round(user + system, 3),
        "exit": done.returncode,
        "verdicts": dict(sorted(verdicts.items())),
        "entries": len(listed),
        "cache_hits": hits,
        "load_average_before": load,
    }


def _goal_35(medians: dict[str, dict[str, float]]) -> dict[str, Any]:
    ratio_wall = medians["11 warm"]["wall_s"] / medians["7 warm"]["wall_s"]
    ratio_cpu = medians["11 warm"]["cpu_s"] / medians["7 warm"]["cpu_s"]
    return {
        "warm 11 / warm 7, wall": round(ratio_wall, 3),
        "warm 11 / warm 7, cpu": round(ratio_cpu, 3),
        "at most": GOAL,
        "met (wall)": ratio_wall <= GOAL,
        "met (cpu)": ratio_cpu <= GOAL,
    }


def _goal_43(medians: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Issue 43's bounds; the wall bounds hold on an otherwise idle machine only (the load
    average says how idle it was)."""
    off, warm = medians["all off"], medians["all warm"]
    return {
        "off: CPU s at most": OFF_CPU_S,
        "met (off, CPU)": off["cpu_s"] <= OFF_CPU_S,
        "off: wall s at most (idle machine)": OFF_WALL_S,
        "met (off, wall)": off["wall_s"] <= OFF_WALL_S,
        "warm: wall s at most (idle machine)": WARM_WALL_S,
        "met (warm, wall)": warm["wall_s"] <= WARM_WALL_S,
        "off: CPU, fresh children / zygote": round(
            medians["all off-fresh"]["cpu_s"] / off["cpu_s"], 3
        ),
    }


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(run[key] for run in runs), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--warm-only", action="store_true", help="only the two warm cases (the goal's)"
    )
    parser.add_argument(
        "--cold-and-warm",
        action="store_true",
        help="all entries, the proof store off and warm (issue 43's goal)",
    )
    args = parser.parse_args()
    name = "status_cold_warm.json" if args.cold_and_warm else "status_entries.json"
    args.out = args.out or ROOT / "benchmarks" / "results" / name
    code = _provenance.code_folder()
    git = _provenance.git_state(code)  # at the start: the code the runs measure
    started = _provenance.now()
    load_before = _provenance.load_average()
    cases = [case for case in CASES if not args.warm_only or case.endswith("warm")]
    if args.cold_and_warm:
        cases = list(COLD_AND_WARM)
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="status-entries-") as tmp:
        scratch = Path(tmp)
        used = {case.split()[0] for case in cases}
        kinds = [entries for entries in ("11", "7", "all") if entries in used]
        warm = {entries: scratch / f"warm-{entries}" for entries in kinds}
        fill = {entries: _timed(entries, folder, scratch) for entries, folder in warm.items()}
        order = list(cases)
        for round_number in range(args.runs):
            random.shuffle(order)
            for case in order:
                entries, cache = case.split()
                folder = warm[entries]
                off = cache.startswith("off")
                if cache == "cold" or off:
                    folder = scratch / f"{cache}-{entries}-{round_number}"
                timed = _timed(entries, folder, scratch, off, fresh=cache == "off-fresh")
                runs[case].append(timed)
                print(f"round {round_number + 1}: {case:12} {runs[case][-1]['wall_s']:7.2f} s")
    medians = {
        case: {key: _median(timed, key) for key in ("wall_s", "user_s", "sys_s", "cpu_s")}
        for case, timed in runs.items()
    }
    if args.cold_and_warm:
        what = (
            f"{COMMAND} with every builtin entry, fresh "
            "interpreter, cwd a new temp folder; off = MEGATRON_BACKPORTS_CACHE=0 (the proof "
            "store off: every sniff runs, child interpreters included, as on a fresh CI "
            "runner), warm = the store filled by a run before; CPU s = user + system of the "
            "command and every process it waited for"
        )
        goal = _goal_43(medians)
    else:
        what = (
            "python -m backports.megatron status --json, fresh interpreter, cwd a new temp "
            "folder; 7 = MEGATRON_BACKPORTS_SKIP=" + ",".join(NEW_IN_ISSUE_35)
        )
        goal = _goal_35(medians)
    result: dict[str, Any] = {
        "what": what,
        "command": f"python benchmarks/status_entries.py {' '.join(sys.argv[1:])}".strip(),
        "entries": sorted({run["entries"] for timed in runs.values() for run in timed}),
        "date": started,
        "machine": {
            **_provenance.machine(),
            "load_average_before": load_before,
            "load_average_after": _provenance.load_average(),
            "note": f"{os.cpu_count()} cores shared with other engineers' test runs: wall times "
            "include their load (the load average before each run is in its record); CPU "
            "(user+sys) is less sensitive to it",
        },
        "code": str(code),
        "git": git,
        "megatron_core": _provenance.megatron_core_version(),
        "runs_per_case": args.runs,
        "medians": medians,
        "goal": goal,
        "cache_fill_runs": fill,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'case':13} {'wall s':>8} {'CPU s':>8}   (median of {args.runs})")
    for case, median in medians.items():
        print(f"{case:13} {median['wall_s']:8.2f} {median['cpu_s']:8.2f}")
    load_after = result["machine"]["load_average_after"]
    print(f"goal: {goal}; load average {load_before} -> {load_after}")


if __name__ == "__main__":
    main()
