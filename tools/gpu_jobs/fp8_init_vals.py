"""#6507 on megatron's real builder: ``get_megatron_optimizer`` over megatron's own
``DistributedDataParallel`` and ``DistributedOptimizer`` (bf16, Adam, one rank), through the
name ``megatron.training.training`` imported it by.

    python fp8_init_vals.py --device cuda --json OUT     (one GPU, NCCL)
    python fp8_init_vals.py --device cpu --json OUT      (rehearsal: gloo, cuda_on_cpu.py)

Each parameter carries what Transformer Engine gives an FP8 primary weight for its host
copy: ``get_high_precision_init_val`` / ``clear_high_precision_init_val`` (Transformer
Engine itself is not needed: the distributed optimizer releases the copy only for quantized
parameters, so a bf16 parameter's copy is left to the builder). The builder runs three times
in one process: stock, with the backport applied, after revert. Rank 0 writes, per run, how
many of the copies are still held after the builder returned.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ID = "megatron-lm-6507"
LAYERS, WIDTH = 3, 16


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _setup(device: str) -> None:
    # A one-process group: its own free port, whatever MASTER_PORT a parent left behind
    # (a fixed or inherited port collides with another job's store on a shared machine).
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if device == "cpu":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import cuda_on_cpu

        cuda_on_cpu.install()
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl")
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)


class Layers(torch.nn.Module):
    def __init__(self) -> None:
        from megatron.core.transformer import TransformerConfig

        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.config = TransformerConfig(
            hidden_size=8, num_attention_heads=1, num_layers=1, bf16=True
        )


def _with_host_copies(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Give each parameter a host (CPU) copy of its initial value, as TE's FP8 weights."""
    params = list(module.parameters())
    for param in params:
        param._host_copy = param.detach().float().cpu().clone()  # type: ignore[attr-defined]
        param.get_high_precision_init_val = lambda p=param: p._host_copy  # type: ignore[attr-defined]

        def clear(p: torch.nn.Parameter = param) -> None:
            p._host_copy = None  # type: ignore[attr-defined]

        param.clear_high_precision_init_val = clear  # type: ignore[attr-defined]
    return params


def _build_once() -> dict[str, Any]:
    """A model and its optimizer, as megatron's training loop builds them."""
    import megatron.training.training as training
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    torch.manual_seed(0)
    module = Layers().to(torch.cuda.current_device()).bfloat16()
    params = _with_host_copies(module)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    model = DistributedDataParallel(module.config, ddp_config, module)
    config = OptimizerConfig(
        optimizer="adam",
        lr=1e-2,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
    )
    builder = training.get_megatron_optimizer
    optimizer = builder(config, [model])
    held = sum(1 for p in params if p._host_copy is not None)  # type: ignore[attr-defined]
    return {
        "builder_backport": getattr(builder, "__backport__", None),
        "optimizer": type(optimizer).__name__,
        "params": len(params),
        "host_copies_held": held,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    _setup(args.device)
    from backports.megatron import apply, revert

    runs = {"stock": _build_once()}
    applied = [(r.id, r.verdict.value, r.action.value) for r in apply(only=ID)]
    runs["backport"] = _build_once()
    revert(only=ID)
    runs["reverted"] = _build_once()
    result = {"device": args.device, "applied": applied, "runs": runs}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
