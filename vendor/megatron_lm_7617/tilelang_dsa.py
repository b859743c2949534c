# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     7617 (head 3d07347181ae6d34ab7d381b586a81b39a2e6c23; merge SHA unverified)
# path:   megatron/core/transformer/experimental_attention_variant/ops/tilelang_dsa.py
# symbol: fused_sparse_mla_absorbed
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's function; not a byte copy of upstream source. It is laid
#         out as tools/sync_upstream.py lays out a synced file, so a sync replaces it whole.
"""PR-head ``fused_sparse_mla_absorbed``: NoPE width 512 and any top-k width.

Upstream's behaviour and nothing else: megatron-core 0.19.2's function with the two limits
the pull request lifts. What megatron-backports adds around it (index hygiene, leaner
copies) lives in ``backports.megatron.local_changes``, never here. The names in
``__reads__`` are read from the live target module at call time, so a kernel or helper
replaced there is seen here.
"""

import sys

import torch

# The module whose globals the function reads. The applier rebinds it to the module
# that really defines the function.
__target_module__ = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"

# Module globals of the target that the function reads at call time.
__reads__ = (
    "SparseMLA",
    "_all_bfloat16",
    "_is_supported_sparse_mla_head_count",
)


def _live_target():
    return sys.modules[__target_module__]


def fused_sparse_mla_absorbed(
    query: torch.Tensor,
    key: torch.Tensor,
    topk_indices: torch.Tensor,
    softmax_scale: float,
    v_channels: int,
) -> torch.Tensor | None:
    """Run fused SparseMLA kernel for absorbed-MLA path (NoPE and unaligned top-k too)."""
    if _live_target().SparseMLA is None:
        return None

    if query.ndim != 4 or key.ndim != 4 or topk_indices.ndim != 3:
        return None
    if not _live_target()._all_bfloat16(query, key):
        return None
    if key.size(2) != 1:
        return None
    if query.size(1) != key.size(1) or topk_indices.size(0) != query.size(1):
        return None
    if topk_indices.size(1) != query.size(0):
        return None
    if query.size(-1) != key.size(-1):
        return None
    if query.size(-1) not in (512, 576) or v_channels != 512:
        # The TileLang kernels are compiled for 512 latent + 64 rope channels.
        return None
    query_heads = query.size(2)
    if query_heads <= 0:
        return None
    kernel_heads = max(query_heads, 16)
    supported = _live_target()._is_supported_sparse_mla_head_count
    if not supported(kernel_heads, kv_group=key.size(2)):
        return None

    if query.size(-1) == 512:
        # NoPE: zero channels 512..575 add nothing to q.k, so softmax_scale is passed on
        # unchanged; the value is still the first 512 channels of key.
        query = torch.nn.functional.pad(query, (0, 64))
        key = torch.nn.functional.pad(key, (0, 64))

    query_bshd = query.permute(1, 0, 2, 3).contiguous()
    if kernel_heads != query_heads:
        # SparseMLA uses a minimum 16-head tile without head bounds. Pad the caller
        # tensor so small TP shards stay in bounds, then discard those heads below.
        query_bshd = torch.nn.functional.pad(query_bshd, (0, 0, 0, kernel_heads - query_heads))
    key_bshd = key.permute(1, 0, 2, 3).contiguous()
    indices_bsgk = topk_indices.unsqueeze(2).to(torch.int32)
    topk_pad = -indices_bsgk.size(-1) % 64
    if topk_pad:
        # The kernel walks top-k in blocks of 64; -1 is its empty slot.
        indices_bsgk = torch.nn.functional.pad(indices_bsgk, (0, topk_pad), value=-1)
    indices_bsgk = indices_bsgk.contiguous()
    out, _ = _live_target().SparseMLA.apply(query_bshd, key_bshd, indices_bsgk, softmax_scale)
    if out.ndim != 4 or out.size(2) != kernel_heads or out.size(-1) != v_channels:
        return None
    out = out[:, :, :query_heads]
    return out.permute(1, 0, 2, 3).contiguous()
