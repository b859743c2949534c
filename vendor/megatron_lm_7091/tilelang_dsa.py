# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     7091 (open; its head SHA was not available when this was written)
# path:   megatron/core/transformer/experimental_attention_variant/ops/tilelang_dsa.py
# symbol: _can_use_fused_sparse_indexer_target
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's function; not a byte copy of upstream source. It is laid
#         out as tools/sync_upstream.py lays out a synced file, so a sync replaces it whole.
"""PR-head ``_can_use_fused_sparse_indexer_target``: top-k widths the kernel can lay out.

Upstream's behaviour and nothing else: megatron-core 0.19.2's predicate with the one
condition the pull request adds. The names in ``__reads__`` are read from the live target
module at call time, so a kernel replaced there is seen here.
"""

import sys

import torch

# The module whose globals the function reads. The applier rebinds it to the module
# that really defines the function.
__target_module__ = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"

# Module globals of the target that the function reads at call time.
__reads__ = ("sparse_indexer_target_interface",)


def _live_target():
    return sys.modules[__target_module__]


def _can_use_fused_sparse_indexer_target(
    query: torch.Tensor, key: torch.Tensor | None, topk_indices: torch.Tensor
) -> bool:
    """Whether the fused TileLang target kernel supports these tensors and this top-k width."""
    if _live_target().sparse_indexer_target_interface is None or key is None:
        return False
    if not (query.is_cuda and key.is_cuda and topk_indices.is_cuda):
        return False
    if query.ndim != 3 or key.ndim != 2:
        return False
    if query.dtype != torch.bfloat16 or key.dtype != torch.bfloat16:
        return False
    if query.size(-1) != key.size(-1) or query.size(-1) % 16 != 0:
        return False
    if topk_indices.ndim != 2:
        return False
    width = topk_indices.size(-1)
    # On B300 TileLang finds no layout for the multiples of 64 above 256 that are not
    # multiples of 256 (320, 384, 448, 576, ..., 1984): those take the PyTorch path.
    return width % 64 == 0 and (width <= 256 or width % 256 == 0)
