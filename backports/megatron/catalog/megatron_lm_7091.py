"""NVIDIA/Megatron-LM#7091: decline sparse-indexer top-k widths TileLang cannot lay out.

megatron-core 0.19.2's ``_can_use_fused_sparse_indexer_target`` accepts every top-k width
that is a multiple of 64; on B300 the TileLang target kernel then fails with "no available
layout found" at 320, 384, 448 and every multiple of 64 up to 1984 that is not a multiple
of 256. The pull request sends those widths to the existing PyTorch path.
"""

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
from ..private_globals import with_globals
from ._untyped import MegatronFunction

_KERNEL = "sparse_indexer_target_interface"
# Every version of the predicate accepts 256 and 512 and declines 65: one that does not is
# not the function the vendored code was written against.
_CONTROLS = {256: True, 512: True, 65: False}
# Multiples of 64 with no TileLang layout on B300: accepted before the fix, declined after.
_PROBES = (320, 448, 1984)


def _accepts(predicate: MegatronFunction, width: int) -> bool:
    """The predicate's answer for top-k ``width`` on tensors that say they are on CUDA."""
    import torch

    class _OnCuda(torch.Tensor):  # type: ignore[misc]
        # 0.19.2 tests .is_cuda first; the sniff runs on CPU tensors that answer True.
        @property
        def is_cuda(self) -> bool:
            return True

    query = torch.zeros(2, 4, 128, dtype=torch.bfloat16).as_subclass(_OnCuda)
    key = torch.zeros(8, 128, dtype=torch.bfloat16).as_subclass(_OnCuda)
    indices = torch.zeros(2, width, dtype=torch.int64).as_subclass(_OnCuda)
    return bool(predicate(query, key, indices))


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Fixed iff top-k widths 320, 448 and 1984 are declined, the controls as always."""
    (target,) = recorded_as(targets, ResolvedTarget)
    if _KERNEL not in vars(target.module):
        raise SniffFailed(f"{target.module_name} has no {_KERNEL} to stand in for")
    # A private copy sees a sentinel kernel (absent without TileLang, and 0.19.2 checks it
    # first); the live module never does.
    predicate = with_globals(target.original, {_KERNEL: object()})
    controls = {str(width): _accepts(predicate, width) for width in _CONTROLS}
    if controls != {str(width): ok for width, ok in _CONTROLS.items()}:
        raise SniffFailed(f"the controls (256, 512 accepted; 65 declined) gave {controls}")
    probes = {str(width): _accepts(predicate, width) for width in _PROBES}
    detail = {"controls": controls, "probes": probes}
    if not any(probes.values()):
        return SniffResult(True, "top-k widths 320, 448 and 1984 are declined", detail)
    if all(probes.values()):
        summary = "top-k widths 320, 448 and 1984 reach the TileLang kernel (no layout on B300)"
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"top-k widths 320, 448, 1984 are partly declined: {probes}")


SPEC = BackportSpec(
    id="megatron-lm-7091",
    title="Sparse-indexer target: decline top-k widths TileLang cannot lay out",
    targets=(
        Target(
            distribution="megatron-core",
            modules=(
                "megatron.core.ops.attention.dsa.kernels.tilelang_dsa",
                "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa",
            ),
            attribute="_can_use_fused_sparse_indexer_target",
            parameters=("query", "key", "topk_indices"),
            helpers=(_KERNEL,),
        ),
    ),
    target_since=Version("0.19"),
    fixed_in=None,
    sniff=_sniff,
)
