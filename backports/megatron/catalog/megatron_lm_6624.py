"""NVIDIA/Megatron-LM#6624: under GTP the weight gradient is reduce-scattered in FP32.

With generalized tensor parallelism (``gtp_remat_size > 1``), megatron-core 0.19.2's
``LinearWithGradAccumulationAndAsyncCommunication.backward`` computes the weight gradient in
the compute dtype (bf16) and reduce-scatters it in bf16 even when ``main_grad`` is FP32
(``--accumulate-allreduce-grads-in-fp32``): the cross-rank sum is rounded to bf16 before the
FP32 accumulation sees it. Nothing raises.

The target is a ``@staticmethod`` of a ``torch.autograd.Function``, decorated with
``custom_bwd``. Only #6624's change is carried (its merged ``backward`` also reads
``ctx.input_dtype``, which #6252 added and 0.19.2's ``forward`` never sets); its
``validate_args`` hunk in ``megatron/training/arguments.py`` is out of scope.

The sniff judges ``backward`` on the ``ctx`` the installed class's own ``forward`` leaves
(run on the same stand-in weight), so that it follows upstream's later drift: since #6252
``forward`` records ``ctx.input_dtype`` and ``backward`` reads it, and a release carrying both
reads ``upstream``, while a candidate ``backward`` that reads what the installed ``forward``
never sets (#6624's merged text on 0.19.2) fails with a reason naming the attribute. The
sharded weight also answers ``use_zero_copy_wgrad`` (main's tip asks it whether to write the
wgrad into the reduce-scatter buffer; no, here: a plain product).
"""

import inspect
from collections.abc import Sequence

from packaging.version import Version

from ..model import (
    BackportSpec,
    Resolved,
    ResolvedTarget,
    SniffFailed,
    SniffResult,
    Target,
    recorded_as,
)
from ._untyped import DType, MegatronFunction, Tensor

_TOKENS, _IN, _OUT = 3, 4, 4  # a [3, 4] input through a [4, 4] weight, sharded on 2 ranks


class _ShardedWeight:
    """Stands for a GTP-sharded weight as backward reads it: the full weight gathered for
    dgrad, a ``main_grad`` shard, the wgrad buffer in ``main_grad``'s dtype, and a
    reduce-scatter that keeps the dtype and value it receives (a one-rank reduce-scatter
    returns its rows of the sum, in the dtype it was given)."""

    def __init__(self, full: Tensor, main_grad_dtype: DType) -> None:
        import torch

        self.full = full
        self.main_grad = torch.zeros(_OUT // 2, _IN, dtype=main_grad_dtype)
        self.reduce_scattered: list[Tensor] = []

    def all_gather_and_prefetch(self, fwd: bool = True) -> Tensor:
        return self.full

    def all_gather_and_prefetch_bwd(self) -> Tensor:
        return self.full

    def get_wgrad_tensor(self) -> Tensor:
        import torch

        return torch.zeros(_OUT, _IN, dtype=self.main_grad.dtype)

    def use_zero_copy_wgrad(self, dtype: DType) -> bool:
        """Later upstream code asks whether to write the wgrad into the send buffer: no."""
        return False

    def wgrad_reduce_scatter(self, grad_weight: Tensor) -> Tensor:
        self.reduce_scattered.append(grad_weight.detach().clone())
        return grad_weight[: _OUT // 2]


# What ``backward`` may read that only a later upstream ``forward`` sets: the change that
# added it, for the reason a candidate gets on an older ``forward``.
_SET_BY_LATER_FORWARDS = {"input_dtype": "#6252 (897649d0bae3), merged before #6624"}


class _Ctx:
    """The ``ctx`` a ``forward`` fills: what it saves and the attributes it sets. An
    attribute it never set, read by ``backward``, is named with the change that adds it."""

    saved_tensors: tuple[object, ...] = ()

    def save_for_backward(self, *tensors: object) -> None:
        self.saved_tensors = tensors

    def __getattr__(self, name: str) -> object:
        later = _SET_BY_LATER_FORWARDS.get(name)
        since = f" (a later upstream forward sets it: {later})" if later else ""
        raise AttributeError(
            f"backward reads ctx.{name}, which the installed forward never sets{since}"
        )


# The installed forward's arguments by name: a GTP weight (remat size 2), no bias, fusion,
# dgrad all-reduce, sequence parallelism or deferral. A parameter of a later forward not
# named here gets its default, else None (#6252's ``output_dtype``: the input's own).
_FORWARD_ARGUMENTS = {
    "bias": None,
    "gradient_accumulation_fusion": False,
    "allreduce_dgrad": False,
    "sequence_parallel": False,
    "grad_output_buffer": None,
    "wgrad_deferral_limit": 0,
    "tp_group": None,
    "gtp_remat_size": 2,
}


def _forward_ctx(forward: MegatronFunction, data: Tensor, weight: _ShardedWeight) -> _Ctx:
    """The ``ctx`` the (undecorated) ``forward`` leaves for ``data`` through ``weight``."""
    ctx = _Ctx()
    parameters = list(inspect.signature(forward).parameters.values())[1:]  # after ctx
    known = {"input": data, "weight": weight, **_FORWARD_ARGUMENTS}
    arguments = {
        p.name: known.get(p.name, None if p.default is p.empty else p.default) for p in parameters
    }
    forward(ctx, **arguments)
    saved = ctx.saved_tensors
    if len(saved) != 2 or saved[0] is not data or saved[1] is not weight:
        raise SniffFailed(f"forward saved {len(saved)} objects, not its input and weight")
    return ctx


def _backward_once(
    forward: MegatronFunction, backward: MegatronFunction, main_grad_dtype: DType
) -> dict[str, object]:
    """``backward`` (undecorated) with the ``ctx`` the installed ``forward`` leaves for a
    GTP weight (no fusion, no sequence parallelism), bf16 compute; what reached the
    reduce-scatter, checked against an FP32 reference of both gradients."""
    import torch

    generator = torch.Generator().manual_seed(6624)
    data = torch.randn(_TOKENS, _IN, generator=generator).to(torch.bfloat16)
    full = torch.randn(_OUT, _IN, generator=generator).to(torch.bfloat16)
    grad_output = torch.randn(_TOKENS, _OUT, generator=generator).to(torch.bfloat16)
    weight = _ShardedWeight(full, main_grad_dtype)
    ctx = _forward_ctx(forward, data, weight)
    grads = backward(ctx, grad_output)
    if len(weight.reduce_scattered) != 1:
        raise SniffFailed(f"backward reduce-scattered {len(weight.reduce_scattered)} times")
    (wgrad,) = weight.reduce_scattered
    # bf16 inputs, products summed in FP32 either way: a bf16 result is off by its rounding.
    tolerance = {"rtol": 1e-2, "atol": 1e-2}
    expected_wgrad = grad_output.float().t() @ data.float()
    expected_dgrad = grad_output.float() @ full.float()
    if not torch.allclose(wgrad.float(), expected_wgrad, **tolerance):
        raise SniffFailed(f"the weight gradient is {wgrad.tolist()}, not grad_output^T @ input")
    if not torch.allclose(grads[0].float(), expected_dgrad, **tolerance):
        raise SniffFailed("the input gradient is not grad_output @ weight")
    return {"reduce_scattered": str(wgrad.dtype).removeprefix("torch.")}


def _sniff_body(forward: MegatronFunction, backward: MegatronFunction) -> SniffResult:
    """Fixed iff an FP32 ``main_grad`` gets an FP32 reduce-scatter; a bf16 ``main_grad``
    (the control) gets a bf16 one from every version."""
    import torch

    control = _backward_once(forward, backward, torch.bfloat16)
    if control != {"reduce_scattered": "bfloat16"}:
        raise SniffFailed(f"with a bf16 main_grad the wgrad was reduce-scattered as {control}")
    seen = _backward_once(forward, backward, torch.float32)
    detail = {"main_grad_bf16": control, "main_grad_fp32": seen}
    if seen == {"reduce_scattered": "float32"}:
        summary = "with an FP32 main_grad the GTP weight gradient is reduce-scattered in FP32"
        return SniffResult(True, summary, detail)
    if seen == {"reduce_scattered": "bfloat16"}:
        summary = (
            "with an FP32 main_grad the GTP weight gradient is reduce-scattered in bf16 "
            "(rounded across ranks before the FP32 accumulation)"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"with an FP32 main_grad the wgrad was reduce-scattered as {seen}")


def _installed_forward(owner: object) -> MegatronFunction:
    """The undecorated ``forward`` of the class holding the target (``custom_fwd``'s
    wrapper is never called: it records autocast state this sniff does not need)."""
    held = vars(owner).get("forward") if isinstance(owner, type) else None
    if not isinstance(held, staticmethod):
        raise SniffFailed(f"{owner!r} has no static forward to build backward's ctx")
    return inspect.unwrap(held.__func__)  # type: ignore[no-any-return]


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Sniff the undecorated backward (``custom_bwd``'s wrapper is never called: it needs the
    autocast state a real ``forward`` leaves on ``ctx``) on the ctx the installed forward
    builds."""
    (target,) = recorded_as(targets, ResolvedTarget)
    return _sniff_body(_installed_forward(target.owner), inspect.unwrap(target.original))


SPEC = BackportSpec(
    id="megatron-lm-6624",
    title="GTP linear backward: the weight gradient reduce-scattered in main_grad's dtype",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.core.tensor_parallel.layers",),
            # A @staticmethod of a torch.autograd.Function: the class holds a staticmethod
            # around custom_bwd's wrapper around the body.
            attribute="LinearWithGradAccumulationAndAsyncCommunication.backward",
            parameters=("ctx", "grad_output"),
            helpers=("prepare_input_tensors_for_wgrad_compute",),
            decorator="megatron.core.tensor_parallel.layers:custom_bwd",
        ),
    ),
    # Generalized tensor parallelism (gtp_remat_size, wgrad_reduce_scatter) arrives in 0.19.
    target_since=Version("0.19"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
)
