#!/usr/bin/env python3
"""#5077 at data-parallel size 2 (issue 38, item 2): save at DP=2, load at DP=1 and at DP=2.

For the backport and for stock megatron-core 0.19.2 (``MEGATRON_BACKPORTS=0``), three
torchrun launches of distopt_checkpoint.py: ``--phase save`` on 2 ranks, then ``--phase
load`` on 1 rank and on 2 ranks from that checkpoint (a fully-reshardable checkpoint may be
loaded at another data-parallel size).

    python3 tools/gpu_jobs/distopt_dp2.py --json OUT/distopt_dp2.json          (2 GPUs, NCCL)
    python3 tools/gpu_jobs/distopt_dp2.py --device cpu --json distopt_dp2.json (gloo rehearsal)

Writes one JSON (each launch's result from rank 0, and the checks) and exits 0 when the
backport keeps every Adam moment at both loads and stock loses some at both, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

JOB = Path(__file__).resolve().parent / "distopt_checkpoint.py"
# NVLink multicast stays off: on a shared host it can put the GPUs out of service.
_SAFE = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
LAUNCHES = (("save", 2), ("load", 1), ("load", 2))


def launch(
    python: str, device: str, work: Path, stock: bool, phase: str, nproc: int
) -> dict[str, Any]:
    """One torchrun; rank 0's JSON, or the exit status and the output's tail."""
    mode = "stock" if stock else "backport"
    out = work / f"{mode}-{phase}-dp{nproc}.json"
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_BACKPORTS"}
    env |= _SAFE | {"OMP_NUM_THREADS": "1"} | ({"MEGATRON_BACKPORTS": "0"} if stock else {})
    command = [python, "-P", "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(nproc), str(JOB), "--phase", phase, "--device", device]
    command += ["--ckpt", str(work / f"ckpt-{mode}"), "--json", str(out)]
    done = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0 or not out.is_file():
        return {"exit": done.returncode, "tail": (done.stdout + done.stderr)[-3000:]}
    return {"exit": 0, **json.loads(out.read_text())}


def checks(runs: dict[str, dict[str, Any]]) -> dict[str, bool]:
    found = {}
    for name in ("load-dp1", "load-dp2"):
        kept, stock = runs[f"backport-{name}"], runs[f"stock-{name}"]
        found[f"backport {name}: every moment kept"] = (
            kept.get("backport") == "megatron-lm-5077"
            and kept.get("differed_before_load") is True
            and kept.get("mismatched") == 0
            and kept.get("elements", 0) > 0
        )
        found[f"stock {name}: some moments lost"] = (
            stock.get("backport") is None and stock.get("mismatched", 0) > 0
        )
    found["saved at data-parallel size 2"] = all(
        runs[f"{mode}-save-dp2"].get("world_size") == 2 for mode in ("backport", "stock")
    )
    found["a padded bucket end before the last bucket"] = all(
        run.get("padded_bucket_ends", 0) >= 1 for run in runs.values()
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--python", default=sys.executable, help="the job's interpreter")
    args = parser.parse_args(argv)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="distopt-dp2-") as scratch:
        for stock in (False, True):
            for phase, nproc in LAUNCHES:
                name = f"{'stock' if stock else 'backport'}-{phase}-dp{nproc}"
                runs[name] = launch(args.python, args.device, Path(scratch), stock, phase, nproc)
    found = checks(runs)
    result = {"device": args.device, "runs": runs, "checks": found, "ok": all(found.values())}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    for name, held in found.items():
        print(f"{'ok  ' if held else 'FAIL'} {name}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
