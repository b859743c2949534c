"""A CPU stand-in for TileLang's ``SparseMLA``: the kernel's contract, honest FP32 math.

It takes what the real kernel takes (``[b, s, heads, 576]`` bf16 q, ``[b, sk, 1, 576]`` kv,
``[b, s, 1, topk]`` int32 indices with top-k a multiple of 64, at least 16 heads), treats
exactly -1 as an empty slot, and refuses anything the real kernel would mis-read (any
other negative index reads key 0 there, one >= sk reads out of bounds). Every call is
recorded, with copies of its inputs, so tests can see what the kernel received.
"""

from dataclasses import dataclass

import torch

KERNEL_WIDTH = 576
V_CHANNELS = 512


@dataclass
class KernelCall:
    q: torch.Tensor
    kv: torch.Tensor
    indices: torch.Tensor
    scale: float


class FakeSparseMLA:
    def __init__(self) -> None:
        self.calls: list[KernelCall] = []

    def apply(self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float):
        assert q.dtype == kv.dtype == torch.bfloat16, (q.dtype, kv.dtype)
        assert indices.dtype == torch.int32, indices.dtype
        assert q.is_contiguous() and kv.is_contiguous() and indices.is_contiguous()
        b, s, heads, width = q.shape
        assert width == KERNEL_WIDTH and kv.size(-1) == KERNEL_WIDTH, (q.shape, kv.shape)
        assert kv.shape[0] == b and kv.size(2) == 1, kv.shape
        assert indices.shape[:3] == (b, s, 1), indices.shape
        assert indices.size(-1) % 64 == 0, indices.shape
        assert heads >= 16 and heads & (heads - 1) == 0, heads
        sk = kv.size(1)
        bad = (indices < -1) | (indices >= sk)
        assert not bool(bad.any()), "kernel would read a wrong or out-of-bounds key"
        self.calls.append(
            KernelCall(q.detach().clone(), kv.detach().clone(), indices.clone(), scale)
        )

        idx = indices[:, :, 0].long()  # [b, s, topk]
        valid = idx != -1
        safe = idx.clamp(min=0)
        kf = kv[:, :, 0].float()  # [b, sk, 576]
        batch = torch.arange(b).view(b, 1, 1)
        k_sel = kf[batch, safe]  # [b, s, topk, 576]
        logits = torch.einsum("bshd,bstd->bsht", q.float(), k_sel) * scale
        logits = logits.masked_fill(~valid.unsqueeze(2), float("-inf"))
        row_valid = valid.any(-1).view(b, s, 1, 1)
        lse = torch.logsumexp(logits.masked_fill(~row_valid, 0.0), dim=-1)
        probs = torch.softmax(logits.masked_fill(~row_valid, 0.0), dim=-1)
        probs = probs.masked_fill(~valid.unsqueeze(2), 0.0) * row_valid
        out = torch.einsum("bsht,bstv->bshv", probs, k_sel[..., :V_CHANNELS])
        return out.to(torch.bfloat16), lse.masked_fill(~row_valid[..., 0], 0.0)
