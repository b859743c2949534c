"""NVIDIA/Megatron-LM#6682: the ``identity`` SFT prompt format masks prompt tokens.

In megatron-core 0.18 to 0.19.2, ``SFTTokenizer.tokenize_conversation`` returns unmasked
targets for the ``identity`` prompt format as it does for ``default``: system, user and
tool tokens keep their labels, so supervised fine-tuning with ``identity`` trains on the
prompt as well as the answer. 0.17 masked them: #4450 (first in 0.18) lost it, so 0.17.x
has the target and not the bug (``bug_since``).
"""

from collections.abc import Sequence
from types import SimpleNamespace

from packaging.version import Version

from ..model import BackportSpec, Resolved, SniffFailed, SniffResult, Target
from ._untyped import MegatronFunction

# A user turn then an assistant turn; the stand-in tokenizer gives each turn two ids.
_CONVERSATION = ({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})
_IDS_PER_ROLE = {"system": 1, "user": 2, "assistant": 3}
_TOKENS = [2, 2, 3, 3]
_MASKED = [-100, -100, 3, 3]
# A format that always masked prompt turns (the control) and the one the fix is about.
_ALWAYS_MASKED_FORMAT = "nemotron-h-aligned"
_FORMAT = "identity"


class _TwoIdsPerTurn:
    """Stands for the Hugging Face tokenizer: two ids per message, by role."""

    def apply_chat_template(
        self, conversation: list[dict[str, str]], **kwargs: object
    ) -> list[int]:
        return [_IDS_PER_ROLE[turn["role"]] for turn in conversation for _ in range(2)]


def _tokenize(
    method: MegatronFunction, prompt_format: str, return_target: bool
) -> list[int] | list[list[int]]:
    """Run ``method`` on a stand-in SFTTokenizer holding only what it reads."""
    import numpy as np

    tokenizer = SimpleNamespace(
        _prompt_format=prompt_format,
        _prompt_config=SimpleNamespace(
            assistant_prefix_len=0,
            custom_chat_template="stand-in",
            has_bos=False,
            has_system_role=True,
        ),
        _tokenizer=_TwoIdsPerTurn(),
        _extract_token_ids=lambda result: np.asarray(result),
    )
    out = method(tokenizer, list(_CONVERSATION), return_target, False)
    if not return_target:
        return [int(t) for t in out]
    tokens, target = out
    # Lists, not a tuple: the detail goes into reports and their JSON as it is.
    return [[int(t) for t in tokens], [int(t) for t in target]]


def _sniff_method(method: MegatronFunction) -> SniffResult:
    """Fixed iff ``identity`` masks the user turn as the other templated formats do."""
    controls = {
        "tokens": _tokenize(method, _FORMAT, return_target=False),
        "default": _tokenize(method, "default", return_target=True),
        _ALWAYS_MASKED_FORMAT: _tokenize(method, _ALWAYS_MASKED_FORMAT, return_target=True),
    }
    expected = {
        "tokens": _TOKENS,
        "default": [_TOKENS, _TOKENS],
        _ALWAYS_MASKED_FORMAT: [_TOKENS, _MASKED],
    }
    if controls != expected:
        raise SniffFailed(f"the controls gave {controls}, not {expected}")
    tokens, target = _tokenize(method, _FORMAT, return_target=True)
    detail = {"controls": controls, "identity": {"tokens": tokens, "target": target}}
    if tokens == _TOKENS and target == _MASKED:
        return SniffResult(True, f"the identity format masks prompt tokens: {target}", detail)
    if tokens == _TOKENS and target == _TOKENS:
        summary = (
            f"the identity format trains on prompt tokens: user then assistant gives targets "
            f"{target}, not {_MASKED}"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"the identity format gave tokens {tokens}, targets {target}")


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    (target,) = targets
    return _sniff_method(target.original)


SPEC = BackportSpec(
    id="megatron-lm-6682",
    title="SFT tokenizer: the identity prompt format masks system and user tokens",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.core.tokenizers.text.libraries.sft_tokenizer",),
            attribute="SFTTokenizer.tokenize_conversation",
            parameters=("self", "conversation", "return_target", "add_generation_prompt"),
            helpers=("IGNORE_INDEX",),
        ),
    ),
    # SFTTokenizer.tokenize_conversation, identity format included, arrives in 0.17, masked;
    # #4450 (83e7466c60, first released in 0.18) dropped the identity format's masking.
    target_since=Version("0.17"),
    bug_since=Version("0.18"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
)
