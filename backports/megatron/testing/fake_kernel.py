"""A CPU stand-in for TileLang's ``SparseMLA``: the kernel's contract, honest FP32 math.

It takes what the real kernel takes (``[b, s, heads, 576]`` bf16 q, ``[b, sk, g, 576]`` kv,
``[b, s, g, topk]`` int32 indices with top-k a multiple of 64; ``g`` key groups of
``heads // g`` query heads each, a power of two and at least 16), treats exactly -1 as an
empty slot, and refuses anything the real kernel would mis-read (any other negative index
reads key 0 there, one >= sk reads out of bounds). Every call is recorded, with copies of
its inputs, so tests can see what the kernel received.
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

    def apply(
        self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert q.dtype == kv.dtype == torch.bfloat16, (q.dtype, kv.dtype)
        assert indices.dtype == torch.int32, indices.dtype
        assert q.is_contiguous() and kv.is_contiguous() and indices.is_contiguous()
        b, s, heads, width = q.shape
        groups = kv.size(2)
        assert width == KERNEL_WIDTH and kv.size(-1) == KERNEL_WIDTH, (q.shape, kv.shape)
        assert kv.shape[0] == b and indices.shape[:3] == (b, s, groups), (kv.shape, indices.shape)
        assert indices.size(-1) % 64 == 0, indices.shape
        assert heads % groups == 0, (heads, groups)
        per_group = heads // groups
        assert per_group >= 16 and per_group & (per_group - 1) == 0, (heads, groups)
        sk = kv.size(1)
        bad = (indices < -1) | (indices >= sk)
        assert not bool(bad.any()), "kernel would read a wrong or out-of-bounds key"
        self.calls.append(
            KernelCall(q.detach().clone(), kv.detach().clone(), indices.clone(), scale)
        )

        idx = indices.long()  # [b, s, g, topk]
        valid = idx != -1
        safe = idx.clamp(min=0)
        kf = kv.float()  # [b, sk, g, 576]
        batch = torch.arange(b).view(b, 1, 1, 1)
        group = torch.arange(groups).view(1, 1, groups, 1)
        k_sel = kf[batch, safe, group]  # [b, s, g, topk, 576]
        qg = q.float().view(b, s, groups, per_group, width)
        logits = torch.einsum("bsghd,bsgtd->bsght", qg, k_sel) * scale
        logits = logits.masked_fill(~valid.unsqueeze(3), float("-inf"))
        row_valid = valid.any(-1).view(b, s, groups, 1, 1)
        lse = torch.logsumexp(logits.masked_fill(~row_valid, 0.0), dim=-1)
        probs = torch.softmax(logits.masked_fill(~row_valid, 0.0), dim=-1)
        probs = probs.masked_fill(~valid.unsqueeze(3), 0.0) * row_valid
        out = torch.einsum("bsght,bsgtv->bsghv", probs, k_sel[..., :V_CHANNELS])
        lse = lse.masked_fill(~row_valid[..., 0], 0.0)
        out, lse = out.reshape(b, s, heads, V_CHANNELS), lse.reshape(b, s, heads)
        return out.to(torch.bfloat16), lse
