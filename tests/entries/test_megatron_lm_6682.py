"""megatron-lm-6682: the ``identity`` SFT prompt format masks system and user tokens.

The sniff on a stand-in tokenizer, and a real megatron-core 0.19.2 ``SFTTokenizer`` built
through ``transformers.AutoTokenizer`` on a tiny word-level tokenizer this test writes (no
download). Expected targets are computed from the conversation by hand, never by the code
under test.
"""

import inspect
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from backports.megatron._vendor.megatron_lm_6682.sft_tokenizer import (
    tokenize_conversation as vendored,
)

from backports.megatron import Action, Verdict, apply, revert, status
from tests.reports import report_for

ID = "megatron-lm-6682"
NAME = "tokenize_conversation"
IGNORE = -100


@pytest.fixture(scope="module")
def sft_class() -> type:
    from megatron.core.tokenizers.text.libraries.sft_tokenizer import SFTTokenizer

    return SFTTokenizer


@pytest.fixture(scope="module")
def installed(sft_class: type) -> Callable[..., Any]:
    return vars(sft_class)[NAME]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def spec() -> Any:
    from backports.megatron.catalog.megatron_lm_6682 import SPEC

    return SPEC


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(spec, installed):
    result = spec.sniff([SimpleNamespace(original=installed)])
    assert result.fixed is False
    assert result.detail["identity"] == {"tokens": [2, 2, 3, 3], "target": [2, 2, 3, 3]}
    assert "trains on prompt tokens" in result.summary


def test_sniff_says_fixed_on_vendored_code(spec):
    result = spec.sniff([SimpleNamespace(original=vendored)])
    assert result.fixed is True
    assert result.detail["identity"]["target"] == [IGNORE, IGNORE, 3, 3]


def _masks_default_too(self, conversation, return_target, add_generation_prompt):
    """Masks the prompt under every format, default included: like no version."""
    self = SimpleNamespace(**{**vars(self), "_prompt_format": "identity"})
    return vendored(self, conversation, return_target, add_generation_prompt)


def _masks_everything(self, conversation, return_target, add_generation_prompt):
    out = vendored(self, conversation, return_target, add_generation_prompt)
    if not return_target:
        return out
    tokens, target = out
    if self._prompt_format == "identity":
        target[:] = IGNORE
    return tokens, target


@pytest.mark.parametrize(
    ("method", "why"),
    [(_masks_default_too, "the controls gave"), (_masks_everything, "the identity format gave")],
)
def test_sniff_raises_on_a_method_unlike_any_version(spec, method, why):
    with pytest.raises(RuntimeError, match=why):
        spec.sniff([SimpleNamespace(original=method)])


def test_spec_parameters_match_installed_and_vendored(spec, installed):
    expected = list(spec.target.parameters)
    assert list(inspect.signature(installed).parameters) == expected
    assert list(inspect.signature(vendored).parameters) == expected


# --- a real SFTTokenizer on a tiny word-level tokenizer -----------------------------------

WORDS = ("<unk>", "<pad>", "be", "brief", "what", "is", "two", "plus", "four", "tool", "said")
# The identity template concatenates the contents: each prompt turn ends in a space so
# the conversation splits into the same words as its turns.
CONVERSATION = [
    {"role": "system", "content": "be brief "},
    {"role": "user", "content": "what is two plus two "},
    {"role": "assistant", "content": "four"},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    folder = tmp_path_factory.mktemp("word-level-tokenizer")
    fast.save_pretrained(str(folder))
    return folder


def word_ids(text: str) -> list[int]:
    return [WORDS.index(word) for word in text.split()]


def expected(conversation: list[dict], masked_roles: tuple[str, ...]) -> tuple[list, list]:
    """Tokens and targets by hand: each turn's words, masked where its role is."""
    tokens: list[int] = []
    target: list[int] = []
    for turn in conversation:
        ids = word_ids(turn["content"])
        tokens += ids
        target += [IGNORE] * len(ids) if turn["role"] in masked_roles else ids
    return tokens, target


def tokenize(tokenizer_dir: Path, prompt_format: str, conversation=CONVERSATION) -> tuple:
    from megatron.core.tokenizers.text.libraries.sft_tokenizer import SFTTokenizer

    sft = SFTTokenizer(str(tokenizer_dir), prompt_format)
    tokens, target = sft.tokenize_conversation(
        conversation, return_target=True, add_generation_prompt=False
    )
    assert isinstance(tokens, np.ndarray)
    return tokens.tolist(), target.tolist()


def test_real_identity_tokenizer_on_0_19_2_trains_on_the_prompt(tokenizer_dir):
    tokens, target = tokenize(tokenizer_dir, "identity")
    assert (tokens, target) == expected(CONVERSATION, masked_roles=())


def test_real_identity_tokenizer_with_the_backport_masks_system_and_user(tokenizer_dir):
    report = report_for(apply(only=ID), ID)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
    tokens, target = tokenize(tokenizer_dir, "identity")
    assert (tokens, target) == expected(CONVERSATION, masked_roles=("system", "user"))
    assert target[-1] == WORDS.index("four")


def test_real_identity_tokenizer_masks_tool_turns_too(tokenizer_dir):
    conversation = [
        {"role": "user", "content": "what is two plus two "},
        {"role": "assistant", "content": "four "},
        {"role": "tool", "content": "tool said four "},
        {"role": "assistant", "content": "four"},
    ]
    apply(only=ID)
    tokens, target = tokenize(tokenizer_dir, "identity", conversation)
    assert (tokens, target) == expected(conversation, masked_roles=("user", "tool"))


def test_real_default_format_still_keeps_every_label(tokenizer_dir, tmp_path):
    """The default format (the tokenizer's own chat template) is what #6682 leaves alone."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    hf.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    hf.save_pretrained(str(tmp_path))
    apply(only=ID)
    tokens, target = tokenize(tmp_path, "default")
    assert tokens == target == expected(CONVERSATION, masked_roles=())[0]


# --- apply / revert / status -----------------------------------------------------------------


def test_apply_marks_the_method_and_revert_restores_the_same_object(sft_class, installed):
    report_for(apply(only=ID), ID)
    assert getattr(sft_class, NAME).__backport__ == ID
    report_for(revert(only=ID), ID)
    assert vars(sft_class)[NAME] is installed


def test_status_on_0_19_2_says_needed_with_its_reason():
    report = report_for(status(only=ID), ID)
    assert report.verdict == Verdict.NEEDED
    assert "trains on prompt tokens" in report.reason
    assert report.evidence["target"]["attribute"] == f"SFTTokenizer.{NAME}"
