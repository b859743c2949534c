"""NVIDIA/Megatron-LM#7617: NoPE (q/k width 512) and unaligned top-k in TileLang sparse MLA.

Without it, ``fused_sparse_mla_absorbed`` in megatron-core 0.19 declines width-512 (NoPE)
queries and top-k widths that are not a multiple of 64, and DSA layers shaped like
GLM-5.3-Flash (width 512, top-k 2048 + 3) fall back to a dense O(L^2) softmax.
"""

from collections.abc import Sequence
from types import ModuleType
from typing import TypedDict

from packaging.version import Version

from ..local_changes.sparse_mla import INDEX_HYGIENE, LEAN_COPIES
from ..model import (
    BackportSpec,
    Resolved,
    ResolvedTarget,
    SniffFailed,
    SniffResult,
    Target,
    recorded_as,
)
from ..private_globals import with_globals
from ._untyped import MegatronFunction, Tensor

_KERNEL_WIDTH = 576
_TOPK_BLOCK = 64


class _Call(TypedDict):
    """One call: its width and top-k, the output's shape, what reached the kernel."""

    width: int
    topk: int
    returned: list[int] | None
    kernel_saw: dict[str, int] | None


def _sniff_call(module: ModuleType, function: MegatronFunction, *, width: int, topk: int) -> _Call:
    """Call ``function`` on tiny CPU bf16 inputs with a recording kernel in ``module``."""
    import torch

    seen: list[dict[str, int]] = []

    class _RecordingKernel:
        @staticmethod
        def apply(q: Tensor, kv: Tensor, indices: Tensor, scale: float) -> tuple[Tensor, Tensor]:
            seen.append(
                {"width": int(q.size(-1)), "topk": int(indices.size(-1)), "heads": int(q.size(2))}
            )
            b, s, h, _ = q.shape
            return q.new_zeros((b, s, h, 512)), q.new_zeros((b, s, h), dtype=torch.float32)

    sq, batch, heads, sk = 2, 1, 16, 4
    gen = torch.Generator().manual_seed(7617)
    query = torch.randn(sq, batch, heads, width, generator=gen).to(torch.bfloat16)
    key = torch.randn(sk, batch, 1, width, generator=gen).to(torch.bfloat16)
    indices = torch.full((batch, sq, topk), -1, dtype=torch.int64)
    indices[:, 0, 0] = 0
    indices[:, 1, :2] = torch.tensor([0, 1])

    if "SparseMLA" not in vars(module):
        raise SniffFailed(f"{module.__name__} has no SparseMLA to stand in for")
    # A private copy of the function sees the recorder; the live module never does, so a
    # thread calling the attention meanwhile gets the real kernel.
    recording = with_globals(function, {"SparseMLA": _RecordingKernel})
    out = recording(query, key, indices, 0.125, 512)
    return {
        "width": width,
        "topk": topk,
        "returned": None if out is None else list(out.shape),
        "kernel_saw": seen[0] if seen else None,
    }


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Fixed iff a NoPE / top-k 65 call reaches the kernel as 576 channels, top-k % 64 == 0.

    An aligned 576 / 64 call is the control: every version of the function sends it to the
    kernel, so one that does not is not the function this backport was written against.
    """
    (target,) = recorded_as(targets, ResolvedTarget)
    module, function = target.module, target.original
    control = _sniff_call(module, function, width=_KERNEL_WIDTH, topk=_TOPK_BLOCK)
    if control["kernel_saw"] is None:
        raise SniffFailed(f"the aligned 576/64 control call never reached the kernel: {control}")
    probe = _sniff_call(module, function, width=512, topk=65)
    saw = probe["kernel_saw"]
    fixed = (
        saw is not None
        and saw["width"] == _KERNEL_WIDTH
        and saw["topk"] % _TOPK_BLOCK == 0
        and probe["returned"] == [2, 1, 16, 512]
    )
    if fixed and saw is not None:  # fixed implies saw; said again for the checker
        summary = (
            f"a width-512 / top-k 65 call reaches the kernel as {saw['width']} / {saw['topk']}"
        )
    elif saw is None:
        summary = "a width-512 / top-k 65 call is declined (None: dense O(L^2) fallback)"
    elif saw["width"] == _KERNEL_WIDTH and saw["topk"] % _TOPK_BLOCK == 0:
        summary = (
            f"a width-512 / top-k 65 call reaches the kernel padded as {saw} but returns "
            f"{probe['returned']}, not [2, 1, 16, 512]"
        )
    else:
        summary = f"a width-512 / top-k 65 call reaches the kernel unpadded as {saw}"
    return SniffResult(fixed, summary, {"control": control, "nope_topk65": probe})


SPEC = BackportSpec(
    id="megatron-lm-7617",
    title="TileLang sparse MLA: NoPE width 512 and unaligned top-k",
    targets=(
        Target(
            distribution="megatron-core",
            modules=(
                "megatron.core.ops.attention.dsa.kernels.tilelang_dsa",
                "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa",
            ),
            attribute="fused_sparse_mla_absorbed",
            parameters=("query", "key", "topk_indices", "softmax_scale", "v_channels"),
            helpers=("SparseMLA", "_all_bfloat16", "_is_supported_sparse_mla_head_count"),
        ),
    ),
    target_since=Version("0.19"),
    fixed_in=None,
    sniff=_sniff,
    local_changes=(INDEX_HYGIENE, LEAN_COPIES),
)
