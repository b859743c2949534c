"""What each builtin entry's sniff costs on the installed megatron-core (issue 35's
"each sniff's cost on CPU", the Triton child's too).

    python benchmarks/sniff_costs.py [--runs 7] [--child-runs 2] [--only ID ...] [--out PATH]

In this process, for each entry of the catalog: its targets resolved as the decision
resolves them (the first resolve imports their modules: timed apart, as ``import_s``), then
``spec.sniff`` on the installed code, called directly in this thread: one warm-up, then
``--runs`` timed runs (wall and this process's CPU, ``time.process_time``: torch's threads
included), the median kept. An entry whose sniff starts child interpreters (#6964's import
guard, #6890's Triton child: ``sniff_in_child``) keeps what its children saw for the rest
of its process (a second call costs nothing), so each of its ``--child-runs`` runs is a
fresh interpreter of this script (``-P``, cwd a private folder) timing one first call, the
children's CPU included (``RUSAGE_CHILDREN`` deltas); the vendored code's sniff is timed
right after in that process, as ``status`` runs it (#6890's child judges both sets at
once). Beside it, the same sniff on the entry's vendored code
(upstream-only, as ``status`` runs it after a ``needed``: the replacement built, the sniff
in a thread of its own), timed the same way. Writes
``benchmarks/results/sniff_costs.json`` with the machine, load average, commit and date.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(call: Callable[[], Any]) -> tuple[dict[str, float], Any]:
    cpu, children = time.process_time(), _children_cpu()
    start = time.perf_counter()
    result = call()
    wall = time.perf_counter() - start
    return {
        "wall_s": round(wall, 4),
        "cpu_s": round(time.process_time() - cpu, 4),
        "children_cpu_s": round(_children_cpu() - children, 4),
    }, result


def _verdict(result: Any) -> str:
    return "fixed" if result.fixed else "not fixed"


def _series(call: Callable[[], Any], runs: int, warm_up: bool) -> dict[str, Any]:
    first = _timed(call)[0] if warm_up else None
    timed, verdicts = [], set()
    for _ in range(runs):
        measured, result = _timed(call)
        timed.append(measured)
        verdicts.add(_verdict(result))
    median = {key: round(statistics.median(t[key] for t in timed), 4) for key in timed[0]}
    series = {"median": median, "runs": timed, "verdict": " / ".join(sorted(verdicts))}
    return {"warm_up": first, **series} if first else series


def _first_calls(backport_id: str) -> dict[str, Any]:
    """In a fresh interpreter of this script: the first sniff on the installed code, then
    on the vendored code."""
    import _internals

    spec = _internals.by_id(backport_id)
    resolved = _internals.resolve(spec)
    stock = _internals.installed_code(spec, resolved)
    installed, first = _timed(lambda: spec.sniff(stock))
    vendored, second = _timed(lambda: _internals.sniff_on_vendored(spec, resolved))
    return {
        "installed": {**installed, "verdict": _verdict(first)},
        "vendored": {**vendored, "verdict": _verdict(second)},
    }


def _in_fresh_interpreters(backport_id: str, runs: int) -> tuple[dict[str, Any], ...]:
    argv = [sys.executable, "-P", str(Path(__file__).resolve()), "--first-call", backport_id]
    seen = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="sniff-cost-child-") as cwd:
            done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=True)
        seen.append(json.loads(done.stdout.splitlines()[-1]))
    series = []
    for side in ("installed", "vendored"):
        timed = [{k: v for k, v in run[side].items() if k != "verdict"} for run in seen]
        median = {key: round(statistics.median(t[key] for t in timed), 4) for key in timed[0]}
        verdicts = " / ".join(sorted({run[side]["verdict"] for run in seen}))
        series.append({"median": median, "runs": timed, "verdict": verdicts})
    return tuple(series)


def measure(spec: Any, runs: int, child_runs: int) -> dict[str, Any]:
    import _internals

    imported, resolved = _timed(lambda: _internals.resolve(spec))
    stock = _internals.installed_code(spec, resolved)
    child = _internals.in_child(spec)
    if child:
        installed, vendored = _in_fresh_interpreters(spec.id, child_runs)
    else:
        installed = _series(lambda: spec.sniff(stock), runs, warm_up=True)
        vendored = _series(lambda: _internals.sniff_on_vendored(spec, resolved), runs, True)
    return {
        "id": spec.id,
        "sniff_in_child": child,
        "import_s": imported["wall_s"],
        "installed": installed,
        "vendored_upstream_only": vendored,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--child-runs", type=int, default=3)
    parser.add_argument("--first-call", help=argparse.SUPPRESS)  # a fresh interpreter's part
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/sniff_costs.json")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -P: this folder, named
    import _provenance

    if args.first_call:
        os.environ["MEGATRON_BACKPORTS_CACHE_DIR"] = str(Path.cwd() / "cache")
        print(json.dumps(_first_calls(args.first_call)))
        return
    code = _provenance.code_folder()
    git = _provenance.git_state(code)  # at the start: the code the runs measure
    started, load_before = _provenance.now(), _provenance.load_average()
    with tempfile.TemporaryDirectory(prefix="sniff-costs-") as tmp:
        # Nothing a sniff might cache lands in the user's cache; children start in a
        # private folder (the sniffs give them their own cwd, this is belt and braces).
        os.environ["MEGATRON_BACKPORTS_CACHE_DIR"] = str(Path(tmp) / "cache")
        os.chdir(tmp)
        import _internals

        entries = [spec for spec in _internals.CATALOG if args.only is None or spec.id in args.only]
        measured = []
        for spec in entries:
            row = measure(spec, args.runs, args.child_runs)
            measured.append(row)
            inst, vend = row["installed"], row["vendored_upstream_only"]
            print(
                f"{spec.id:17} {'child' if row['sniff_in_child'] else 'in-process':10} "
                f"installed {inst['median']['wall_s'] * 1000:9.1f} ms wall "
                f"{(inst['median']['cpu_s'] + inst['median']['children_cpu_s']) * 1000:9.1f} "
                f"ms cpu ({inst['verdict']}); vendored "
                f"{vend['median']['wall_s'] * 1000:9.1f} ms ({vend['verdict']})",
                flush=True,
            )
    result = {
        "what": "each builtin entry's sniff on the installed megatron-core, in process "
        "(child interpreters included where the sniff starts them), and on its vendored "
        "code upstream-only; times in seconds",
        "date": started,
        "machine": {
            **_provenance.machine(),
            "load_average_before": load_before,
            "load_average_after": _provenance.load_average(),
            "note": "2 cores shared with other engineers' test runs: wall times include their load",
        },
        "code": str(code),
        "git": git,
        "megatron_core": _provenance.megatron_core_version(),
        "python": sys.version.split()[0],
        "runs": args.runs,
        "child_runs": args.child_runs,
        "entries": measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
