"""Start-up cost of the job-start hook, and what it adds to a process that imports megatron.

    python benchmarks/startup.py [--runs 300] [--hook-runs 20] [--import-runs 8]
                                 [--apply-runs 5] [--out PATH]

Builds a throwaway training environment (tools/training_env.py: a venv with this
repository pip-installed, torch and megatron-core 0.19.2 from the running environment),
runs ``backports apply`` there (which also keeps the verdict in the venv's verdict cache),
then:

1. ``python -c pass`` in rounds, each round in random order: no hook file, an empty
   ``.pth`` file, a ``.pth`` holding just ``import sys`` (the floor for any ``.pth`` line
   that runs code: site compiles it), one importing an empty module in the ``backports``
   namespace (the floor for a line that imports a module of ours), and the hook file.
   Medians and ratios to "no hook".
2. What the hook adds to a process that imports megatron's target module: each process
   first imports every module that importing the target loads anyway (torch, packaging,
   ...; found from a process without the hook), then times ``import <target>`` alone, so
   that a ~6 s import whose wall time wanders by hundreds of ms on a shared machine
   leaves a ~0.2 s measurement whose difference is the hook's own cost. Three ways,
   interleaved: no hook, the hook (verdict cache warm: a worker after the first), the hook
   with ``MEGATRON_BACKPORTS_CACHE=0`` (every process probes).
3. Whole processes that import megatron's target module, hook vs none (CPU and wall;
   noisy, kept for comparison with earlier figures).
4. In that environment's interpreter: importing the api, ``apply()`` before megatron,
   the megatron import, and ``apply()`` right after it (revert + apply cycles, with the
   cache off: the full probe; and with it on).
"""

import argparse
import json
import platform
import py_compile
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tools"))
from training_env import TILELANG_DSA, TrainingEnv, create  # noqa: E402

_APPLY_TIMING = f"""
import json, os, sys, time
t0 = time.perf_counter()
from backports.megatron import api
t1 = time.perf_counter()
deferred = api.apply()
t2 = time.perf_counter()
api.revert()
t3 = time.perf_counter()
import {TILELANG_DSA} as target
t4 = time.perf_counter()
runs = {{}}
for cache in ("0", "1"):
    os.environ["MEGATRON_BACKPORTS_CACHE"] = cache
    runs[cache] = []
    for _ in range(int(sys.argv[1])):
        api.revert()
        start = time.perf_counter()
        reports = api.apply()
        runs[cache].append(time.perf_counter() - start)
        assert reports[0].action == "installed", reports
assert target.fused_sparse_mla_absorbed.__backport__ == "megatron-lm-7617"
print(json.dumps({{
    "import_api_s": t1 - t0,
    "apply_before_megatron_s": t2 - t1,
    "deferred_action": str(deferred[0].action),
    "megatron_import_s": t4 - t3,
    "probe_apply_after_import_s": runs["0"],
    "cached_apply_after_import_s": runs["1"],
}}))
"""

# Imports what importing the target loads anyway, then times the target's import alone.
_SHARED_MODULES = f"""
import json, sys
import {TILELANG_DSA}
print(json.dumps([m for m in sys.modules if m.split(".")[0] not in ("megatron", "backports")]))
"""
_TIMED_IMPORT = f"""
import json, sys, time
for name in json.loads(sys.argv[1]):
    try:
        __import__(name)
    except Exception:
        pass  # a module that imports only in its package's context: imported there anyway
start, cpu = time.perf_counter(), time.process_time()
import {TILELANG_DSA} as target
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps([elapsed, cpu, getattr(target.fused_sparse_mla_absorbed, "__backport__", None)]))
"""


def _time_pass(env: TrainingEnv) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one ``python -c pass``."""
    start, cpu = time.perf_counter(), _cpu_of_children()
    subprocess.run([str(env.python), "-c", "pass"], env=env.env(), check=True)
    return time.perf_counter() - start, _cpu_of_children() - cpu


# The venvs ``python -c pass`` is timed in (tools/training_env.py builds them):
# "pip_built": torch, megatron-core and what pip installs with them (setuptools, a
# dependency of torch, whose distutils-precedence.pth runs at every start-up) linked into
# the venv's one site-packages, as after `pip install torch megatron-core`; the other
# figures are measured there. "bare": this package and packaging alone, no other .pth.
_LAYOUTS = {"pip_built": "linked", "bare": "none"}


def _pass_figures(times: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Medians (wall and CPU, ms) of each variant and their ratios to "no hook"."""
    figures: dict[str, dict[str, float]] = {}
    # CPU time (user + system) of the child: steadier than wall time on a shared machine.
    for index, kind in enumerate(("", "cpu_")):
        medians = {
            name: statistics.median(v[index] for v in values) for name, values in times.items()
        }
        figures[f"{kind}median_ms"] = {k: round(v * 1e3, 3) for k, v in medians.items()}
        figures[f"{kind}ratio_to_no_hook"] = {
            k: round(v / medians["no_hook"], 4) for k, v in medians.items()
        }
    return figures


def startup_rounds(env: TrainingEnv, runs: int) -> dict[str, list[tuple[float, float]]]:
    hook_text = env.hook.read_text()
    other = env.site_packages / "zz_other_for_benchmark.pth"
    # The floor of any .pth line that imports a module of ours: an empty one, found and
    # loaded (from its .pyc) in the same `backports` namespace.
    floor = env.site_packages / "backports" / "_startup_floor" / "__init__.py"
    floor.parent.mkdir()
    floor.write_text("")
    py_compile.compile(str(floor), doraise=True)

    def only(text: str | None, hook: bool) -> None:
        other.unlink(missing_ok=True) if text is None else other.write_text(text)
        env.hook.write_text(hook_text) if hook else env.hook.unlink(missing_ok=True)

    variants = {
        "no_hook": lambda: only(None, hook=False),
        "empty_pth": lambda: only("", hook=False),
        "import_line_pth": lambda: only("import sys\n", hook=False),
        "empty_module_of_ours_pth": lambda: only("import backports._startup_floor\n", hook=False),
        "hook": lambda: only(None, hook=True),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for name in variants:  # warm the page cache and the .pyc files
        variants[name]()
        _time_pass(env)
    order = list(variants)
    for _ in range(runs):
        random.shuffle(order)
        for name in order:
            variants[name]()
            times[name].append(_time_pass(env))
    only(None, hook=True)
    shutil.rmtree(floor.parent)
    return times


def hook_rounds(env: TrainingEnv, runs: int) -> dict[str, list[tuple[float, float]]]:
    """Seconds of ``import <target>`` after everything it loads anyway, three ways."""
    hook_text = env.hook.read_text()
    env.hook.unlink()
    listed = env.run(["python", "-c", _SHARED_MODULES], timeout=600)
    if listed.returncode != 0:
        raise RuntimeError(listed.stderr)
    shared = listed.stdout.strip().splitlines()[-1]
    variants = {
        "no_hook": (False, {}, None),
        "hook": (True, {}, "megatron-lm-7617"),
        "hook_cache_off": (True, {"MEGATRON_BACKPORTS_CACHE": "0"}, "megatron-lm-7617"),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(runs):
        for name in random.sample(list(variants), len(variants)):
            hook, extra, patched = variants[name]
            env.hook.write_text(hook_text) if hook else env.hook.unlink(missing_ok=True)
            done = env.run(["python", "-c", _TIMED_IMPORT, shared], extra_env=extra)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
            elapsed, cpu, seen = json.loads(done.stdout.strip().splitlines()[-1])
            if seen != patched:
                raise RuntimeError(f"{name}: the target is {seen!r}, expected {patched!r}")
            times[name].append((elapsed, cpu))
    env.hook.write_text(hook_text)
    return times


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def import_rounds(env: TrainingEnv, runs: int) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU time of a process importing megatron's target module, hook vs none.

    CPU time (user + system) is the steadier figure: the wall time of a ~6 s import
    wanders by half a second from run to run on a shared machine.
    """
    hook_text = env.hook.read_text()
    script = f"import {TILELANG_DSA} as t\n"
    script += "assert hasattr(t.fused_sparse_mla_absorbed, '__wrapped__') == HOOK"
    times: dict[str, dict[str, list[float]]] = {
        name: {"wall": [], "cpu": []} for name in ("no_hook", "hook")
    }
    for _ in range(runs):
        for name in random.sample(list(times), 2):
            hook = name == "hook"
            env.hook.write_text(hook_text) if hook else env.hook.unlink(missing_ok=True)
            start, cpu = time.perf_counter(), _cpu_of_children()
            done = env.run(["python", "-c", script.replace("HOOK", str(hook))])
            times[name]["wall"].append(time.perf_counter() - start)
            times[name]["cpu"].append(_cpu_of_children() - cpu)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
    env.hook.write_text(hook_text)
    return times


def apply_timing(env: TrainingEnv, apply_runs: int) -> dict[str, Any]:
    env.hook.unlink(missing_ok=True)  # measured explicitly here
    done = env.run(["python", "-c", _APPLY_TIMING, str(apply_runs)], timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="rounds of python -c pass")
    parser.add_argument("--apply-runs", type=int, default=5, help="revert+apply cycles")
    parser.add_argument("--hook-runs", type=int, default=20, help="timed target imports, each way")
    parser.add_argument("--import-runs", type=int, default=8, help="megatron imports, each way")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/startup.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="backports-bench-") as tmp:
        envs = {name: create(Path(tmp) / name, packages=how) for name, how in _LAYOUTS.items()}
        for env in envs.values():
            applied = env.run(["backports", "apply"], timeout=600)
            if applied.returncode != 0 or not env.hook.exists():
                raise RuntimeError(applied.stdout + applied.stderr)
        passes = {layout: startup_rounds(env, args.runs) for layout, env in envs.items()}
        env = envs["pip_built"]
        hook_times = hook_rounds(env, args.hook_runs)
        imports = import_rounds(env, args.import_runs) if args.import_runs else None
        timing = apply_timing(env, args.apply_runs)

    after_import: list[float] = timing["probe_apply_after_import_s"]
    cached: list[float] = timing["cached_apply_after_import_s"]
    hook_figures: dict[str, Any] = {"runs": args.hook_runs}
    for index, kind in enumerate(("wall", "cpu")):
        median = {n: statistics.median(v[index] for v in vs) for n, vs in hook_times.items()}
        hook_figures[kind] = {
            **{name: round(value * 1e3, 1) for name, value in median.items()},
            "hook_adds": round((median["hook"] - median["no_hook"]) * 1e3, 1),
            "hook_cache_off_adds": round((median["hook_cache_off"] - median["no_hook"]) * 1e3, 1),
        }
    trigger = {
        "import_api": round(timing["import_api_s"] * 1e3, 2),
        "apply_before_megatron": round(timing["apply_before_megatron_s"] * 1e3, 2),
        "action": timing["deferred_action"],
    }
    result = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "runs": args.runs,
        "python_c_pass": {layout: _pass_figures(times) for layout, times in passes.items()},
        "megatron_import_s": round(timing["megatron_import_s"], 3),
        "probe_apply_after_import_ms": {
            "first": round(after_import[0] * 1e3, 2),
            "median": round(statistics.median(after_import) * 1e3, 2),
            "runs": len(after_import),
        },
        "trigger_at_megatron_import_ms": trigger,
        "cached_apply_after_import_ms": {
            "median": round(statistics.median(cached) * 1e3, 2),
            "runs": len(cached),
        },
        "target_import_after_shared_modules_median_ms": hook_figures,
    }
    if imports is not None:
        figures: dict[str, Any] = {"runs": args.import_runs}
        for kind in ("cpu", "wall"):
            hook, none = (statistics.median(imports[k][kind]) for k in ("hook", "no_hook"))
            figures[kind] = {
                "no_hook_s": round(none, 3),
                "hook_s": round(hook, 3),
                "difference_ms": round((hook - none) * 1e3, 1),
            }
        result["process_importing_megatron_median"] = figures
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for layout, figures in result["python_c_pass"].items():
        print(f"python -c pass, {layout} venv, median of {args.runs} interleaved runs each:")
        for name, value in figures["median_ms"].items():
            print(
                f"  {name:16s} {value:8.3f} ms   x{figures['ratio_to_no_hook'][name]:.4f}   "
                f"cpu {figures['cpu_median_ms'][name]:8.3f} ms   "
                f"x{figures['cpu_ratio_to_no_hook'][name]:.4f}"
            )
    print(f"megatron target import: {result['megatron_import_s']} s")
    print(f"probe + apply after import: {result['probe_apply_after_import_ms']}")
    print(f"trigger at megatron's first import: {result['trigger_at_megatron_import_ms']}")
    print(f"cached apply after import: {result['cached_apply_after_import_ms']}")
    print(
        "import of the target after the modules it loads anyway, median ms: "
        f"{result['target_import_after_shared_modules_median_ms']}"
    )
    if imports is not None:
        print(f"process importing megatron: {result['process_importing_megatron_median']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
