"""megatron-lm-6010: LLaVA and MiMo hand the loss mask to the language model.

The sniff on the installed methods (stand-in ``self``, a recording language model), on the
rebuilt ones, and on a mix of the two; then a real ``LLaVAModel`` (a one-layer GPT language
model, no vision encoder: the image embeddings come in through ``set_input_tensor`` as on
a decoder pipeline stage) built on CPU in a one-process gloo group, whose language model is
watched with a forward pre-hook: stock 0.19.2 gets no loss mask, ``apply()`` gives it the
combined mask, ``revert()`` takes it away. The expected mask is written by hand from
LLaVA's documented rule (text positions keep the caller's mask; image positions and the
token just before an image get 0).
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from packaging.version import Version

from backports.megatron import Action, Verdict, apply, revert, status
from backports.megatron.model import SniffFailed
from backports.megatron.vendored import vendored_module
from tests.deciding import resolve_target, sniff_replacement
from tests.reports import report_for

ID = "megatron-lm-6010"


@pytest.fixture(scope="module")
def spec() -> Any:
    from backports.megatron.catalog.megatron_lm_6010 import SPEC

    return SPEC


@pytest.fixture
def targets(spec: Any) -> list[Any]:
    return [resolve_target(target, ID) for target in spec.targets]


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(spec, targets):
    result = spec.sniff(targets)
    assert result.fixed is False
    calls = result.detail["language_model_got"]
    assert len(calls) == 4  # LLaVA, MiMo colocated, MiMo first and later pipeline stage
    assert all(seen == [{"loss_mask": "not passed"}] for seen in calls.values())


@pytest.mark.parametrize("upstream_only", [True, False])
def test_sniff_says_fixed_on_the_rebuilt_methods(spec, targets, upstream_only):
    module = vendored_module(spec.vendored)
    result = sniff_replacement(spec, module, upstream_only=upstream_only, targets=targets)
    assert result.fixed is True, result.summary
    assert all(
        seen == [{"loss_mask": [[0.0, 1.0, 1.0]]}]
        for seen in result.detail["language_model_got"].values()
    )


def test_a_release_that_fixed_llava_only_is_incompatible(spec, targets):
    """One class fixed and not the other is neither 0.19.2 nor the pull request."""
    rebuilt = vendored_module(spec.vendored).forward
    mixed = [dataclasses.replace(targets[0], original=rebuilt), *targets[1:]]
    with pytest.raises(SniffFailed, match="some calls only"):
        spec.sniff(mixed)


def test_the_control_fails_when_labels_do_not_reach_the_language_model(spec, targets):
    """A forward that drops the model's labels is no version of LLaVA: incompatible."""
    original = targets[0].original

    def drops_labels(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = self.language_model
        self.language_model = lambda **call: model(**{**call, "labels": None})
        return original(self, *args, **kwargs)

    with pytest.raises(SniffFailed, match="got labels None"):
        spec.sniff([dataclasses.replace(targets[0], original=drops_labels), *targets[1:]])


# --- parameters reordered upstream (#6260), judged by behaviour ---------------------------

# A made-up LLaVAModel.forward (this project's text, not upstream's) that drifted as a later
# release might: ``input_ids`` before ``images`` and ``imgs_sizes`` moved up (#6260 moved
# it), a ``_preprocess_data`` that returns five values (main's tip: the combined input and
# position ids too), and the loss mask handed only to a GPTModel / HybridModel language
# model (main's tip). It hands the language model the model's labels, and the combined loss
# mask where ``{mask}`` says so.
_DRIFTED = """
def forward(
    self, input_ids, images, position_ids, attention_mask, labels=None, loss_mask=None,
    inference_context=None, num_image_tiles=None, image_token_index=None,
    runtime_gather_output=None, packed_seq_params=None, imgs_sizes=None,
    vision_packed_seq_params=None, sound_clips=None, sound_length=None, sound_timestamps=None,
    num_sound_clips=None, num_frames=None, *, inference_params=None,
):
    if images is not None and not self.add_encoder:
        raise ValueError("images handed to a stage without the vision encoder")
    _, new_labels, new_loss_mask, combined_ids, _ = self._preprocess_data(
        None, None, input_ids, loss_mask, labels, False, None, image_token_index, None
    )
    call = dict(
        input_ids=combined_ids, position_ids=None, attention_mask=attention_mask,
        decoder_input=None, labels=new_labels,
    )
    if {mask}isinstance(self.language_model, (GPTModel, HybridModel)):
        call["loss_mask"] = new_loss_mask
    return self.language_model(**call), new_loss_mask
"""


def _five_values(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A made-up ``_preprocess_data`` of a later release: five values, not three."""
    return None, None, None, None, None


def _drifted_forward(with_mask: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The variant compiled as the LLaVA module's own code (its file, its globals), as a
    release that carries it would have it; the class's ``_preprocess_data`` drifted too."""
    import megatron.core.models.multimodal.llava_model as llava

    monkeypatch.setattr(llava.LLaVAModel, "_preprocess_data", _five_values)
    text = _DRIFTED.format(mask="" if with_mask else "False and ")
    namespace: dict[str, Any] = {}
    exec(compile(text, llava.__file__, "exec"), vars(llava), namespace)
    return namespace["forward"]


@pytest.mark.parametrize("with_mask", [False, True])
def test_the_sniff_judges_a_forward_that_drifted_as_later_releases_did(
    spec, targets, with_mask, monkeypatch
):
    """Reordered parameters (the sniff passes them by name), a ``_preprocess_data`` of five
    values, a loss mask for a GPTModel only: still needed without the fix, fixed with it."""
    forward = _drifted_forward(with_mask, monkeypatch)
    rebuilt = vendored_module(spec.vendored)
    rest = [dataclasses.replace(t, original=getattr(rebuilt, t.attribute.rpartition(".")[2]))
            for t in targets[1:]] if with_mask else targets[1:]  # fmt: skip
    result = spec.sniff([dataclasses.replace(targets[0], original=forward), *rest])
    assert result.fixed is with_mask, result.summary


@pytest.fixture
def mimo_fixed(spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """MiMo's two methods as a release with the fix has them: the rebuilt ones, their code
    given the module's file name (a release's own code, not another patch)."""
    import types

    import megatron.core.models.mimo.model.base as base

    rebuilt = vendored_module(spec.vendored)
    for name in ("_forward_all_modules", "_forward_language_module"):
        made = getattr(rebuilt, name)
        code = made.__code__.replace(co_filename=base.__file__)
        own = types.FunctionType(code, made.__globals__, name, made.__defaults__, made.__closure__)
        own.__kwdefaults__, own.__qualname__ = made.__kwdefaults__, f"MimoModel.{name}"
        monkeypatch.setattr(base.MimoModel, name, own)


def test_a_release_with_the_fix_and_reordered_parameters_reads_upstream(
    spec, mimo_fixed, monkeypatch
):
    """The signature check refuses the vendored code there, but the behaviour is judged
    all the same: the fix landed (before, the verdict was ``incompatible``)."""
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    from tests.deciding import probe

    monkeypatch.setattr(LLaVAModel, "forward", _drifted_forward(True, monkeypatch))
    # The stand-in release is recorded as carrying the fix: the evidence that confirms the
    # sniff (alone, a fixed sniff is "drifted", never "upstream").
    decision = probe(dataclasses.replace(spec, fixed_in=Version("0.19.2")))
    assert decision.verdict is Verdict.UPSTREAM, decision.reason
    assert "judged by behaviour: upstream reordered parameters" in decision.reason
    assert "LLaVAModel.forward signature is (self, input_ids, images" in decision.reason


def test_a_release_without_the_fix_and_reordered_parameters_stays_incompatible(spec, monkeypatch):
    """Without the fix the vendored code cannot go in over reordered parameters."""
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    from tests.deciding import probe

    monkeypatch.setattr(LLaVAModel, "forward", _drifted_forward(False, monkeypatch))
    decision = probe(spec)
    assert decision.verdict is Verdict.INCOMPATIBLE, decision.reason
    assert decision.reason.startswith("megatron.core.models.multimodal.llava_model.LLaVAModel")
    assert "signature is (self, input_ids, images" in decision.reason


def _definition(function: Any) -> Any:
    import ast
    import inspect
    import textwrap

    return ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]


def test_the_rebuilt_methods_differ_from_the_installed_ones_only_by_the_loss_mask(spec):
    """The rule's whole edit: one ``loss_mask=`` keyword per language-model call."""
    import ast

    module = vendored_module(spec.vendored)
    for target, name, mask in [
        (spec.targets[0], "forward", "new_loss_mask"),
        (spec.targets[1], "_forward_all_modules", "loss_mask"),
        (spec.targets[2], "_forward_language_module", "loss_mask"),
    ]:
        before = _definition(resolve_target(target, ID).original)
        after = _definition(getattr(module, name))
        calls = [
            node
            for node in ast.walk(after)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "language_model"
        ]
        added = [
            (call, keyword)
            for call in calls
            for keyword in call.keywords
            if keyword.arg == "loss_mask" and getattr(keyword.value, "id", None) == mask
        ]
        assert len(added) == len(calls) > 0
        for call, keyword in added:
            call.keywords.remove(keyword)
        assert ast.dump(after) == ast.dump(before)


# --- a real LLaVAModel on CPU -------------------------------------------------------------

IMAGE = 31  # the image token of this test's vocabulary
_TEXT_MASK = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]  # the caller's loss mask over input_ids below
_INPUT_IDS = [1, IMAGE, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def one_process_group() -> Iterator[None]:
    """A gloo group of one process (no file, no port: a HashStore) and megatron's parallel
    state on it, for building real megatron modules on CPU; torn down after."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _tiny_llava() -> Any:
    """A real LLaVAModel: one-layer GPT language model (hidden 8), 4x4 images in 2x2
    patches (5 image embeddings with the class token), decoder side only."""
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.multimodal.llava_model import LLaVAModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=8,
        ffn_hidden_size=16,
        num_attention_heads=2,
        use_cpu_initialization=True,
    )
    vision_config = copy.copy(config)
    vision_config.vision_model_type = "clip"
    layer_spec = get_gpt_layer_local_spec()
    return LLaVAModel(
        language_transformer_config=config,
        language_transformer_layer_spec=layer_spec,
        language_vocab_size=32,
        language_max_sequence_length=16,
        vision_transformer_config=vision_config,
        vision_transformer_layer_spec=layer_spec,
        drop_vision_class_token=False,
        vision_projection_config=config,
        vision_projection_layer_spec=layer_spec.submodules.mlp.keywords["submodules"],
        add_encoder=False,
        add_decoder=True,
        img_h=4,
        img_w=4,
        patch_dim=2,
        image_token_index=IMAGE,
    )


class _Reached(Exception):
    """Raised by the pre-hook: what the language model was called with is all we need (its
    forward would need CUDA for the attention's memory buffer)."""


def _what_the_language_model_gets(model: Any) -> dict[str, Any]:
    import torch

    seen: dict[str, Any] = {}

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen.update(kwargs)
        raise _Reached

    handle = model.language_model.register_forward_pre_hook(hook, with_kwargs=True)
    model.set_input_tensor(torch.randn(model.img_seq_len, 1, 8))
    try:
        with pytest.raises(_Reached):
            model(
                images=torch.zeros(1, 3, 4, 4),
                input_ids=torch.tensor([_INPUT_IDS]),
                position_ids=torch.arange(len(_INPUT_IDS)).unsqueeze(0),
                attention_mask=None,
                labels=torch.tensor([[IMAGE, 2, 3, 4, 5, 6]]),
                loss_mask=torch.tensor([_TEXT_MASK]),
                num_image_tiles=torch.tensor([1], dtype=torch.int),
            )
    finally:
        handle.remove()
    return seen


def _expected_mask(image_positions: int) -> list[float]:
    """By hand: token 1 (before the image) 0, the image's positions 0, then the caller's
    mask of the text after the image."""
    return [0.0] + [0.0] * image_positions + _TEXT_MASK[2:]


def test_a_real_llava_model_hands_the_loss_mask_after_apply_and_not_after_revert(
    spec, one_process_group
):
    model = _tiny_llava()
    assert model.img_seq_len == 5  # (4 / 2) ** 2 patches + the class token
    stock = _what_the_language_model_gets(model)
    assert stock["labels"].shape == (1, 10) and "loss_mask" not in stock

    (report,) = [r for r in apply(ID) if r.id == ID]
    assert report.action is Action.INSTALLED, report.reason
    fixed = _what_the_language_model_gets(model)
    assert fixed["loss_mask"].tolist() == [_expected_mask(5)]
    assert fixed["labels"].tolist() == stock["labels"].tolist()

    revert(ID)
    assert "loss_mask" not in _what_the_language_model_gets(model)


def test_status_says_needed_on_0_19_2():
    report = report_for(status(), ID)
    assert report.verdict is Verdict.NEEDED, report.reason
    assert "without the loss mask" in report.reason
    assert report.evidence["vendored_behaviour"]["upstream-only"]["fixed"] is True


def test_both_classes_are_applied_and_reverted_together():
    from megatron.core.models.mimo.model.base import MimoModel
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    names = [(LLaVAModel, "forward"), (MimoModel, "_forward_all_modules")]
    names.append((MimoModel, "_forward_language_module"))
    before = [vars(owner)[name] for owner, name in names]
    apply(ID)
    try:
        live = [vars(owner)[name] for owner, name in names]
        assert all(getattr(f, "__backport__", None) == ID for f in live)
        assert [f.__wrapped__ for f in live] == before
    finally:
        revert(ID)
    assert all(vars(owner)[name] is f for (owner, name), f in zip(names, before, strict=True))
