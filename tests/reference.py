"""An independent FP32 sparse-attention reference, written from the math, on unpadded inputs.

It knows nothing of kernel layouts, padding or sentinels: a slot is valid iff its index
lies in [0, sk); a row with no valid slot attends to nothing and yields zeros.
"""

import torch


def sparse_mla_reference(
    query: torch.Tensor,  # [sq, b, h, d]
    key: torch.Tensor,  # [sk, b, 1, d]
    topk_indices: torch.Tensor,  # [b, sq, topk]
    softmax_scale: float,
    v_channels: int,
) -> torch.Tensor:  # [sq, b, h, v_channels], float32
    b = query.size(1)
    sk = key.size(0)
    q = query.float().permute(1, 0, 2, 3)  # [b, sq, h, d]
    k = key.float()[:, :, 0].permute(1, 0, 2)  # [b, sk, d]
    v = k[..., :v_channels]
    idx = topk_indices.long()
    valid = (idx >= 0) & (idx < sk)
    safe = idx.clamp(0, max(sk - 1, 0))
    batch = torch.arange(b).view(b, 1, 1)
    k_sel = k[batch, safe]  # [b, sq, topk, d]
    v_sel = v[batch, safe]  # [b, sq, topk, v]
    logits = torch.einsum("bshd,bstd->bsht", q, k_sel) * softmax_scale
    logits = logits.masked_fill(~valid.unsqueeze(2), float("-inf"))
    any_valid = valid.any(-1, keepdim=True).unsqueeze(2)  # [b, sq, 1, 1]
    probs = torch.softmax(logits.masked_fill(~any_valid, 0.0), dim=-1)
    probs = probs.masked_fill(~valid.unsqueeze(2), 0.0) * any_valid
    out = torch.einsum("bsht,bstv->bshv", probs, v_sel)
    return out.permute(1, 0, 2, 3).contiguous()
