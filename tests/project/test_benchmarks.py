"""The GPU benchmarks' set-up and one tiny configuration, on CPU with the fake kernel.

The benchmarks run on a GPU host once in a while; these tests run their code in CI so that
an API change (``apply()``'s return shape, a megatron module's constructor) breaks here,
not on the next GPU run. The real megatron-core 0.19.2 modules run; only TileLang's
``SparseMLA`` is the honest FP32 stand-in from ``backports.megatron.testing.fake_kernel``.
"""

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from backports.megatron import apply, revert
from backports.megatron.testing.fake_kernel import FakeSparseMLA
from tests.conftest import BACKPORT_ID
from tests.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"


def load(name: str) -> ModuleType:
    """A fresh copy of benchmarks/<name>.py (their module globals are per run)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~20-30 s on a busy 2-core CPU: megatron's import, FP32 fake kernel
def test_sparse_mla_benchmark_runs_one_tiny_config(fake_kernel: FakeSparseMLA, tmp_path: Path):
    bench = load("sparse_mla")
    out = tmp_path / "sparse_mla.json"
    report = bench.main(
        ["--json", str(out), "--md", str(tmp_path / "sparse_mla.md"), "--device", "cpu",
         "--configs", "1x64", "--topk", "67", "--reps", "1", "--bwd-reps", "1",
         "--warmup", "0", "--dense-reps", "1"]
    )  # fmt: skip

    (section,) = report["sections"]
    rows = section["variants"]
    assert set(rows) == {"backport_upstream_only", "backport", "upstream_pr", "kernel", "dense"}
    # Each adapter hands the kernel what the kernel-alone variant gets: same output.
    for name in ("backport_upstream_only", "backport", "upstream_pr"):
        assert rows[name]["bit_exact_vs_kernel"] is True, name
        assert rows[name]["fwd_bwd"]["n"] == 1
    assert rows["dense"]["fwd"]["n"] == 1
    assert fake_kernel.calls, "the variants never reached the (fake) kernel"
    assert json.loads(out.read_text())["shape"]["kernel_topk"] == 128
    assert "| 64 | backport |" in (tmp_path / "sparse_mla.md").read_text()


TINY_MODEL = [
    "--device", "cpu", "--shapes", "1x64", "--steps", "3", "--warmup", "1", "--layers", "2",
    "--hidden", "64", "--ffn", "128", "--q-lora-rank", "32", "--qk-head-dim", "16",
    "--v-head-dim", "16", "--indexer-heads", "4", "--indexer-head-dim", "16", "--topk", "35",
    "--vocab", "128",
]  # fmt: skip


@pytest.mark.slow
def test_dsa_training_backport_runs_the_kernel_and_stock_falls_back(
    fake_kernel: FakeSparseMLA, tmp_path: Path
):
    """Real megatron layers (GPTModel, AbsorbedMLA, DSAttention, DSAIndexer), AdamW: with the
    backport installed attention reaches SparseMLA; stock 0.19.2 takes the dense fallback;
    the two runs' losses and grad norms agree (FP32 fake kernel against dense)."""
    training = load("dsa_training")
    training_report = load("dsa_training_report")
    apply(BACKPORT_ID)  # what the start-up hook does in a job
    backport = training.main(["--json", str(tmp_path / "backport.json"), *TINY_MODEL])
    revert()
    stock = training.main(["--json", str(tmp_path / "stock.json"), *TINY_MODEL])

    (b_shape,) = backport["shapes"]
    (s_shape,) = stock["shapes"]
    assert b_shape["status"] == s_shape["status"] == "ok"
    assert BACKPORT_ID in backport["installed_backports"]
    assert BACKPORT_ID not in stock["installed_backports"]
    # 2 layers x 3 forward passes; the kernel's backward is its own autograd, not apply().
    assert b_shape["calls"] == {"kernel": 6, "dense": 0, "naive_indexer": 6}
    assert s_shape["calls"] == {"kernel": 0, "dense": 6, "naive_indexer": 6}
    assert len(fake_kernel.calls) == 6

    report = training_report.compare(backport, stock)
    (row,) = report["rows"]
    assert (row["backport"]["attention"], row["stock"]["attention"]) == (
        "fused kernel",
        "dense fallback",
    )
    agree = report["agreement"]["64"]
    assert agree["steps"] == 3
    assert agree["max_loss_rel_diff"] <= training_report.LOSS_RTOL
    assert agree["max_grad_norm_rel_diff"] <= training_report.GRAD_NORM_RTOL
    assert "| 64 | backport | fused kernel | ok |" in training_report.markdown(report)
