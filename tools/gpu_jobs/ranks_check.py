#!/usr/bin/env python3
"""Two ranks of a DSA job (issue 38, item 1): they agree, and a rank without backports is caught.

Run after ``backports apply`` (the start-up hook installs the backports in each rank):

    python3 tools/gpu_jobs/ranks_check.py --json OUT/ranks_nccl.json          (2 GPUs, NCCL)
    python3 tools/gpu_jobs/ranks_check.py --device cpu --json ranks_gloo.json (rehearsal)

1. ``agree``: ``torchrun --nproc_per_node 2`` of dsa_ranks.py: both ranks must install
   every backport ``status()`` calls needed, pass ``verify_ranks()``, and run the DSA
   attention fused, with the same all-reduced loss.
2. ``rank1_off``: the same job with ``MEGATRON_BACKPORTS=0`` on rank 1 only, through
   per_rank_env.sh (torchrun gives every rank one environment): it must fail on every rank
   within 60 s, each rank with the same one line naming the difference.

Writes one JSON (both runs' per-rank results and each check) and exits 0 when every check
holds, 1 when one does not. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LIMIT_S = 60.0  # issue 38: a mixed job fails on every rank within a minute
# NVLink multicast stays off: on a shared host it can put the GPUs out of service.
_SAFE = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def launch(
    python: str, device: str, out: Path, timeout_s: float, per_rank: dict[str, str]
) -> dict[str, Any]:
    """One torchrun of two ranks through the per-rank wrapper: exit status, wall seconds,
    each rank's JSON (None where a rank wrote none), the output's tail."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PER_RANK_ENV_")}
    env |= _SAFE | {"OMP_NUM_THREADS": "1"} | per_rank
    command = [python, "-P", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    # bash runs the wrapper: a copy of the tree that lost its executable bit still works
    command += ["--no-python", "bash", str(HERE / "per_rank_env.sh"), python, "-P"]
    command += [str(HERE / "dsa_ranks.py"), "--out", str(out), "--device", device]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=out.parent, env=env, capture_output=True, text=True, timeout=timeout_s
        )
        code, tail = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = None, f"timed out after {timeout_s:g} s: {str(exc.stderr or '')[-2000:]}"
    ranks = []
    for rank in (0, 1):
        path = out / f"rank-{rank}.json"
        ranks.append(json.loads(path.read_text()) if path.is_file() else None)
    seconds = round(time.monotonic() - started, 1)
    return {"exit": code, "seconds": seconds, "ranks": ranks, "tail": tail}


def agree_checks(run: dict[str, Any]) -> dict[str, bool]:
    ranks = [r or {} for r in run["ranks"]]
    return {
        "agree: exit 0": run["exit"] == 0,
        "agree: the hook installed backports on both ranks": all(r.get("running") for r in ranks),
        "agree: verify_ranks passed on both": all(r.get("verified") for r in ranks)
        and ranks[0].get("verified") == ranks[1].get("verified"),
        "agree: every needed backport installed on both": all(
            r.get("needed") and r.get("needed_not_installed") == [] for r in ranks
        ),
        "agree: attention ran fused through the backport on both": all(
            r.get("fused") is True and r.get("function") == "megatron-lm-7617" for r in ranks
        ),
        "agree: one all-reduced loss": ranks[0].get("loss_summed_over_ranks") is not None
        and ranks[0].get("loss_summed_over_ranks") == ranks[1].get("loss_summed_over_ranks"),
    }


def rank1_off_checks(run: dict[str, Any]) -> dict[str, bool]:
    ranks = [r or {} for r in run["ranks"]]
    lines = [r.get("raised") for r in ranks]
    return {
        "rank1_off: the job failed": run["exit"] not in (0, None),
        "rank1_off: rank 1 ran without backports": ranks[1].get("running") == {},
        "rank1_off: every rank raised": all(lines),
        "rank1_off: the same one line on every rank": lines[0] == lines[1]
        and "\n" not in str(lines[0]),
        "rank1_off: it names the difference": "differing from rank 0: rank 1." in str(lines[0])
        and "rank 1: none" in str(lines[0]),
        f"rank1_off: within {LIMIT_S:g} s": run["exit"] is not None and run["seconds"] < LIMIT_S,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--python", default=sys.executable, help="the job's interpreter")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ranks-check-") as scratch:
        agree = launch(args.python, args.device, Path(scratch) / "agree", 600, {})
        off = launch(
            args.python,
            args.device,
            Path(scratch) / "rank1_off",
            2 * LIMIT_S,
            {"PER_RANK_ENV_1": "MEGATRON_BACKPORTS=0"},
        )
    checks = agree_checks(agree) | rank1_off_checks(off)
    result = {"device": args.device, "agree": agree, "rank1_off": off, "checks": checks}
    result["ok"] = all(checks.values())
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    for name, held in checks.items():
        print(f"{'ok  ' if held else 'FAIL'} {name}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
