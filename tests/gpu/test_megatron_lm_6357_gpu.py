"""megatron-lm-6357 on a GPU: real MegatronFSDP wraps (megatron-core's copy and the
megatron-fsdp wheel's, through each one's ``fully_shard_model``) on one GPU, world size 1.

What the CPU tests show on a stand-in ``self``, here on the real class: under ZeRO-1
(``optim``) without ``overlap_grad_reduce``, 0.19.2's hooks reduce the gradients in backward
on the last micro-batch (``finish_grad_sync`` reduces them again) and register the
post-forward reshard hook on every FSDP unit; a model wrapped after ``apply()`` reduces them
only in ``finish_grad_sync`` and has no reshard hook, and its gradients after
``finish_grad_sync`` are the reference's; a model wrapped before ``apply()`` keeps 0.19.2's
hooks, and ``status`` counted it. ZeRO-3 keeps its reshard hooks and trains.
Skipped without CUDA (tests/gpu/conftest.py: ``NEEDS_TILELANG = False``).
"""

import importlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from backports.megatron import Action, Verdict, apply, revert, status
from tests.reports import report_for

pytestmark = pytest.mark.gpu
NEEDS_TILELANG = False  # tests/gpu/conftest.py: CUDA alone

ID = "megatron-lm-6357"
COPIES = {
    "megatron-core": "megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard",
    "megatron-fsdp": "megatron_fsdp.fully_shard",
}
WIDTH = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """A one-rank process group (NCCL on a GPU; gloo where a rehearsal runs it on CPU)."""
    import torch
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        address = f"tcp://127.0.0.1:{_free_port()}"
        dist.init_process_group(backend, init_method=address, rank=0, world_size=1)
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    yield
    if created:
        dist.destroy_process_group()


def _unit_class() -> type:
    import torch

    class Unit(torch.nn.Linear):
        """The FSDP unit module."""

    return Unit


UNIT: Any = None


def _model() -> Any:
    import torch

    global UNIT
    UNIT = UNIT or _unit_class()
    torch.manual_seed(0)
    return torch.nn.Sequential(
        UNIT(WIDTH, WIDTH), torch.nn.ReLU(), UNIT(WIDTH, WIDTH), torch.nn.Linear(WIDTH, 1)
    )


def _wrap(copy: str, strategy: str) -> Any:
    import torch

    fully_shard = importlib.import_module(COPIES[copy])
    device = torch.device("cuda", torch.cuda.current_device())
    return fully_shard.fully_shard_model(
        _model().to(device),
        fsdp_unit_modules=[UNIT],
        zero_dp_strategy=strategy,
        overlap_grad_reduce=strategy in ("optim_grads", "optim_grads_params"),
        overlap_param_gather=strategy == "optim_grads_params",
        sync_model_each_microbatch=False,
        preproc_state_dict_for_dcp_ckpt=False,
        device=device,
    )


def _step(fsdp: Any) -> dict[str, Any]:
    """One last micro-batch: forward, backward (counting the reductions the hooks start),
    finish_grad_sync; the reshard hooks registered and the gradients after it."""
    import torch

    pipeline = fsdp.grad_reduce_pipeline
    reduce_gradients = pipeline.reduce_gradients
    in_backward: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        in_backward.append(1)
        return reduce_gradients(*args, **kwargs)

    pipeline.reduce_gradients = counted
    try:
        fsdp.is_last_microbatch = True
        x = torch.linspace(-1, 1, 4 * WIDTH, device="cuda").reshape(4, WIDTH)
        fsdp(x).square().sum().backward()
        reductions = len(in_backward)
    finally:
        del pipeline.reduce_gradients
    fsdp.finish_grad_sync()
    grads = {}
    for name, param in fsdp.module.named_parameters():
        grad = param.grad
        if grad is not None and hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        grads[name] = None if grad is None else grad.detach().float().cpu()
    reshard = [k for k in fsdp.forward_hooks if k.startswith("release module")]
    return {"reduced_in_backward": reductions, "reshard_hooks": reshard, "grads": grads}


def _reference_grads() -> dict[str, Any]:
    import torch

    model = _model().cuda()
    x = torch.linspace(-1, 1, 4 * WIDTH, device="cuda").reshape(4, WIDTH)
    model(x).square().sum().backward()
    return {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}


def _assert_grads(seen: dict[str, Any], reference: dict[str, Any]) -> None:
    import torch

    for name, grad in reference.items():
        assert seen[name] is not None, name
        torch.testing.assert_close(seen[name].reshape(grad.shape), grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("copy", list(COPIES))
def test_zero1_hooks_before_and_after_apply_on_a_real_wrap(world, copy):
    if copy == "megatron-fsdp":
        pytest.importorskip("megatron_fsdp")
    reference = _reference_grads()
    stock = _step(_wrap(copy, "optim"))
    assert stock["reduced_in_backward"] > 0  # 0.19.2: in backward, and again in finish
    assert len(stock["reshard_hooks"]) == 2  # on both units, though ZeRO-1 shards no weight
    _assert_grads(stock["grads"], reference)

    wrapped_before = _wrap(copy, "optim")
    said = report_for(status(ID), ID)
    assert said.verdict is Verdict.NEEDED
    assert "MegatronFSDP built before the install" in said.reason, said.reason
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        fixed = _step(_wrap(copy, "optim"))
        assert fixed["reduced_in_backward"] == 0  # once, in finish_grad_sync
        assert fixed["reshard_hooks"] == []
        _assert_grads(fixed["grads"], reference)
        # Wrapped before the install: its hooks are 0.19.2's.
        old = _step(wrapped_before)
        assert old["reduced_in_backward"] > 0 and len(old["reshard_hooks"]) == 2
    finally:
        revert(ID)


@pytest.mark.parametrize("copy", list(COPIES))
def test_zero3_keeps_its_reshard_hooks_and_trains_after_apply(world, copy):
    if copy == "megatron-fsdp":
        pytest.importorskip("megatron_fsdp")
    reference = _reference_grads()
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        fixed = _step(_wrap(copy, "optim_grads_params"))
        assert len(fixed["reshard_hooks"]) == 2
        assert fixed["reduced_in_backward"] > 0  # sharded gradients: reduced as they come
        _assert_grads(fixed["grads"], reference)
    finally:
        revert(ID)
