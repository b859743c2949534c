"""Stand-ins for other versions of ``fused_sparse_mla_absorbed``, for the probe's verdicts.

Each reads the kernel from the real megatron-core module at call time, as upstream does.
They are deliberately small: the probe only watches what reaches the kernel.
"""

import importlib

import torch
import torch.nn.functional as F

from tests.conftest import TILELANG_DSA


def _module():
    return importlib.import_module(TILELANG_DSA)


def _call_kernel(query, key, topk_indices, softmax_scale, heads):
    kernel = _module().SparseMLA
    q = query.permute(1, 0, 2, 3)
    if heads < 16:
        q = F.pad(q, (0, 0, 0, 16 - heads))
    indices = topk_indices.unsqueeze(2).to(torch.int32)
    pad = -indices.size(-1) % 64
    indices = F.pad(indices, (0, pad), value=-1)
    out, _ = kernel.apply(
        q.contiguous(), key.permute(1, 0, 2, 3).contiguous(), indices, softmax_scale
    )
    return out[:, :, :heads].permute(1, 0, 2, 3).contiguous()


def fixed_upstream(query, key, topk_indices, softmax_scale, v_channels):
    """Behaves like a megatron-core that merged #7617 (pads 512 -> 576 and top-k)."""
    if _module().SparseMLA is None or query.size(-1) not in (512, 576) or v_channels != 512:
        return None
    if query.size(-1) == 512:
        query, key = F.pad(query, (0, 64)), F.pad(key, (0, 64))
    return _call_kernel(query, key, topk_indices, softmax_scale, query.size(2))


def topk_padding_only(query, key, topk_indices, softmax_scale, v_channels):
    """Like upstream after #7522: unaligned top-k is padded, NoPE width 512 still declined."""
    if _module().SparseMLA is None or query.size(-1) != 576 or v_channels != 512:
        return None
    return _call_kernel(query, key, topk_indices, softmax_scale, query.size(2))


def new_signature(query, key, topk_indices, softmax_scale, v_channels, topk_length=None):
    """A later upstream that changed the contract."""
    return None


def raises(query, key, topk_indices, softmax_scale, v_channels):
    raise RuntimeError("this build is broken")
