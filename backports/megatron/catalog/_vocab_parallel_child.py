"""megatron-lm-7466's sniff: one rank of a two-rank gloo group on CPU, run by path in a child
interpreter (``python -I FILE JSON``); the parent starts two of them.

This file imports nothing of megatron-backports. The argument names the ``sys.path`` to use,
this rank, the world size, a file store both ranks meet at (a private temporary file: no
port is chosen, so none can collide), and one or more forwards of megatron's
``_VocabParallelCrossEntropy`` to judge, each by the file its code comes from: megatron's
own module (the installed forward) or another file (the vendored one, loaded by path). Each
forward is put on the live class in turn and ``vocab_parallel_cross_entropy`` runs on this
rank's half of the vocabulary, with and without label smoothing.

The reference is independent of megatron: the whole vocabulary in one process, float64,
``log_softmax`` and the label-smoothed target distribution written out (1 - alpha on the
label, alpha / (V - 1) on each other id), its gradient by autograd. Prints one line,
``SNIFF <json>``: per forward and smoothing, this rank's largest loss and gradient errors.
"""

import datetime
import importlib
import importlib.util
import json
import os
import sys
from typing import Any

_SEQ, _BATCH, _VOCAB = 3, 2, 8  # logits [3, 2, 8]: each of 2 ranks holds 4 vocabulary ids
_SMOOTHINGS = (0.0, 0.1)  # 0.0: the control (no smoothing: every version is right)
_MODULE = "megatron.core.tensor_parallel.cross_entropy"
_CLASS = "_VocabParallelCrossEntropy"

# torch is imported inside the functions, after the path is set, and is untyped to mypy.
Tensor = Any  # a torch.Tensor


def _inputs() -> dict[str, Tensor]:
    """The same logits, labels and upstream gradient on every rank (a seeded generator)."""
    import torch

    generator = torch.Generator().manual_seed(7466)
    logits = torch.randn(_SEQ, _BATCH, _VOCAB, generator=generator, dtype=torch.float64) * 3
    labels = torch.randint(0, _VOCAB, (_SEQ, _BATCH), generator=generator)
    grad_output = torch.rand(_SEQ, _BATCH, generator=generator, dtype=torch.float64) + 0.5
    return {"logits": logits, "labels": labels, "grad_output": grad_output}


def reference(data: dict[str, Tensor], alpha: float) -> tuple[Tensor, Tensor]:
    """Per-token loss and the gradient of sum(loss * grad_output) over the whole
    vocabulary: cross-entropy against the label-smoothed target distribution."""
    import torch

    logits = data["logits"].clone().requires_grad_(True)
    log_probs = torch.log_softmax(logits, dim=-1)
    wanted = torch.full_like(log_probs, alpha / (_VOCAB - 1))
    wanted.scatter_(-1, data["labels"].unsqueeze(-1), 1.0 - alpha)
    loss = -(wanted * log_probs).sum(dim=-1)
    (loss * data["grad_output"]).sum().backward()
    return loss.detach(), logits.grad


def _forward_from(file: str, megatron_module: Any) -> Any:
    """The forward a set names: megatron's own (its module's file) or the function
    ``forward`` of the file named, loaded as a private module."""
    if os.path.realpath(file) == os.path.realpath(megatron_module.__file__):
        return vars(getattr(megatron_module, _CLASS))["forward"]
    spec = importlib.util.spec_from_file_location("_backports_sniffed_forward", file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return staticmethod(module.forward)


def _on_this_rank(
    megatron_module: Any, data: dict[str, Tensor], alpha: float, rank: int, world: int
) -> dict[str, float]:
    """megatron's ``vocab_parallel_cross_entropy`` on this rank's shard (float32), compared
    with the reference: the largest loss and gradient errors, and whether it is finite."""
    import torch

    width = _VOCAB // world
    columns = slice(rank * width, (rank + 1) * width)
    shard = data["logits"][..., columns].float().clone().requires_grad_(True)
    # The forward may shift and exponentiate its input in place: it gets a copy.
    loss = megatron_module.vocab_parallel_cross_entropy(
        shard * 1.0, data["labels"], alpha, torch.distributed.group.WORLD
    )
    (loss * data["grad_output"].float()).sum().backward()
    expected_loss, expected_grad = reference(data, alpha)
    return {
        "loss_error": float((loss.detach().double() - expected_loss).abs().max()),
        "grad_error": float((shard.grad.double() - expected_grad[..., columns]).abs().max()),
        "finite": bool(torch.isfinite(loss).all()),
    }


def _judge(megatron_module: Any, forward: Any, data: dict[str, Tensor], rank: int) -> object:
    """Every smoothing with ``forward`` on the live class, put back afterwards."""
    owner = getattr(megatron_module, _CLASS)
    before = vars(owner)["forward"]
    owner.forward = forward
    try:
        return {
            str(alpha): _on_this_rank(megatron_module, data, alpha, rank, 2)
            for alpha in _SMOOTHINGS
        }
    finally:
        owner.forward = before


def main(argument: str) -> None:
    """``argument``: ``{"sys_path", "rank", "store", "sets": {label: file}}``; a set that
    fails says why, the others still run."""
    request = json.loads(argument)
    sys.path[:] = request["sys_path"]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(request["rank"])
    # A rank whose peer never comes ends instead of waiting for gloo's default 30 minutes.
    dist.init_process_group(
        "gloo",
        init_method=f"file://{request['store']}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    megatron_module = importlib.import_module(_MODULE)
    data = _inputs()
    sets: dict[str, object] = {}
    for label, file in request["sets"].items():
        try:
            sets[label] = _judge(megatron_module, _forward_from(file, megatron_module), data, rank)
        except Exception as exc:
            sets[label] = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
    dist.barrier()
    dist.destroy_process_group()
    judged = sys.modules.get("megatron")
    where = next(iter(judged.__path__)) if judged is not None else None
    print("SNIFF " + json.dumps({"rank": rank, "sets": sets, "megatron": where}))


if __name__ == "__main__":
    main(sys.argv[1])
