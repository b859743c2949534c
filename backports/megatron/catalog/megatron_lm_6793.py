"""NVIDIA/Megatron-LM#6793: one DSA index-share carrier per checkpointed forward.

Without packed sequences, megatron-core 0.19's ``DSAttention`` keeps the top-k it shares
between layers on ``attention_mask`` (on its config when there is no mask), which outlives
one forward: under activation recompute with two micro-batches (F1, F2, B1, B2) the
recompute of F1 reads F2's top-k, and the logits are silently wrong. The fix spans two
targets, applied and reverted together: ``checkpointed_forward`` (imported by name into the
transformer and hybrid blocks, star re-exported by ``ssm.mamba_block``) and the carrier
method of ``DSAttention``.
"""

import types
from collections.abc import Sequence
from types import SimpleNamespace

from packaging.version import Version

from ..model import (
    BackportSpec,
    Resolved,
    ResolvedTarget,
    SniffFailed,
    SniffResult,
    Target,
    VendoredRef,
    recorded_as,
)
from ..private_globals import with_globals
from ._untyped import MegatronFunction, MegatronObject, Tensor

# The top-k a micro-batch's computing layer leaves for the layers that share it.
_F1, _F2 = 1.0, 2.0


class _RecordingCheckpoint:
    """``tensor_parallel`` stand-in: ``checkpoint`` runs the chunk without grad, as the real
    one does in forward, and keeps it so the sniff can replay it later as a recompute: with
    grad on and the tensor arguments detached (new tensor objects, so nothing set on the
    caller's mask rides along), as megatron's and torch's re-entrant checkpoints do."""

    def __init__(self) -> None:
        self.chunks: list[tuple[MegatronFunction, tuple[object, ...]]] = []

    def checkpoint(self, function: MegatronFunction, _distribute: bool, *args: object) -> object:
        import torch

        self.chunks.append((function, args))
        with torch.no_grad():
            return function(*args)


class _SharingLayer:
    """One layer of a stand-in block: it computes the shared top-k (its input) in forward
    and reads it back in the recompute, through the real ``DSAttention`` holder."""

    def __init__(self, attention: MegatronObject) -> None:
        self.attention = attention
        self.layer_number = 1
        self.read_in_recompute: list[float | None] = []

    def __call__(
        self, hidden_states: Tensor, attention_mask: Tensor | None, **kwargs: object
    ) -> Tensor:
        import torch

        packed_seq_params = kwargs.get("packed_seq_params")
        holder = self.attention._get_index_share_topk_holder(packed_seq_params, attention_mask)
        if torch.is_grad_enabled():
            # None: the top-k this layer left in forward is gone (no version loses it).
            top_k = holder.get(1)
            self.read_in_recompute.append(None if top_k is None else float(top_k.sum()))
        else:
            holder[1] = hidden_states.detach().clone()
        return hidden_states


def _attention(carrier: ResolvedTarget) -> MegatronObject:
    """A real ``DSAttention`` on CPU (a skip layer: no indexer is built) whose carrier
    method is the resolved original, set on this instance only, never on the class."""
    dsa = carrier.module
    config = SimpleNamespace(
        dsa_indexer_topk=8, dsa_indexer_topk_freq=4, dsa_indexer_skip_topk_offset=1, kv_channels=16
    )
    attention = carrier.owner(
        config,
        dsa.DSAttentionSubmodules(indexer=object()),
        layer_number=2,
        attn_mask_type=dsa.AttnMaskType.causal,
        attention_type="self",
        softmax_scale=1.0,
        pg_collection=SimpleNamespace(),
    )
    original = carrier.original
    if not isinstance(original, types.FunctionType):
        raise SniffFailed(f"{carrier.attribute} is a {type(original).__name__}, not a function")
    attention._get_index_share_carrier = types.MethodType(original, attention)
    return attention


def _block(layer: _SharingLayer) -> SimpleNamespace:
    """What ``checkpointed_forward`` reads of a TransformerBlock: one layer, block recompute
    of that layer, a DSA config that shares top-k, no FP8/FP4 (plain checkpoint)."""
    config = SimpleNamespace(
        experimental_attention_variant="dsa",
        dsa_indexer_topk_freq=4,
        fp8=False,
        fp4=False,
        distribute_saved_activations=False,
        recompute_method="block",
        recompute_num_layers=1,
    )
    return SimpleNamespace(
        config=config,
        layers=[layer],
        num_layers_per_pipeline_rank=1,
        pg_collection=SimpleNamespace(tp=None),
    )


# What a replay saw: the top-k each recompute read (None: gone) and the names left behind.
_Run = dict[str, list[float | None] | list[str]]


def _replay(forward: ResolvedTarget, carrier: ResolvedTarget, *, masked: bool) -> _Run:
    """F1, F2, then B1, B2 replaying the recorded chunks with grad on (the recompute)."""
    import torch

    attention = _attention(carrier)
    layer = _SharingLayer(attention)
    block = _block(layer)
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool) if masked else None
    config_before = set(vars(attention.config))
    recorder = _RecordingCheckpoint()
    # A private copy sees the recorder; the live module keeps the real tensor_parallel.
    checkpointed = with_globals(forward.original, {"tensor_parallel": recorder})
    for top_k in (_F1, _F2):
        hidden = torch.full((1, 1, 1), top_k)
        checkpointed(block, hidden, mask, None, None, None, None, None, False)
    if len(recorder.chunks) != 2:
        raise SniffFailed(f"expected one checkpointed chunk per forward, got {recorder.chunks}")
    with torch.enable_grad():
        for function, args in recorder.chunks:
            function(*torch.utils.checkpoint.detach_variable(args))
    leaked_on = "mask" if masked else "config"
    left = (
        sorted(vars(mask))
        if mask is not None
        else sorted(set(vars(attention.config)) - config_before)
    )
    return {"recompute_read": layer.read_in_recompute, f"left_on_{leaked_on}": left}


def _judge(run: _Run) -> bool:
    """True: fixed; False: the 0.19.2 leak; anything else raises (incompatible).

    0.19.2 keeps the holder on the caller's mask or config. Without a mask F1's recompute
    then reads F2's top-k; with one, the recompute's detached mask carries no holder and
    finds no top-k at all (None: a real skip layer raises there). The fix reads each
    micro-batch's own top-k and leaves nothing behind.
    """
    read = run["recompute_read"]
    left = next(value for key, value in run.items() if key.startswith("left_on_"))
    if read == [_F1, _F2] and not left:
        return True
    if len(read) == 2 and read[0] != _F1 and left:
        return False
    raise SniffFailed(f"neither the 0.19.2 leak nor the fix: {run}")


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Fixed iff F1's recompute reads F1's top-k and nothing is left on the mask or config,
    with a mask and without one."""
    forward, carrier = recorded_as(targets, ResolvedTarget)
    runs = {
        "with_mask": _replay(forward, carrier, masked=True),
        "without_mask": _replay(forward, carrier, masked=False),
    }
    fixed = {name: _judge(run) for name, run in runs.items()}
    # SkyRL's landed check (a name on dsa): a cross-check only, behaviour decides.
    detail: dict[str, object] = {
        **runs,
        "dsa_has_carrier_scope": hasattr(carrier.module, "_dsa_index_share_carrier_scope"),
    }
    if all(fixed.values()):
        summary = (
            "under recompute with two micro-batches, F1's recompute reads its own shared top-k "
            "and nothing is left on the attention mask or the config"
        )
        return SniffResult(True, summary, detail)
    if not any(fixed.values()):
        summary = (
            "the shared top-k outlives the forward on the attention mask or the config: "
            "under recompute with two micro-batches, F1's recompute reads F2's top-k (no "
            "mask), or finds none on the detached mask"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"fixed with a mask or without one, not both: {fixed}")


SPEC = BackportSpec(
    id="megatron-lm-6793",
    title="DSA index sharing: one top-k carrier per checkpointed forward",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.core.recompute",),
            attribute="checkpointed_forward",
            parameters=(
                "self",
                "hidden_states",
                "attention_mask",
                "context",
                "context_mask",
                "rotary_pos_emb",
                "attention_bias",
                "packed_seq_params",
                "use_inner_quantization_context",
                "padding_mask",
                "extract_layer_indices",
                "layer_offset",
            ),
            helpers=("tensor_parallel", "te_checkpoint"),
        ),
        Target(
            distribution="megatron-core",
            modules=("megatron.core.transformer.experimental_attention_variant.dsa",),
            attribute="DSAttention._get_index_share_carrier",
            parameters=("self", "packed_seq_params", "attention_mask"),
        ),
    ),
    target_since=Version("0.19"),
    fixed_in=None,
    sniff=_sniff,
    vendored=VendoredRef(module="index_share"),  # not the target module's name
    # Every GPT job imports megatron.core.recompute (its blocks take checkpointed_forward
    # by name); only a DSA job needs the fix: the entry waits for the DSA module rather
    # than import it into every job.
    coupled=True,
)
