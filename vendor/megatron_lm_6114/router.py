# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     6114 (merged 2026-08-20; fixes issue #6111)
# path:   megatron/core/transformer/moe/router.py
# symbol: TopKRouter._apply_expert_bias
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's method; not a byte copy of upstream source.
"""PR ``TopKRouter._apply_expert_bias``: a padding mask removes token rows from the counts.

Upstream's behaviour and nothing else. In megatron-core 0.16 to 0.19.2 the flattened padding
mask ``[num_tokens]`` is combined with ``routing_map [num_tokens, num_experts]`` along the
expert axis: a broadcast ``RuntimeError`` when tokens != experts, wrong counts when they are
equal. Here it removes whole token rows.

The function is a plain, undecorated body. The original method is decorated with
``megatron.core.jit.jit_fuser`` (``torch.compile``); the applier decorates this body with the
live decorator, so it is compiled exactly as the original is.
"""

import torch

# The module that defines the method. The applier rebinds it to where it really lives.
__target_module__ = "megatron.core.transformer.moe.router"

# Module globals of the target read at call time: none, the body only touches ``self``.
__reads__: tuple[str, ...] = ()


def _apply_expert_bias(
    self, routing_map: torch.Tensor, padding_mask: torch.Tensor | None = None
) -> None:
    """Add this micro-batch's routes per expert to ``self.local_tokens_per_expert``.

    ``routing_map`` is bool ``[num_tokens, num_experts]``; ``padding_mask`` is bool
    ``[num_tokens]`` with True for padding, as ``routing()`` flattens it. A padded token
    drops all of its routes. Only a grad-enabled pass counts, so evaluation and the no-grad
    replay of activation recompute add nothing.
    """
    if self.enable_expert_bias and torch.is_grad_enabled():
        with torch.no_grad():
            if padding_mask is not None:
                # A new tensor: the caller's routing_map is never written.
                routing_map = routing_map & (~padding_mask).unsqueeze(-1)
            # In place: the buffer is registered and CUDA graphs capture its storage, so it
            # must never be rebound to a new tensor.
            self.local_tokens_per_expert += routing_map.sum(dim=0)
