"""#5077 on a real ``DistributedOptimizer``: do fully-reshardable checkpoints keep Adam's moments?

megatron's own ``DistributedDataParallel`` (bf16 parameters, fp32 gradient buffer split into
several buckets whose ends are padded) and ``DistributedOptimizer`` (Adam) take real steps;
the optimizer's state is saved in the format ``--dist-ckpt-optim-fully-reshardable`` selects
(megatron.training.checkpointing._build_sharded_state_dict_metadata sets
``distrib_optim_sharding_type='fully_reshardable'``, and ``DistributedOptimizer
.sharded_state_dict`` then calls ``sharded_param_state_fully_reshardable``) through
``megatron.core.dist_checkpointing`` (torch_dist), loaded into a fresh optimizer, and every
``exp_avg`` / ``exp_avg_sq`` element compared with what the saving optimizer held.

The reference is the saving optimizer's live state, read per parameter from its own shards
(``_get_main_param_and_optimizer_states`` and each shard's range in the parameter) and put
together by parameter name on rank 0: it never goes through the checkpoint path under test.

The job calls ``backports.megatron.apply('megatron-lm-5077')``: with ``MEGATRON_BACKPORTS=0``
that is stock megatron-core 0.19.2, otherwise the backport (the JSON says which ran).

    torchrun --nproc_per_node 1 distopt_checkpoint.py --phase roundtrip --ckpt DIR --json OUT
    torchrun --nproc_per_node 2 distopt_checkpoint.py --phase save --ckpt DIR --json OUT
    torchrun --nproc_per_node 1 distopt_checkpoint.py --phase load --ckpt DIR --json OUT

``--device cpu`` rehearses the same on CPU over gloo (cuda_on_cpu.py: CPU memory stands in
for the GPU's; nothing is computed differently). Rank 0 writes the JSON; exit status 0
whatever the moments did (the caller judges), 1 when the job could not run as described.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

ID = "megatron-lm-5077"
KEYS = ("exp_avg", "exp_avg_sq")
# Sizes that are no multiple of the bucket-end divisor (lcm(dp, 128)): every bucket end but
# the last is padded. bucket_size puts about three layers in a bucket.
LAYERS, IN, OUT = 6, 70, 130
BUCKET_SIZE = 3 * (IN * OUT + OUT)


def _setup(device: str) -> None:
    if device == "cpu":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import cuda_on_cpu

        cuda_on_cpu.install()
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)


def _apply_backport() -> str | None:
    """Apply the backport unless the environment turns it off; which method runs now."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from backports.megatron import apply

    apply(ID)
    return getattr(DistributedOptimizer.sharded_param_state_fully_reshardable, "__backport__", None)


class Layers(torch.nn.Module):
    """Linear layers, replicated over data-parallel ranks, with megatron's state dict."""

    def __init__(self) -> None:
        from megatron.core.transformer import TransformerConfig

        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(IN, OUT) for _ in range(LAYERS))
        self.head = torch.nn.Linear(OUT, IN)
        self.config = TransformerConfig(
            hidden_size=8, num_attention_heads=1, num_layers=1, bf16=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(self.head(torch.tanh(layer(x))) for layer in self.layers)  # type: ignore[return-value]

    def sharded_state_dict(self) -> dict[str, Any]:
        from megatron.core import parallel_state
        from megatron.core.dist_checkpointing import ShardedTensor

        replica = (0, 0, parallel_state.get_data_parallel_rank(with_context_parallel=True))
        return {
            key: ShardedTensor.from_rank_offsets(key, tensor, replica_id=replica)
            for key, tensor in self.state_dict(keep_vars=True).items()
        }


def _build(seed: int) -> tuple[Any, Any, Layers]:
    """(DDP model, its DistributedOptimizer, the module inside), as megatron builds them."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    torch.manual_seed(seed)
    module = Layers().to(torch.cuda.current_device()).bfloat16()
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True,
        overlap_grad_reduce=True,  # else megatron keeps one bucket whatever bucket_size says
        bucket_size=BUCKET_SIZE,
        grad_reduce_in_fp32=True,
    )
    model = DistributedDataParallel(module.config, ddp_config, module)
    config = OptimizerConfig(
        optimizer="adam",
        lr=1e-2,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
    )
    return model, get_megatron_optimizer(config, [model]), module


def _inner(optimizer: Any) -> Any:
    """The DistributedOptimizer inside megatron's ChainedOptimizer."""
    (inner,) = getattr(optimizer, "chained_optimizers", [optimizer])
    return inner


def _train(model: Any, optimizer: Any, steps: int, seed: int) -> list[float]:
    generator = torch.Generator().manual_seed(seed + 1000 * dist.get_rank())
    losses = []
    for _ in range(steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        x = torch.randn(8, IN, generator=generator).to(torch.cuda.current_device()).bfloat16()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        model.finish_grad_sync()
        ok, _, _ = optimizer.step()
        assert ok, "the optimizer skipped a step"
        losses.append(float(loss))
    return losses


def _bucket_layout(optimizer: Any) -> list[list[list[int]]]:
    """Per gradient buffer: [padded, unpadded] numel of each bucket."""
    return [
        [[int(b.grad_data.numel()), int(b.numel_unpadded)] for b in buffer.buckets]
        for buffer in _inner(optimizer).buffers
    ]


def _param_buckets(optimizer: Any, module: Layers) -> dict[str, list[int]]:
    """Each parameter's [gradient buffer, bucket]: where a reader expects the padding."""
    found = {}
    for name, param in module.named_parameters():
        for index, buffer in enumerate(_inner(optimizer).buffers):
            if param in buffer.param_index_map:
                found[name] = [index, int(buffer.param_index_map[param][2])]
    return found


def moments(optimizer: Any, module: Layers) -> dict[str, dict[str, torch.Tensor]] | None:
    """On rank 0: every parameter's optimizer state, by name, from every rank's shard."""
    inner = _inner(optimizer)
    local = {}
    for name, param in module.named_parameters():
        if param not in inner.model_param_group_index_map:
            continue  # none of this parameter is in this rank's shard
        gbuf, dtype, bucket = inner.model_param_gbuf_map[param]
        where = inner.gbuf_ranges[gbuf][dtype][bucket]["param_map"][param]["param"]
        state = inner._get_main_param_and_optimizer_states(param)
        tensors = {k: state[k].detach().float().cpu().clone() for k in ("param", *KEYS)}
        local[name] = (where.start, where.end, tensors)
    shards: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shards, local)
    if dist.get_rank() != 0:
        return None
    whole = {}
    for name, param in module.named_parameters():
        found = {k: torch.full((param.numel(),), float("nan")) for k in ("param", *KEYS)}
        for shard in shards:
            if name in shard:
                start, end, tensors = shard[name]
                for key, tensor in tensors.items():
                    found[key][start:end] = tensor
        missing = int(torch.isnan(found["exp_avg"]).sum())
        assert missing == 0, f"{name}: {missing} elements in no rank's shard"
        whole[name] = found
    return whole


def _metadata() -> dict[str, Any]:
    """What megatron's training loop passes for --dist-ckpt-optim-fully-reshardable."""
    from megatron.training.checkpointing import _build_sharded_state_dict_metadata

    args = SimpleNamespace(
        use_distributed_optimizer=True,
        use_layer_wise_distributed_optimizer=False,
        ckpt_format="torch_dist",
        dist_ckpt_optim_fully_reshardable=True,
        distrib_optim_fully_reshardable_mem_efficient=False,
    )
    metadata = _build_sharded_state_dict_metadata(args)
    assert metadata["distrib_optim_sharding_type"] == "fully_reshardable", metadata
    return metadata


def save(optimizer: Any, module: Layers, ckpt: Path) -> str:
    from megatron.core import dist_checkpointing

    state = optimizer.sharded_state_dict(module.sharded_state_dict(), metadata=_metadata())
    dist_checkpointing.save(state, str(ckpt))
    return str(state["param_state_sharding_type"])


@contextlib.contextmanager
def _steps_set_aside(inner: Any) -> Iterator[None]:
    """torch's AdamW keeps ``step`` as a tensor in each parameter's state. megatron-core
    0.19.2 (and upstream main) then raises KeyError 'step' in
    ``load_parameter_state_from_fully_reshardable``, which copies every tensor of the state
    from the checkpoint's entries and skips ``step`` in those: a bug of its own, apart from
    #5077, that a TE or Apex FusedAdam (``step`` in the param groups) never meets. The steps
    are already loaded from the param groups when this runs; they are held aside meanwhile."""
    steps = {param: state.pop("step") for param, state in inner.optimizer.state.items()}
    try:
        yield
    finally:
        for param, step in steps.items():
            inner.optimizer.state[param]["step"] = step


def load(optimizer: Any, module: Layers, ckpt: Path) -> bool:
    """Load the checkpoint into ``optimizer``; True where torch's AdamW needed its steps held
    aside (see _steps_set_aside)."""
    from megatron.core import dist_checkpointing
    from megatron.core.optimizer import distrib_optimizer

    template = optimizer.sharded_state_dict(
        module.sharded_state_dict(), is_loading=True, metadata=_metadata()
    )
    state = dist_checkpointing.load(template, str(ckpt))
    if distrib_optimizer.HAVE_APEX_OR_TE:
        optimizer.load_state_dict(state)
        return False
    param_state = state.pop("param_state")
    assert state.pop("param_state_sharding_type") == "fully_reshardable"
    optimizer.load_state_dict(state)  # param groups and steps: megatron's own load
    inner = _inner(optimizer)
    with _steps_set_aside(inner):
        inner.load_parameter_state_from_fully_reshardable(param_state)
    return True


def compare(
    saved: dict[str, dict[str, torch.Tensor]], loaded: dict[str, dict[str, torch.Tensor]]
) -> dict[str, Any]:
    """Elements that differ, per parameter and key; the parameters that lost any moment."""
    params = {
        name: {
            "numel": int(saved[name]["exp_avg"].numel()),
            **{key: int((saved[name][key] != loaded[name][key]).sum()) for key in (*KEYS, "param")},
        }
        for name in saved
    }
    lost = [name for name, seen in params.items() if any(seen[key] for key in KEYS)]
    return {
        "elements": sum(2 * seen["numel"] for seen in params.values()),
        "mismatched": sum(seen[key] for seen in params.values() for key in KEYS),
        "lost_params": lost,
        "kept_every_moment": not lost,
        "params": params,
    }


def _about(device: str) -> dict[str, Any]:
    return {
        "world_size": dist.get_world_size(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (stand-in)",
        "torch": torch.__version__,
        "megatron_core": importlib.metadata.version("megatron-core"),
    }


def run(phase: str, ckpt: Path, device: str, steps: int) -> dict[str, Any]:
    result: dict[str, Any] = {"phase": phase, **_about(device)}
    result["backport"] = _apply_backport()
    if phase in ("roundtrip", "save"):
        model, optimizer, module = _build(seed=2)
        result["buckets"] = _bucket_layout(optimizer)
        result["param_buckets"] = _param_buckets(optimizer, module)
        result["losses"] = _train(model, optimizer, steps, seed=2)
        reference = moments(optimizer, module)
        result["sharding_type"] = save(optimizer, module, ckpt)
        if dist.get_rank() == 0:
            torch.save(reference, ckpt / "reference_moments.pt")
    if phase in ("roundtrip", "load"):
        model, optimizer, module = _build(seed=3)  # another start: it must not match by luck
        result["buckets"] = _bucket_layout(optimizer)
        result["param_buckets"] = _param_buckets(optimizer, module)
        _train(model, optimizer, 1, seed=3)
        dist.barrier()
        reference = torch.load(ckpt / "reference_moments.pt") if dist.get_rank() == 0 else None
        before = moments(optimizer, module)
        result["steps_held_aside"] = load(optimizer, module, ckpt)
        after = moments(optimizer, module)
        if reference is not None and before is not None and after is not None:
            result["differed_before_load"] = compare(reference, before)["mismatched"] > 0
            result.update(compare(reference, after))
    padded = [b for buffer in result["buckets"] for b in buffer[:-1] if b[0] > b[1]]
    result["padded_bucket_ends"] = len(padded)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("roundtrip", "save", "load"), default="roundtrip")
    parser.add_argument("--ckpt", type=Path, required=True, help="the checkpoint folder")
    parser.add_argument("--json", type=Path, required=True, help="rank 0 writes its result")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    _setup(args.device)
    args.ckpt.mkdir(parents=True, exist_ok=True)
    result = run(args.phase, args.ckpt, args.device, args.steps)
    if dist.get_rank() == 0:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
