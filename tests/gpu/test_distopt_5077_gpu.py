"""#5077 on a real megatron ``DistributedOptimizer`` on one GPU: a fully-reshardable
checkpoint keeps every Adam moment with the backport and loses some on stock 0.19.2.

Each run is a child job (tools/gpu_jobs/distopt_checkpoint.py under ``torchrun
--nproc_per_node 1``: a process group of one over NCCL): megatron's own DDP (bf16, fp32
gradient buffer in several buckets whose ends are padded) and ``DistributedOptimizer``
(Adam), three real steps, the optimizer's state saved as ``--dist-ckpt-optim-fully-
reshardable`` saves it, loaded into a fresh optimizer, every ``exp_avg`` / ``exp_avg_sq``
element compared with the saving optimizer's own. Stock is the same job under
``MEGATRON_BACKPORTS=0``. Which parameters stock must lose is worked out here from the
bucket layout alone (those behind a padded bucket end), not from the code under test.

tests/project/test_gpu_jobs_rehearsal.py runs the same checks on CPU (gloo, the GPU's memory
stood in for by the CPU's), so a GPU's minutes are not spent on a trivial error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NEEDS_TILELANG = False  # tests/gpu/conftest.py: CUDA alone
pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # slow: each run is a torchrun child

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tools" / "gpu_jobs" / "distopt_checkpoint.py"
ID = "megatron-lm-5077"


def run_job(
    folder: Path, *, stock: bool, device: str, phase: str, nproc: int, ckpt: Path
) -> dict[str, Any]:
    """One torchrun launch of the job; rank 0's JSON. A job that fails fails the test, with
    its output's tail."""
    name = f"{'stock' if stock else 'backport'}-{phase}-{nproc}"
    out = folder / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("MEGATRON_BACKPORTS", "RANK")}
    env |= {"OMP_NUM_THREADS": "1", "NCCL_NVLS_ENABLE": "0"}
    if stock:
        env["MEGATRON_BACKPORTS"] = "0"
    command = [sys.executable, "-P", "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(nproc), str(JOB), "--phase", phase, "--device", device]
    command += ["--ckpt", str(ckpt), "--json", str(out)]
    done = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr[-4000:]}"
    record = os.environ.get("GPU_DISTOPT_RECORD")  # tools/gpu_run.sh keeps each run's JSON
    if record:
        Path(record).mkdir(parents=True, exist_ok=True)
        (Path(record) / f"distopt_{device}_{name}.json").write_text(out.read_text())
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def behind_padding(result: dict[str, Any]) -> list[str]:
    """The parameters in a bucket after a padded bucket end, from the layout alone: their
    offsets in the padded buffer and in the compact saved state differ."""
    lost = []
    for name, (buffer, bucket) in result["param_buckets"].items():
        before = result["buckets"][buffer][:bucket]
        if sum(padded - unpadded for padded, unpadded in before) > 0:
            lost.append(name)
    return sorted(lost)


def check_layout(result: dict[str, Any]) -> None:
    """The case the bug needs: several buckets, a padded end before the last one."""
    assert all(len(buckets) >= 2 for buckets in result["buckets"]), result["buckets"]
    assert result["padded_bucket_ends"] >= 1, result["buckets"]
    assert behind_padding(result), "no parameter sits behind a padded bucket end"


def check_kept(result: dict[str, Any]) -> None:
    check_layout(result)
    assert result["backport"] == ID
    assert result["differed_before_load"] is True  # the fresh optimizer had other moments
    assert result["elements"] == 2 * sum(p["numel"] for p in result["params"].values())
    assert (result["mismatched"], result["lost_params"]) == (0, [])
    assert result["kept_every_moment"] is True


def check_lost(result: dict[str, Any]) -> None:
    check_layout(result)
    assert result["backport"] is None  # MEGATRON_BACKPORTS=0: megatron-core 0.19.2 as is
    assert sorted(result["lost_params"]) == behind_padding(result)
    for name in behind_padding(result):
        assert result["params"][name]["exp_avg"] > 0 and result["params"][name]["exp_avg_sq"] > 0
    kept = set(result["params"]) - set(behind_padding(result))
    assert kept and all(result["params"][n]["exp_avg"] == 0 for n in kept)


def roundtrip(tmp_path: Path, device: str) -> None:
    for stock, check in ((False, check_kept), (True, check_lost)):
        ckpt = tmp_path / f"ckpt-{'stock' if stock else 'backport'}"
        result = run_job(
            tmp_path, stock=stock, device=device, phase="roundtrip", nproc=1, ckpt=ckpt
        )
        assert result["sharding_type"] == "fully_reshardable"
        assert result["world_size"] == 1
        check(result)


def test_fully_reshardable_checkpoint_keeps_every_adam_moment_on_one_gpu(tmp_path: Path) -> None:
    roundtrip(tmp_path, "cuda")
