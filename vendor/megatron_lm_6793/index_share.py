# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:    https://github.com/NVIDIA/Megatron-LM
# pr:      6793 (open)
# symbols: checkpointed_forward (megatron/core/recompute.py),
#          DSAttention._get_index_share_carrier (.../experimental_attention_variant/dsa.py)
# origin:  handwritten in this repository from the pull request's described behaviour; not a
#          byte copy of upstream source. checkpointed_forward runs megatron-core's own
#          function at call time and only adds the carrier scope around the chunks it builds.
"""One private DSA index-share carrier per ``checkpointed_forward`` call.

Without packed sequences, megatron-core 0.19's ``DSAttention`` keeps the top-k it shares
between layers on ``attention_mask`` (or on ``self.config`` when there is no mask). Both
outlive one forward: with activation recompute and two micro-batches (F1, F2, B1, B2), the
recompute of F1 reads the top-k F2 left there, and the logits are silently wrong.

The fix: each ``checkpointed_forward`` call of a DSA model that shares top-k
(``dsa_indexer_topk_freq > 1``) makes a fresh carrier and exposes it through a ``ContextVar``
while every chunk it builds runs, including the recompute of a checkpointed chunk in
backward (the wrapped chunk function captures the carrier, so the recompute sees the same
one, on whatever thread autograd runs it). ``DSAttention._get_index_share_carrier`` returns
``packed_seq_params``, else that carrier, else the old fallback.
"""

import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = [
    "IndexShareCarrier",
    "checkpointed_forward",
    "current_index_share_carrier",
    "index_share_carrier_scope",
]

# The module whose globals checkpointed_forward reads. The applier rebinds it to the module
# that really defines the function.
__target_module__ = "megatron.core.recompute"

# Module globals of the target read at call time: the original function itself, and the two
# checkpoint entry points whose chunk functions are run inside the carrier scope.
__reads__ = ("checkpointed_forward", "tensor_parallel", "te_checkpoint")


def _live_target() -> Any:
    return sys.modules[__target_module__]


class IndexShareCarrier:
    """What DSA sets its per-forward top-k holders on: one per checkpointed forward."""

    def __repr__(self) -> str:
        return f"<IndexShareCarrier {sorted(vars(self))}>"


_CARRIER: ContextVar[IndexShareCarrier | None] = ContextVar(
    "megatron_lm_6793_index_share_carrier", default=None
)


def current_index_share_carrier() -> IndexShareCarrier | None:
    """The carrier of the innermost scope this code runs in, or None outside every scope."""
    return _CARRIER.get()


@contextmanager
def index_share_carrier_scope(carrier: IndexShareCarrier) -> Iterator[IndexShareCarrier]:
    """Expose ``carrier`` to DSA while the block runs; the outer value comes back after."""
    token = _CARRIER.set(carrier)
    try:
        yield carrier
    finally:
        _CARRIER.reset(token)


def _shares_topk(config: Any, packed_seq_params: Any) -> bool:
    """Whether this forward needs a private carrier: DSA, top-k shared, no packed params
    (packed_seq_params is itself a per-forward carrier)."""
    if packed_seq_params is not None:
        return False
    if getattr(config, "experimental_attention_variant", None) != "dsa":
        return False
    return (getattr(config, "dsa_indexer_topk_freq", None) or 1) > 1


def _in_scope(function: Callable[..., Any], carrier: IndexShareCarrier) -> Callable[..., Any]:
    """``function`` run inside the carrier scope (forward and its recompute alike)."""

    def chunk(*args: Any, **kwargs: Any) -> Any:
        with index_share_carrier_scope(carrier):
            return function(*args, **kwargs)

    return chunk


class _ScopedTensorParallel:
    """``tensor_parallel`` whose ``checkpoint`` runs the chunk function in the scope."""

    def __init__(self, tensor_parallel: Any, carrier: IndexShareCarrier) -> None:
        self._tensor_parallel = tensor_parallel
        self._carrier = carrier

    def checkpoint(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._tensor_parallel.checkpoint(_in_scope(function, self._carrier), *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tensor_parallel, name)


def _scoped_te_checkpoint(te_checkpoint: Any, carrier: IndexShareCarrier) -> Any:
    if te_checkpoint is None:
        return None

    def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return te_checkpoint(_in_scope(function, carrier), *args, **kwargs)

    return checkpoint


_MAX_WRAPPERS = 32


def _installed_original(target: Any) -> Any:
    """megatron-core's own ``checkpointed_forward``: the live binding, or, when that is this
    replacement (installed as a copy of this function), the original it wraps."""
    live = target.checkpointed_forward
    function = live
    for _ in range(_MAX_WRAPPERS):  # bounded: a __wrapped__ cycle must not hang a forward
        if function is None:
            break
        if getattr(function, "__code__", None) is checkpointed_forward.__code__:
            return function.__wrapped__
        function = getattr(function, "__wrapped__", None)
    return live


def _with_scoped_checkpoints(target: Any, original: Any, carrier: IndexShareCarrier) -> Any:
    """A copy of ``original`` whose checkpoint entry points run chunks in the scope.

    The copy has private globals (a snapshot of its module's, read now); the module itself is
    never written, so another thread's forward keeps the real entry points.
    """
    namespace = dict(original.__globals__)
    namespace["tensor_parallel"] = _ScopedTensorParallel(target.tensor_parallel, carrier)
    namespace["te_checkpoint"] = _scoped_te_checkpoint(target.te_checkpoint, carrier)
    copy = types.FunctionType(
        original.__code__,
        namespace,
        original.__name__,
        original.__defaults__,
        original.__closure__,
    )
    copy.__kwdefaults__ = original.__kwdefaults__
    return copy


def checkpointed_forward(
    self: Any,
    hidden_states: Any,
    attention_mask: Any,
    context: Any,
    context_mask: Any,
    rotary_pos_emb: Any,
    attention_bias: Any,
    packed_seq_params: Any,
    use_inner_quantization_context: bool,
    padding_mask: Any = None,
    extract_layer_indices: Any = None,
    layer_offset: int = 0,
) -> Any:
    """Forward method with activation checkpointing, one index-share carrier per call.

    megatron-core's function does the work (uniform / block recompute, TE checkpoint under
    FP8/FP4, padding mask, layer extraction, return values); a DSA forward that shares top-k
    without packed sequences runs it inside a fresh carrier's scope, and every checkpointed
    chunk re-enters that scope when it runs, recompute in backward included.
    """
    # Read here, not in the helpers: a private copy of this function (the probe's) gets its
    # own _live_target, and only this function's globals are that copy's.
    target = _live_target()
    original = _installed_original(target)
    args = (
        self,
        hidden_states,
        attention_mask,
        context,
        context_mask,
        rotary_pos_emb,
        attention_bias,
        packed_seq_params,
        use_inner_quantization_context,
        padding_mask,
        extract_layer_indices,
        layer_offset,
    )
    if not _shares_topk(self.config, packed_seq_params):
        return original(*args)
    carrier = IndexShareCarrier()
    # Chunks that are not checkpointed run inside this call, so inside this scope.
    with index_share_carrier_scope(carrier):
        return _with_scoped_checkpoints(target, original, carrier)(*args)


def _get_index_share_carrier(self: Any, packed_seq_params: Any, attention_mask: Any) -> object:
    """Return the object that carries DSA top-k sharing state for this forward."""
    if packed_seq_params is not None:
        return packed_seq_params
    carrier = _CARRIER.get()
    if carrier is not None:
        return carrier
    return attention_mask if attention_mask is not None else self.config
