"""The torch side of the #7617 local changes (see ``sparse_mla`` for what each one is).

Each wrapper takes the vendored ``fused_sparse_mla_absorbed`` (upstream's behaviour) and
returns a function of the same signature. It prepares only calls the kernel can take at all
(``_kernel_bound``); anything else goes to the vendored function as the caller gave it, so
every fallback (None) decision stays upstream's.
"""

from collections.abc import Callable

import torch

from ..private_globals import LIVE_TARGET, with_globals
from . import _sparse_mla_triton as fused

Function = Callable[..., object]

KERNEL_WIDTH = 576  # 512 latent + 64 rope channels: what the TileLang kernels are built for
NOPE_WIDTH = 512  # NoPE MLA: the latent channels alone
WIDTHS = (NOPE_WIDTH, KERNEL_WIDTH)
V_CHANNELS = 512
TOPK_BLOCK = 64  # the kernel walks top-k in blocks of 64
MIN_KERNEL_HEADS = 16  # the kernel's head tile: fewer heads are padded to it


def _kernel_bound(
    query: torch.Tensor, key: torch.Tensor, topk_indices: torch.Tensor, v_channels: int
) -> bool:
    """Whether the call has the shape of one the vendored function sends to the kernel.

    A cheap guard against preparing inputs for a call that will be declined anyway; the
    vendored function still makes every decision itself, on the prepared inputs, which
    keep each property checked here.
    """
    if query.ndim != 4 or key.ndim != 4 or topk_indices.ndim != 3:
        return False
    sq, b, heads, width = query.shape
    return (
        query.dtype == key.dtype == torch.bfloat16
        and key.size(1) == b
        and key.size(2) == 1
        and tuple(topk_indices.shape[:2]) == (b, sq)
        and key.size(3) == width
        and width in WIDTHS
        and v_channels == V_CHANNELS
        and heads > 0
    )


# ---- indices -------------------------------------------------------------------------------


def padded_topk(topk: int) -> int:
    return -(-topk // TOPK_BLOCK) * TOPK_BLOCK


def _indices_ready(topk_indices: torch.Tensor) -> bool:
    """Already what the kernel takes: int32, top-k a multiple of 64, unsqueeze(2) dense."""
    return bool(
        topk_indices.dtype == torch.int32
        and topk_indices.size(-1) % TOPK_BLOCK == 0
        and topk_indices.unsqueeze(2).is_contiguous()
    )


def kernel_indices(topk_indices: torch.Tensor, num_keys: int | None) -> torch.Tensor:
    """``[b, sq, topk]`` -> int32 ``[b, sq, topk']``, a view of a dense ``[b, sq, 1, topk']``.

    topk' is the next multiple of 64 and the extra slots are -1, as the vendored function
    pads them. With ``num_keys`` every index outside ``[0, num_keys)`` becomes -1 as well
    (index hygiene); without it, values convert as ``.to(torch.int32)`` converts them. On
    CUDA one fused pass does all of it; the caller's tensor is never written.
    """
    b, sq, topk = topk_indices.shape
    out = torch.empty((b, sq, 1, padded_topk(topk)), dtype=torch.int32, device=topk_indices.device)
    if not (topk_indices.is_cuda and fused.kernel_indices(topk_indices, out, num_keys)):
        out[..., topk:].fill_(-1)
        slots = out[:, :, 0, :topk]
        slots.copy_(topk_indices)
        if num_keys is not None:
            # The range test on the caller's values, before narrowing: an int64 index
            # past 2**31 must not wrap into a valid int32 one (nor a NaN into anything).
            inside = topk_indices >= 0
            if num_keys <= _largest(topk_indices.dtype):
                # Only then: torch casts the bound to the indices' dtype, and 40000 as
                # int16 wraps negative, which would turn every valid index into -1.
                inside &= topk_indices < num_keys
            slots.masked_fill_(~inside, -1)
    return out[:, :, 0]


def _largest(dtype: torch.dtype) -> float:
    """The largest value of an index dtype (floats: infinity, a bound they can hold)."""
    if dtype.is_floating_point:
        return float("inf")
    return float(torch.iinfo(dtype).max)


# ---- q and k -------------------------------------------------------------------------------

# Word types a bf16 copy may move instead of 2-byte elements: 16 bytes, else 8.
_WORDS = (torch.complex128, torch.int64)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, moved as 16- or 8-byte words where both layouts allow it.

    A strided copy of 2-byte elements runs well below the memory bandwidth on a GPU; the
    same bytes as words (last stride 1, other strides and the offset multiples of a word)
    run close to it.
    """
    for word in _WORDS:
        try:
            dst_words, src_words = dst.view(word), src.view(word)
        except RuntimeError:
            continue
        dst_words.copy_(src_words)
        return
    dst.copy_(src)


class _ToKernelLayout(torch.autograd.Function):  # type: ignore[misc]
    """``[s, b, h, 512]`` -> ``[b, s, h, 576]``, the last 64 channels zero, written once.

    The vendored function pads the channels (a copy) and then makes the permuted tensor
    contiguous (a second copy); here each element is written once, and the backward is
    one copy of the gradient's first 512 channels back into the caller's layout.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        s, b, h, d = x.shape
        buf = x.new_empty((b, s, h, KERNEL_WIDTH))
        if x.is_cuda and fused.pad_to_kernel_layout(x, buf):
            return buf
        buf[..., d:].zero_()
        _copy(buf[..., :d], x.permute(1, 0, 2, 3))
        return buf

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> torch.Tensor | None:
        if not ctx.needs_input_grad[0]:
            return None
        b, s, h, _ = grad.shape
        grad_x = grad.new_empty((s, b, h, NOPE_WIDTH))
        _copy(grad_x.permute(1, 0, 2, 3), grad[..., :NOPE_WIDTH])
        return grad_x


def to_kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """The caller's ``[s, b, h, 512]`` as a ``[s, b, h, 576]`` view of a dense
    ``[b, s, h, 576]``: the vendored function's ``permute(1, 0, 2, 3).contiguous()`` then
    returns the kernel's input without copying it."""
    return _ToKernelLayout.apply(x).permute(1, 0, 2, 3)


# ---- the output ----------------------------------------------------------------------------


class _ToCallerLayout(torch.autograd.Function):  # type: ignore[misc]
    """The kernel's ``[b, s, h, 512]`` output as a ``[b, s, h, 512]`` view of a dense
    ``[s, b, h, 512]``, moved in words: the vendored function's ``permute(1, 0, 2, 3)
    .contiguous()`` then returns it without a second, element-wise copy.

    The backward passes the gradient on as it comes (the ``[b, s]`` view of the caller's
    gradient), exactly what upstream's permute hands the kernel: a dense copy here would
    hold a second output-sized tensor at the backward's peak.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, out: torch.Tensor) -> torch.Tensor:
        b, s, h, d = out.shape
        buf = out.new_empty((s, b, h, d))
        _copy(buf, out.permute(1, 0, 2, 3))
        return buf.permute(1, 0, 2, 3)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _KernelReturningCallerLayout:
    """``SparseMLA`` as the vendored function sees it under lean copies: the same call and
    the same values, the output already in the caller's ``[s, b]`` order (batch > 1)."""

    def __init__(self, kernel: type[torch.autograd.Function]) -> None:
        self._kernel = kernel

    def apply(self, *args: object) -> tuple[torch.Tensor, ...]:
        out, *rest = self._kernel.apply(*args)
        if out.ndim == 4 and out.size(0) > 1 and out.stride(-1) == 1:
            out = _ToCallerLayout.apply(out)
        return (out, *rest)


class _TargetSeenByVendored:
    """The live target module, read at call time, except that ``SparseMLA`` is wrapped by
    ``_KernelReturningCallerLayout``. Nothing is written to the module itself."""

    def __init__(self, live_target: Callable[[], object]) -> None:
        self._live_target = live_target

    def __getattr__(self, name: str) -> object:
        value = getattr(self._live_target(), name)
        if name == "SparseMLA" and value is not None:
            return _KernelReturningCallerLayout(value)
        return value


def _reading_kernel_output_in_caller_layout(inner: Function) -> Function:
    """A copy of the vendored function whose ``_live_target()`` is ``_TargetSeenByVendored``;
    ``inner`` itself where it does not read its target through ``_live_target()``."""
    code = getattr(inner, "__code__", None)
    live_target = getattr(inner, "__globals__", {}).get(LIVE_TARGET)
    if code is None or not callable(live_target) or LIVE_TARGET not in code.co_names:
        return inner
    seen = _TargetSeenByVendored(live_target)
    return with_globals(inner, {LIVE_TARGET: lambda: seen})


# ---- the wrappers --------------------------------------------------------------------------


def with_index_hygiene(inner: Function) -> Function:
    def fused_sparse_mla_absorbed(
        query: torch.Tensor,
        key: torch.Tensor,
        topk_indices: torch.Tensor,
        softmax_scale: float,
        v_channels: int,
    ) -> object:
        if _kernel_bound(query, key, topk_indices, v_channels):
            topk_indices = kernel_indices(topk_indices, num_keys=key.size(0))
        return inner(query, key, topk_indices, softmax_scale, v_channels)

    return fused_sparse_mla_absorbed


def with_lean_copies(inner: Function) -> Function:
    output_in_caller_layout = _reading_kernel_output_in_caller_layout(inner)

    def fused_sparse_mla_absorbed(
        query: torch.Tensor,
        key: torch.Tensor,
        topk_indices: torch.Tensor,
        softmax_scale: float,
        v_channels: int,
    ) -> object:
        call = inner
        if _kernel_bound(query, key, topk_indices, v_channels):
            # Width 576 needs no padding: the vendored function's one contiguous() copy
            # is the layout pass. Fewer than 16 heads are padded there too: padding them
            # here would cost an extra copy of the output and its gradient.
            if query.size(-1) == NOPE_WIDTH:
                query, key = to_kernel_layout(query), to_kernel_layout(key)
            if not _indices_ready(topk_indices):
                topk_indices = kernel_indices(topk_indices, num_keys=None)
            # With fewer than 16 heads the vendored function drops the padded heads
            # before its own copy: an output in the caller's layout would be copied twice.
            if query.size(2) >= MIN_KERNEL_HEADS:
                call = output_in_caller_layout
        return call(query, key, topk_indices, softmax_scale, v_channels)

    return fused_sparse_mla_absorbed
