"""One rank of a DSA job started by torchrun: the start-up hook's backports, checked across ranks.

Run with the start-up hook written (``backports apply``) and without calling ``apply()``:
importing megatron's DSA modules is what installs the backports, as in a training job.
Then, in this order:
1. ``verify_ranks()``: every rank runs the same backports. A difference raises
   ``BackportError`` on every rank; the rank writes it to its JSON, prints it as one line
   and exits 1 (before any kernel is compiled or any collective a mixed job could hang in).
2. ``status()``: every backport it calls ``needed`` is installed on this rank.
3. DSA attention through the installed ``fused_sparse_mla_absorbed`` (GLM-5.3-Flash's
   shape per rank: 16 heads, NoPE width 512, top-k 2051), forward and backward; the loss is
   all-reduced over the ranks.

    torchrun --nproc_per_node 2 dsa_ranks.py --out DIR          (cuda: NCCL, TileLang kernel)
    PER_RANK_ENV_1=MEGATRON_BACKPORTS=0 torchrun --nproc_per_node 2 --no-python \\
        bash per_rank_env.sh python3 -P dsa_ranks.py --out DIR  (rank 1 without backports)

``--device cpu`` rehearses it over gloo with the package's FP32 stand-in for TileLang's
``SparseMLA`` (backports.megatron.testing.fake_kernel), the only part replaced. Each rank
writes ``DIR/rank-<RANK>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
DSA = "megatron.core.transformer.experimental_attention_variant.dsa"
HEADS, WIDTH, V_CHANNELS, TOPK = 16, 512, 512, 2051
SHAPES = {"cuda": (1024, 4096), "cpu": (4, 64)}  # (query tokens, key tokens) per rank


def _init(device: str) -> None:
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")


def _import_dsa(device: str) -> Any:
    """megatron's DSA modules: the start-up hook installs the backports on this import."""
    import importlib

    module = importlib.import_module(TILELANG_DSA)
    importlib.import_module(DSA)
    if device == "cpu":  # no TileLang here: the package's honest FP32 stand-in
        from backports.megatron.testing.fake_kernel import FakeSparseMLA

        module.SparseMLA = FakeSparseMLA()
    return module


def _needed_not_installed() -> tuple[list[str], list[str]]:
    """(what status() calls needed, which of those this rank has not installed)."""
    from backports.megatron import status
    from backports.megatron.job.ranks import installed_backports

    needed = sorted(r.id for r in status() if str(r.verdict) == "needed")
    have = installed_backports()
    return needed, [backport_id for backport_id in needed if backport_id not in have]


def _attention(module: Any, device: str) -> dict[str, Any]:
    """Forward and backward through the installed function; whether it ran fused."""
    sq, sk = SHAPES[device]
    target = "cuda" if device == "cuda" else "cpu"
    generator = torch.Generator(device=target).manual_seed(1234 + dist.get_rank())
    query = torch.randn(sq, 1, HEADS, WIDTH, device=target, generator=generator)
    key = torch.randn(sk, 1, 1, WIDTH, device=target, generator=generator)
    query = query.bfloat16().requires_grad_(True)
    key = key.bfloat16().requires_grad_(True)
    indices = torch.randint(0, sk, (1, sq, TOPK), device=target, generator=generator)
    fn = module.fused_sparse_mla_absorbed
    out = fn(query, key, indices, WIDTH**-0.5, V_CHANNELS)
    if out is None:  # stock 0.19.2: width 512 and top-k 2051 are not for the kernel
        return {"fused": False, "function": getattr(fn, "__backport__", None)}
    loss = out.float().pow(2).mean()
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return {
        "fused": True,
        "function": getattr(fn, "__backport__", None),
        "loss": float(loss),
        "loss_summed_over_ranks": float(total),
        "grad_finite": bool(torch.isfinite(query.grad).all() and torch.isfinite(key.grad).all()),
    }


def run(device: str) -> dict[str, Any]:
    from backports.megatron import BackportError, verify_ranks
    from backports.megatron.job.ranks import running_backports

    started = time.monotonic()
    _init(device)
    rank = dist.get_rank()
    result: dict[str, Any] = {"rank": rank, "world_size": dist.get_world_size()}
    result["backports_env"] = os.environ.get("MEGATRON_BACKPORTS")
    module = _import_dsa(device)
    result["running"] = running_backports()
    try:
        result["verified"] = sorted(verify_ranks())
    except BackportError as exc:
        result["raised"] = str(exc)
        result["seconds"] = round(time.monotonic() - started, 1)
        return result
    result["needed"], result["needed_not_installed"] = _needed_not_installed()
    result.update(_attention(module, device))
    if device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="each rank writes rank-N.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    result = run(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{result['rank']}.json").write_text(json.dumps(result, indent=1))
    if "raised" in result:
        print(f"backports: {result['raised']}", file=sys.stderr, flush=True)
        os._exit(1)  # no teardown collective: the other ranks may be gone already
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
