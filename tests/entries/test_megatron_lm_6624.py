"""megatron-lm-6624: under GTP the weight gradient is reduce-scattered in main_grad's dtype.

The target is a ``@staticmethod`` (behind ``custom_bwd``, its declared decorator) of a
``torch.autograd.Function``: megatron's real ``autograd.Function`` runs its real ``forward``
with the rebuilt ``backward``, through a subclass and installed on the class itself, on CPU
with a stand-in GTP-sharded weight (Transformer Engine cannot be installed here) whose
``wgrad_reduce_scatter`` records the dtype it receives. Expected gradients are computed here
in FP32 from the inputs.
"""

import dataclasses
import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from backports.megatron import Action, apply, revert
from backports.megatron.catalog import by_id
from backports.megatron.model import ResolvedTarget, SniffFailed
from backports.megatron.vendored import vendored_module
from tests.deciding import sniff_replacement
from tests.reports import report_for

ID = "megatron-lm-6624"
ENTRY = by_id(ID)
TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}  # bf16 inputs: the product rounded to bf16


@pytest.fixture(scope="module")
def layers() -> Any:
    import megatron.core.tensor_parallel.layers as layers

    return layers


@pytest.fixture(scope="module")
def function_class(layers: Any) -> type:
    return layers.LinearWithGradAccumulationAndAsyncCommunication  # type: ignore[no-any-return]


@pytest.fixture
def targets(layers: Any, function_class: type) -> list[ResolvedTarget]:
    """What the function kind will resolve: the class's staticmethod, its function
    (``custom_bwd``'s wrapper) as ``original``, declared-decorated."""
    original = vars(function_class)["backward"].__func__
    attribute = ENTRY.target.attribute
    return [
        ResolvedTarget(
            layers.__name__, layers, attribute, original, None, owner=function_class, decorated=True
        )
    ]


@pytest.fixture(scope="module")
def rebuilt() -> Any:
    return vendored_module(ENTRY.vendored).backward


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(targets):
    result = ENTRY.sniff(targets)
    assert result.fixed is False
    assert result.detail == {
        "main_grad_bf16": {"reduce_scattered": "bfloat16"},
        "main_grad_fp32": {"reduce_scattered": "bfloat16"},
    }


@pytest.mark.parametrize("upstream_only", [True, False])
def test_sniff_says_fixed_on_the_rebuilt_backward(targets, upstream_only):
    module = vendored_module(ENTRY.vendored)
    result = sniff_replacement(ENTRY, module, upstream_only=upstream_only, targets=targets)
    assert result.fixed is True, result.summary
    assert result.detail["main_grad_fp32"] == {"reduce_scattered": "float32"}


def test_a_backward_that_widens_every_wgrad_fails_the_control(targets):
    """A bf16 main_grad gets a bf16 reduce-scatter from every version: one that widens it
    anyway is no version of this backward (incompatible)."""
    stock = inspect.unwrap(targets[0].original)

    def widens_every_wgrad(ctx: Any, grad_output: Any) -> Any:
        weight = ctx.saved_tensors[1]
        scatter = weight.wgrad_reduce_scatter
        weight.wgrad_reduce_scatter = lambda grad: scatter(grad.float())
        return stock(ctx, grad_output)

    widened = [dataclasses.replace(targets[0], original=widens_every_wgrad)]
    with pytest.raises(SniffFailed, match="with a bf16 main_grad"):
        ENTRY.sniff(widened)


def _drifted_class(function_class: type, backward: Any) -> type:
    """``function_class`` drifted as upstream's did after 0.19.2 (a made-up variant, not
    upstream's text): its ``forward`` takes one more parameter (``output_dtype``) and records
    ``ctx.input_dtype``; ``backward`` casts the incoming gradient to it and asks the
    sharded weight ``use_zero_copy_wgrad`` (main's tip), then does what ``backward``
    does."""
    stock_forward = inspect.unwrap(vars(function_class)["forward"].__func__)

    def forward(
        ctx, input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad,
        sequence_parallel, grad_output_buffer, wgrad_deferral_limit, tp_group,
        gtp_remat_size, output_dtype,
    ):  # fmt: skip
        assert output_dtype is None  # the sniff's default: the input's own dtype
        ctx.input_dtype = input.dtype
        return stock_forward(
            ctx, input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad,
            sequence_parallel, grad_output_buffer, wgrad_deferral_limit, tp_group,
            gtp_remat_size,
        )  # fmt: skip

    def drifted_backward(ctx: Any, grad_output: Any) -> Any:
        grad_output = grad_output.to(ctx.input_dtype)
        weight = ctx.saved_tensors[1]
        if weight.use_zero_copy_wgrad(grad_output.dtype):
            raise AssertionError("the sniff's weight has no zero-copy buffer to offer")
        return backward(ctx, grad_output)

    members = {"forward": staticmethod(forward), "backward": staticmethod(drifted_backward)}
    return type("Drifted", (function_class,), members)


def _as_target(target: ResolvedTarget, owner: type) -> list[ResolvedTarget]:
    backward = vars(owner)["backward"].__func__
    return [dataclasses.replace(target, original=backward, owner=owner, held=backward)]


def test_the_sniff_judges_a_function_that_drifted_as_later_upstream_code_did(
    targets, function_class, rebuilt
):
    """A ``forward`` / ``backward`` pair that drifted as upstream's did after 0.19.2 still
    reads ``needed`` without the fix and fixed with it: backward runs on the ctx the
    class's own forward builds, and the weight answers ``use_zero_copy_wgrad`` (before, the
    stand-in ctx lacked ``input_dtype`` and the merged fix read ``incompatible``)."""
    stock = inspect.unwrap(targets[0].original)
    for backward, fixed in ((stock, False), (rebuilt, True)):
        drifted = _as_target(targets[0], _drifted_class(function_class, backward))
        result = ENTRY.sniff(drifted)
        assert result.fixed is fixed, result.summary
        assert result.detail["main_grad_bf16"] == {"reduce_scattered": "bfloat16"}


def test_a_backward_that_needs_a_later_forward_is_named_on_0_19_2s_forward(targets, rebuilt):
    """#6624's merged ``backward`` reads ``ctx.input_dtype``, which 0.19.2's ``forward``
    never sets: the sniff fails naming it and the change that adds it (what a sync of the
    merge commit then says), never "lacks the fix"."""

    def reads_input_dtype(ctx: Any, grad_output: Any) -> Any:
        return rebuilt(ctx, grad_output.to(ctx.input_dtype))

    needs_more = [dataclasses.replace(targets[0], original=reads_input_dtype)]
    with pytest.raises(
        AttributeError, match=r"ctx\.input_dtype, which the installed forward never sets .*#6252"
    ):
        ENTRY.sniff(needs_more)


# --- megatron's real autograd.Function on CPU ---------------------------------------------


def _sharded_weight(full: Any, main_grad_dtype: Any, received: list[Any]) -> Any:
    """A GTP weight shard (rows 0-1 of ``full``) as a real Parameter: gathered for forward
    and dgrad, a ``main_grad`` shard, the wgrad buffer in its dtype, and a reduce-scatter
    that records what it receives and returns this rank's rows in that dtype."""
    import torch

    weight = torch.nn.Parameter(full[:2].clone())
    weight.all_gather_and_prefetch = lambda fwd: full
    weight.all_gather_and_prefetch_bwd = lambda: full
    weight.main_grad = torch.zeros(2, full.shape[1], dtype=main_grad_dtype)
    weight.get_wgrad_tensor = lambda: torch.zeros(full.shape, dtype=main_grad_dtype)
    weight.wgrad_reduce_scatter = lambda grad: received.append(grad.detach().clone()) or grad[:2]
    return weight


def _run(function_class: type, main_grad_dtype: Any) -> dict[str, Any]:
    """forward + backward of ``function_class`` on a GTP weight (remat size 2), bf16
    compute; what reached the reduce-scatter, and the input's gradient."""
    import torch

    generator = torch.Generator().manual_seed(6624)
    full = torch.randn(4, 4, generator=generator).to(torch.bfloat16)
    data = torch.randn(3, 4, generator=generator).to(torch.bfloat16).requires_grad_()
    grad_output = torch.randn(3, 4, generator=generator).to(torch.bfloat16)
    received: list[Any] = []
    weight = _sharded_weight(full, main_grad_dtype, received)
    tp_group = object()  # unused without sequence parallelism or dgrad all-reduce
    out = function_class.apply(data, weight, None, False, False, False, None, 0, tp_group, 2)
    torch.testing.assert_close(out.float(), data.float() @ full.float().t(), **TOLERANCE)
    out.backward(grad_output)
    (wgrad,) = received
    torch.testing.assert_close(wgrad.float(), grad_output.float().t() @ data.float(), **TOLERANCE)
    torch.testing.assert_close(data.grad.float(), grad_output.float() @ full.float(), **TOLERANCE)
    return {"reduce_scattered": wgrad.dtype}


def _with_backward(function_class: type, backward: Any, layers: Any) -> type:
    """``function_class`` with ``backward`` decorated as megatron decorates its own."""
    return type("Fixed", (function_class,), {"backward": staticmethod(layers.custom_bwd(backward))})


def test_the_real_function_reduce_scatters_fp32_with_the_rebuilt_backward_only(
    layers, function_class, rebuilt
):
    import torch

    fixed = _with_backward(function_class, rebuilt, layers)
    assert _run(function_class, torch.float32) == {"reduce_scattered": torch.bfloat16}
    assert _run(fixed, torch.float32) == {"reduce_scattered": torch.float32}
    # A bf16 main_grad: nothing to widen, either way.
    assert _run(fixed, torch.bfloat16) == {"reduce_scattered": torch.bfloat16}


def test_the_rebuilt_backward_runs_with_the_ctx_0_19_2s_forward_builds(
    layers, function_class, rebuilt
):
    """0.19.2's forward sets no ``ctx.input_dtype``; a backward that reads it, as the merged
    upstream backward does (#6252's cast of the incoming gradient), fails on that ctx."""
    import torch

    seen: list[Any] = []

    def watching(ctx: Any, grad_output: Any) -> Any:
        seen.append(hasattr(ctx, "input_dtype"))
        return rebuilt(ctx, grad_output)

    assert _run(_with_backward(function_class, watching, layers), torch.float32)
    assert seen == [False]

    def reads_input_dtype(ctx: Any, grad_output: Any) -> Any:
        return rebuilt(ctx, grad_output.to(ctx.input_dtype))

    with pytest.raises(AttributeError, match="input_dtype"):
        _run(_with_backward(function_class, reads_input_dtype, layers), torch.float32)


def _fsdp_backward(backward: Any) -> Any:
    """The Megatron-FSDP branch (gradient-accumulation fusion, a ``__fsdp_param__``
    weight whose ``get_main_grad()`` is FP32), no GTP; returns the weight."""
    import torch

    generator = torch.Generator().manual_seed(6)
    data = torch.randn(3, 4, generator=generator).to(torch.bfloat16)
    weight = torch.randn(4, 4, generator=generator).to(torch.bfloat16)
    weight.__fsdp_param__ = True
    weight.get_main_grad = lambda: torch.zeros(4, 4)
    ctx = SimpleNamespace(
        saved_tensors=(data, weight),
        main_grad=None,
        use_bias=False,
        gradient_accumulation_fusion=True,
        allreduce_dgrad=False,
        sequence_parallel=False,
        wgrad_deferral_limit=0,
        grad_output_buffer=None,
        tp_group=None,
        gtp_remat_size=1,
    )
    grad_output = torch.randn(3, 4, generator=generator).to(torch.bfloat16)
    backward(ctx, grad_output)
    expected = grad_output.float().t() @ data.float()
    torch.testing.assert_close(weight.main_grad, expected, **TOLERANCE)
    return weight


def test_the_fsdp_branch_fills_an_fp32_main_grad_without_te(function_class, rebuilt):
    """Without TE 0.19.2 asks ``torch.matmul`` for an FP32 ``out=`` of bf16 inputs, which
    raises; the pull request's helper casts the product into it."""
    stock = inspect.unwrap(vars(function_class)["backward"].__func__)
    with pytest.raises(RuntimeError, match="dtype"):
        _fsdp_backward(stock)
    import torch

    assert _fsdp_backward(rebuilt).main_grad.dtype == torch.float32


# --- the install (the contract kit: tests/catalog/test_contract.py, for every entry) -------


def test_apply_widens_the_wgrad_of_megatrons_own_function_and_revert_restores_it(
    layers, function_class
):
    import torch

    before = vars(function_class)["backward"]
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        installed = vars(function_class)["backward"]
        assert isinstance(installed, staticmethod)
        assert getattr(installed.__func__, "__backport__", None) == ID
        assert _run(function_class, torch.float32) == {"reduce_scattered": torch.float32}
    finally:
        revert(ID)
    assert vars(function_class)["backward"] is before
    assert _run(function_class, torch.float32) == {"reduce_scattered": torch.bfloat16}
