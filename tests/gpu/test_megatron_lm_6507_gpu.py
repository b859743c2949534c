"""#6507 on one GPU: megatron's real ``get_megatron_optimizer`` over its own
``DistributedDataParallel`` and ``DistributedOptimizer`` (bf16, Adam, NCCL, one rank), called
by the name ``megatron.training.training`` holds. Each parameter carries a host copy behind
``get_/clear_high_precision_init_val`` as Transformer Engine's FP8 primary weights do: the
builder leaves all six stock, none with the backport, six after revert.

tests/entries/test_megatron_lm_6507.py rehearses the same job on CPU (gloo, cuda_on_cpu.py).
Run on an H100 (torch 2.11, CUDA 13.0) on 2026-12-06 with `tools/gpu_run.sh tests`: passed,
14 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NEEDS_TILELANG = False  # tests/gpu/conftest.py: CUDA alone
pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # a child interpreter over NCCL

JOB = Path(__file__).resolve().parents[2] / "tools" / "gpu_jobs" / "fp8_init_vals.py"
ID = "megatron-lm-6507"


def test_real_builder_on_a_gpu_keeps_then_releases_then_keeps(tmp_path: Path) -> None:
    out = tmp_path / "fp8_init_vals.json"
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_BACKPORTS"}
    env |= {"NCCL_NVLS_ENABLE": "0"}
    command = [sys.executable, "-P", str(JOB), "--device", "cuda", "--json", str(out)]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    print(json.dumps(result))  # the GPU's name and each run, in the log
    runs = result["runs"]
    held = {name: run["host_copies_held"] for name, run in runs.items()}
    assert held == {"stock": 6, "backport": 0, "reverted": 6}
    assert runs["backport"]["builder_backport"] == ID
