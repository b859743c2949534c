# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     7617 (head 3d07347, merged as f77f360)
# path:   megatron/core/transformer/experimental_attention_variant/ops/tilelang_dsa.py
# symbol: fused_sparse_mla_absorbed
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's function; not a byte copy of upstream source.
"""PR-head ``fused_sparse_mla_absorbed``: NoPE width 512 and any top-k width.

The function keeps megatron-core 0.19.2's name, signature and contract. Module-global
names of the target module (``SparseMLA`` and the two helpers) are read from the live
target module at call time, so a kernel or helper replaced there is seen here.
"""

import sys

import torch

# The module whose globals this function reads. The applier rebinds it when megatron-core
# defines the function elsewhere (upstream's planned move under megatron/core/ops/).
__target_module__ = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"

# The TileLang kernels are compiled for 512 latent + 64 rope channels, top-k in blocks of
# 64, and at least 16 query heads per key group.
_KERNEL_WIDTH = 576
_NOPE_WIDTH = 512
_TOPK_BLOCK = 64
_MIN_KERNEL_HEADS = 16


def _live_target():
    return sys.modules[__target_module__]


class _ToKernelLayout(torch.autograd.Function):
    """``[s, b, h, d]`` -> zero-padded ``[b, s, heads, width]`` in a single copy.

    ``F.pad`` followed by ``permute().contiguous()`` writes the tensor twice, and autograd's
    slice-assignment backward clones the whole padded gradient; here the forward writes
    each element once and the backward is one slice-and-permute view of the gradient.
    """

    @staticmethod
    def forward(ctx, x, heads, width):
        s, b, h, d = x.shape
        ctx.real_shape = (h, d)
        buf = x.new_empty((b, s, heads, width))
        if heads > h:
            buf[:, :, h:].zero_()
        if width > d:
            buf[:, :, :h, d:].zero_()
        buf[:, :, :h, :d].copy_(x.permute(1, 0, 2, 3))
        return buf

    @staticmethod
    def backward(ctx, grad):
        h, d = ctx.real_shape
        return grad[:, :, :h, :d].permute(1, 0, 2, 3), None, None


def _to_kernel_layout(x, heads, width):
    if x.size(2) == heads and x.size(3) == width:
        # Already the kernel's shape: one transpose copy, as megatron-core does.
        return x.permute(1, 0, 2, 3).contiguous()
    return _ToKernelLayout.apply(x, heads, width)


def _kernel_indices(topk_indices, num_keys):
    """``[b, sq, topk]`` -> int32 ``[b, sq, 1, topk']``, topk' the next multiple of 64.

    The kernel treats only exactly -1 as an empty slot and checks no upper bound, so every
    index outside ``[0, num_keys)`` becomes -1 here, in the int32 copy the kernel needs
    anyway: no host sync, and the caller's tensor is never written.
    """
    b, sq, topk = topk_indices.shape
    padded = -(-topk // _TOPK_BLOCK) * _TOPK_BLOCK
    indices = torch.empty((b, sq, 1, padded), dtype=torch.int32, device=topk_indices.device)
    if padded > topk:
        indices[..., topk:].fill_(-1)
    slots = indices[:, :, 0, :topk]
    # Clamp in the caller's dtype before narrowing, so a huge int64 index cannot wrap
    # into a valid int32 one; every negative index is then -1 and every index past the
    # end is num_keys, which the last step clears.
    slots.copy_(topk_indices.clamp(min=-1, max=num_keys))
    slots.masked_fill_(slots == num_keys, -1)
    return indices


def fused_sparse_mla_absorbed(
    query: torch.Tensor,
    key: torch.Tensor,
    topk_indices: torch.Tensor,
    softmax_scale: float,
    v_channels: int,
) -> torch.Tensor | None:
    """Run fused SparseMLA kernel for absorbed-MLA path (NoPE and unaligned top-k too)."""
    target = _live_target()
    sparse_mla = target.SparseMLA
    if sparse_mla is None:
        return None

    if query.ndim != 4 or key.ndim != 4 or topk_indices.ndim != 3:
        return None
    if not target._all_bfloat16(query, key):
        return None
    if key.size(2) != 1:
        return None
    if query.size(1) != key.size(1) or topk_indices.size(0) != query.size(1):
        return None
    if topk_indices.size(1) != query.size(0):
        return None
    if query.size(-1) != key.size(-1):
        return None
    if query.size(-1) not in (_NOPE_WIDTH, _KERNEL_WIDTH) or v_channels != _NOPE_WIDTH:
        return None
    if topk_indices.dtype not in (torch.int16, torch.int32, torch.int64):
        return None
    if query.numel() == 0 or key.numel() == 0 or topk_indices.size(-1) == 0:
        return None
    query_heads = query.size(2)
    if query_heads <= 0:
        return None
    kernel_heads = max(query_heads, _MIN_KERNEL_HEADS)
    if not target._is_supported_sparse_mla_head_count(kernel_heads, kv_group=key.size(2)):
        return None

    # NoPE: zero channels 512..575 add nothing to q.k, so the caller's softmax_scale is
    # passed on unchanged; the value is still key's first 512 channels.
    query_bshd = _to_kernel_layout(query, kernel_heads, _KERNEL_WIDTH)
    key_bshd = _to_kernel_layout(key, key.size(2), _KERNEL_WIDTH)
    indices_bsgk = _kernel_indices(topk_indices, key.size(0))
    out, _ = sparse_mla.apply(query_bshd, key_bshd, indices_bsgk, softmax_scale)
    if out.ndim != 4 or out.size(2) != kernel_heads or out.size(-1) != v_channels:
        return None
    out = out[:, :, :query_heads]
    return out.permute(1, 0, 2, 3).contiguous()
