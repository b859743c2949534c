"""NVIDIA/Megatron-LM#6010: the multimodal models hand the loss mask to the language model.

megatron-core 0.19.2's ``LLaVAModel.forward`` builds a loss mask over the combined sequence
(0 at image and sound positions) and returns it, but calls the language model without it;
``MimoModel._forward_all_modules`` and ``_forward_language_module`` do the same with the
CP-sharded mask. With multi-token prediction (``mtp_num_layers > 0``) the language model
then trains its MTP head on the modality placeholder positions: nothing raises, the loss is
silently wrong (NVIDIA-NeMo/Megatron-Bridge#6103, modelscope/ms-swift#8192).

Two classes in two files, three methods, applied and reverted together. The sniff passes
every argument but ``self`` by name: where upstream only reordered the parameters (#6260
moved ``LLaVAModel.forward``'s ``imgs_sizes``), the signature check refuses the vendored code
but the decision still judges the behaviour, and a release with the fix reads ``upstream``.
The stand-in ``self`` answers in the shapes the installed class uses: its
``_preprocess_data`` returns as many values as the class's own (five at main's tip), and the
recording language model is an instance of the module's ``GPTModel`` (main's tip hands the
mask only to a ``GPTModel`` / ``HybridModel``).
"""

import ast
import inspect
import textwrap
from collections.abc import Sequence
from types import ModuleType, SimpleNamespace

from packaging.version import Version

from ..model import (
    BackportSpec,
    Resolved,
    ResolvedTarget,
    SniffFailed,
    SniffResult,
    Target,
    recorded_as,
)
from ._untyped import MegatronFunction, Tensor

_LLAVA = "megatron.core.models.multimodal.llava_model"
_MIMO = "megatron.core.models.mimo.model.base"


class _RecordingLanguageModel:
    """Stands for the language model: keeps the keyword arguments of every call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Tensor]] = []

    def __call__(self, **kwargs: Tensor) -> Tensor:
        import torch

        self.calls.append(kwargs)
        return torch.zeros(1)


def _masks() -> tuple[Tensor, Tensor, Tensor]:
    """Text labels, the mask the model computes (0 at a placeholder) and the caller's mask."""
    import torch

    return torch.tensor([[5, 6, 7]]), torch.tensor([[0.0, 1.0, 1.0]]), torch.ones(1, 3)


def _what_reached(call: dict[str, Tensor], labels: Tensor, mask: Tensor) -> dict[str, object]:
    """The control (the model's labels reach it, in every version) and the fix (its mask)."""
    if call.get("labels") is not labels:
        raise SniffFailed(f"the language model got labels {call.get('labels')!r}, not {labels}")
    if "loss_mask" not in call:
        return {"loss_mask": "not passed"}
    if call["loss_mask"] is not mask:
        raise SniffFailed(f"the language model got loss_mask {call['loss_mask']!r}, not {mask}")
    return {"loss_mask": mask.tolist()}


def _language_model_for(module: ModuleType) -> _RecordingLanguageModel:
    """The recording language model, as an instance of the language-model class the LLaVA
    module builds (its ``GPTModel``), made without that class's constructor: main's tip
    hands the loss mask only to a ``GPTModel`` / ``HybridModel``."""
    built = vars(module).get("GPTModel")
    if not isinstance(built, type):
        return _RecordingLanguageModel()
    kind = type("_RecordingGPTModel", (_RecordingLanguageModel, built), {})
    recorder: _RecordingLanguageModel = object.__new__(kind)
    object.__setattr__(recorder, "calls", [])  # not nn.Module's bookkeeping: never built
    return recorder


def _returned_count(method: object, default: int) -> int:
    """How many values ``method`` returns, read from its source (the longest tuple it
    returns), or ``default`` where that cannot be read: main's tip's ``_preprocess_data``
    returns five (the combined input and position ids too), 0.19.2's three."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return default
    counts = [
        len(node.value.elts)
        for node in ast.walk(tree)
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple)
    ]
    return max(counts, default=default)


def _llava_forward(
    forward: MegatronFunction, owner: object, module: ModuleType
) -> list[dict[str, object]]:
    """``LLaVAModel.forward`` on a stand-in decoder stage: its ``_preprocess_data`` returns
    the combined labels and mask (then ``None`` for whatever more the installed class's own
    returns); what reached the language model."""
    import torch

    labels, mask, caller_mask = _masks()
    language_model = _language_model_for(module)
    extra = _returned_count(getattr(owner, "_preprocess_data", None), 3) - 3
    model = SimpleNamespace(
        add_encoder=False,
        add_decoder=True,
        pre_process=False,
        encoder_hidden_state=None,
        context_parallel_lm=1,
        sequence_parallel_lm=False,
        image_token_index=-200,
        _preprocess_data=lambda *args, **kwargs: (None, labels, mask, *[None] * extra),
        language_model=language_model,
    )
    ids = torch.tensor([[1, 2, 3]])
    # By name: upstream reordered the later parameters since (#6260), not their meaning.
    _, returned = forward(
        model,
        images=None,
        input_ids=ids,
        position_ids=None,
        attention_mask=None,
        labels=ids,
        loss_mask=caller_mask,
    )
    if returned is not mask:
        raise SniffFailed(f"LLaVAModel.forward returned loss mask {returned!r}, not {mask}")
    return [_what_reached(call, labels, mask) for call in language_model.calls]


def _mimo(
    language_model: _RecordingLanguageModel, sharded: tuple[Tensor, Tensor]
) -> SimpleNamespace:
    """A stand-in MimoModel: text only, its sharding returns ``sharded`` (labels, mask)."""
    import torch

    def shard(
        embeddings: Tensor, labels: Tensor, loss_mask: Tensor, packed_seq_params: object
    ) -> tuple[object, ...]:
        return embeddings, *sharded, packed_seq_params

    return SimpleNamespace(
        _build_packed_seq_params=lambda packing_kwargs: None,
        modality_submodules={},
        colocated_comms={},
        special_token_ids={},
        get_text_embeddings=lambda *args: torch.zeros(3, 1, 2),
        align_embeddings_by_token_positions=lambda **kwargs: torch.zeros(3, 1, 2),
        _shard_language_inputs=shard,
        partition_adapter=None,
        language_model=language_model,
    )


def _mimo_calls(method: MegatronFunction, first_stage: bool | None) -> list[dict[str, object]]:
    """``_forward_all_modules`` (``first_stage`` None) or ``_forward_language_module`` on one
    pipeline stage: what reached the language model."""
    import torch

    _, mask, caller_mask = _masks()
    sharded = (torch.tensor([[7, 8, 9]]), mask)
    language_model = _RecordingLanguageModel()
    model = _mimo(language_model, sharded)
    if first_stage is not None:  # only _forward_language_module asks for its stage
        model.role = SimpleNamespace(
            is_first_stage=lambda name: first_stage, is_last_stage=lambda name: True
        )
    ids = torch.tensor([[1, 2, 3]])
    # By name, as the LLaVA call: only the sixth parameter's name differs between the two.
    inputs = {"modality_inputs": None} if first_stage is None else {"input_tensors": None}
    method(
        model,
        input_ids=ids,
        position_ids=None,
        attention_mask=None,
        loss_mask=caller_mask,
        labels=ids,
        **inputs,
    )
    return [_what_reached(call, sharded[0], mask) for call in language_model.calls]


def _observe(targets: Sequence[ResolvedTarget]) -> dict[str, list[dict[str, object]]]:
    """Each language-model call of the three methods, by where it is made."""
    llava, all_modules, language_module = (_body(target) for target in targets)
    seen = {
        "LLaVAModel.forward": _llava_forward(llava, targets[0].owner, targets[0].module),
        "MimoModel._forward_all_modules": _mimo_calls(all_modules, None),
        "MimoModel._forward_language_module (first stage)": _mimo_calls(language_module, True),
        "MimoModel._forward_language_module (later stage)": _mimo_calls(language_module, False),
    }
    for where, calls in seen.items():
        if len(calls) != 1:
            raise SniffFailed(f"{where} called the language model {len(calls)} times, not once")
    return seen


def _body(target: ResolvedTarget) -> MegatronFunction:
    return inspect.unwrap(target.original)  # type: ignore[no-any-return]


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Fixed iff every language-model call of the three methods gets the model's loss mask;
    needed iff none does; anything between is a release unlike both (incompatible)."""
    seen = _observe(recorded_as(targets, ResolvedTarget))
    passed = {where: calls[0]["loss_mask"] != "not passed" for where, calls in seen.items()}
    detail: dict[str, object] = {"language_model_got": seen}
    if all(passed.values()):
        summary = (
            "LLaVA and MiMo hand the loss mask to the language model (MTP skips modality positions)"
        )
        return SniffResult(True, summary, detail)
    if not any(passed.values()):
        summary = (
            "LLaVA and MiMo call the language model without the loss mask: an MTP head "
            "trains on image / audio placeholder positions"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"the loss mask reaches the language model in some calls only: {passed}")


SPEC = BackportSpec(
    id="megatron-lm-6010",
    title="Multimodal MTP: LLaVA and MiMo hand the loss mask to the language model",
    targets=(
        Target(
            distribution="megatron-core",
            modules=(_LLAVA,),
            attribute="LLaVAModel.forward",
            parameters=(
                "self",
                "images",
                "input_ids",
                "position_ids",
                "attention_mask",
                "labels",
                "loss_mask",
                "inference_context",
                "num_image_tiles",
                "image_token_index",
                "runtime_gather_output",
                "packed_seq_params",
                "vision_packed_seq_params",
                "sound_clips",
                "sound_length",
                "sound_timestamps",
                "num_sound_clips",
                "imgs_sizes",
                "num_frames",
                "inference_params",
            ),
        ),
        Target(
            distribution="megatron-core",
            modules=(_MIMO,),
            attribute="MimoModel._forward_all_modules",
            parameters=(
                "self",
                "input_ids",
                "position_ids",
                "attention_mask",
                "loss_mask",
                "labels",
                "modality_inputs",
                "packing_kwargs",
            ),
        ),
        Target(
            distribution="megatron-core",
            modules=(_MIMO,),
            attribute="MimoModel._forward_language_module",
            parameters=(
                "self",
                "input_ids",
                "position_ids",
                "attention_mask",
                "loss_mask",
                "labels",
                "input_tensors",
                "packing_kwargs",
            ),
        ),
    ),
    # MiMo's _forward_all_modules and _forward_language_module arrive in 0.17.
    target_since=Version("0.17"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
)
