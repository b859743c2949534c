"""The GPU jobs rehearsed on CPU, so a GPU's scarce minutes are not spent on a trivial error.

- #5077's one-GPU test (tests/gpu/test_distopt_5077_gpu.py), the same code and checks, on
  CPU over gloo: megatron's real DDP and DistributedOptimizer, with the GPU's memory stood
  in for by the CPU's (tools/gpu_jobs/cuda_on_cpu.py; no kernel is replaced).
- issue 38's two-GPU scripts with two gloo processes: #5077 saved at data-parallel size 2 and
  loaded at 1 and 2 (tools/gpu_jobs/distopt_dp2.py), and the DSA job whose ranks must agree
  (tools/gpu_jobs/ranks_check.py: the start-up hook in a throwaway venv, rank 1 turned off
  by the per-rank wrapper; TileLang's kernel is the package's FP32 stand-in).
Each test checks the scripts' JSON with its own expectations (the parameters behind a padded
bucket end, worked out from the layout), not with the scripts' verdicts alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_environment_plugins
from tests.gpu.test_distopt_5077_gpu import behind_padding, check_kept, check_lost, roundtrip
from tests.paths import ROOT
from tests.upstream_tests.test_upstream_tests import private_tmp  # noqa: F401

sys.path.insert(0, str(ROOT / "tools"))
import training_env

# Temporary folders, the scripts' and torchrun's, in the test's own.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("private_tmp")]

JOBS = ROOT / "tools" / "gpu_jobs"


def test_the_one_gpu_test_of_5077_rehearsed_on_cpu(tmp_path: Path) -> None:
    roundtrip(tmp_path, "cpu")


def test_5077_saved_at_dp2_and_loaded_at_dp1_and_dp2_rehearsed_on_gloo(tmp_path: Path) -> None:
    out = tmp_path / "distopt_dp2.json"
    command = [sys.executable, "-P", str(JOBS / "distopt_dp2.py"), "--device", "cpu"]
    done = subprocess.run(
        [*command, "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=1200
    )
    result = json.loads(out.read_text())
    assert done.returncode == 0, (done.stdout, result["checks"])
    runs = result["runs"]
    assert [runs[f"{m}-save-dp2"]["world_size"] for m in ("backport", "stock")] == [2, 2]
    for load in ("load-dp1", "load-dp2"):
        check_kept(runs[f"backport-{load}"])
        check_lost(runs[f"stock-{load}"])
        assert sorted(runs[f"stock-{load}"]["lost_params"]) == behind_padding(runs[f"stock-{load}"])
    assert [runs[f"backport-load-dp{n}"]["world_size"] for n in (1, 2)] == [1, 2]


@pytest.fixture
def hooked_venv(tmp_path: Path) -> training_env.TrainingEnv:
    """A throwaway venv with this package installed and its start-up hook written."""
    venv = training_env.create(tmp_path / "venv", always=skip_environment_plugins())
    done = venv.run(["backports", "apply"])
    assert done.returncode == 0, done.stdout + done.stderr
    return venv


def test_two_ranks_agree_and_one_without_backports_fails_every_rank_rehearsed_on_gloo(
    hooked_venv: training_env.TrainingEnv, tmp_path: Path
) -> None:
    out = tmp_path / "ranks.json"
    command = ["python", "-P", str(JOBS / "ranks_check.py"), "--device", "cpu"]
    command += ["--python", str(hooked_venv.python), "--json", str(out)]
    scratch = {"TMPDIR": os.environ["TMPDIR"]}  # training_env's processes: their own environ
    done = hooked_venv.run(command, cwd=tmp_path, timeout=900, extra_env=scratch)
    result = json.loads(out.read_text())
    assert done.returncode == 0, (done.stdout, result["checks"])
    agree = result["agree"]["ranks"]
    assert agree[0]["verified"] == agree[1]["verified"]
    assert "megatron-lm-7617" in agree[0]["verified"] and agree[0]["fused"] is True
    off = result["rank1_off"]
    line = off["ranks"][0]["raised"]
    assert off["ranks"][1]["raised"] == line
    assert line.startswith("megatron-backports differ across ranks; differing from rank 0: rank 1.")
    assert "rank 1: none" in line and "\n" not in line
    assert off["ranks"][1]["backports_env"] == "0" and off["ranks"][0]["backports_env"] is None
    assert off["seconds"] < 60
