# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     6682 (merged 2026-08-22 as c50c6caf8dc0910906602d90afa68d04eb2c8330)
# path:   megatron/core/tokenizers/text/libraries/sft_tokenizer.py
# symbol: SFTTokenizer.tokenize_conversation
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's method; not a byte copy of upstream source.
"""PR ``SFTTokenizer.tokenize_conversation``: only ``default`` keeps every label.

Upstream's behaviour and nothing else. megatron-core 0.18 to 0.19.2 returns the targets
unmasked for the ``default`` and the ``identity`` prompt formats, so with ``identity`` the
system, user and tool tokens are trained on. The pull request leaves only ``default``
unmasked; ``identity`` masks prompt turns like every other format.

The names in ``__reads__`` are read from the live target module at call time.
"""

import sys

import numpy as np

# The module that defines the method. The applier rebinds it to where it really lives.
__target_module__ = "megatron.core.tokenizers.text.libraries.sft_tokenizer"

# Module globals of the target that the method reads at call time.
__reads__ = ("IGNORE_INDEX",)

_PROMPT_ROLES = ("system", "user", "tool")


def _live_target():
    return sys.modules[__target_module__]


def tokenize_conversation(self, conversation, return_target, add_generation_prompt):
    """Tokens of a system/user/assistant conversation, and with ``return_target`` the
    targets: a copy of the tokens with prompt turns (system, user, tool) and each assistant
    prefix set to ``IGNORE_INDEX``. Only the ``default`` prompt format keeps every label.
    """
    ignore_index = _live_target().IGNORE_INDEX
    config = self._prompt_config
    template = config.custom_chat_template
    # A tokenizer without a system role drops a leading system message.
    if not config.has_system_role and conversation[0]["role"] == "system":
        conversation = conversation[1:]

    tokens = self._extract_token_ids(
        self._tokenizer.apply_chat_template(
            conversation,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            return_assistant_token_mask=False,
            return_tensors="np",
            chat_template=template,
        )
    )
    if not return_target:
        return tokens

    target = tokens.copy()
    # The default format trains on every token, for simplicity; no other format does.
    if self._prompt_format == "default":
        return tokens, target

    # Tokenize turn by turn and mask the prompt turns' spans in the target.
    idx = 0
    for turn_idx, turn in enumerate(conversation):
        role = turn["role"].lower()
        if role == "assistant" and len(turn["content"]) == 0:
            raise ValueError(f"empty assistant turn in conversation: {conversation}.")
        if role == "assistant":
            assert conversation[turn_idx - 1]["role"].lower() in ("user", "tool")

        turn_tokens = self._extract_token_ids(
            self._tokenizer.apply_chat_template([turn], tokenize=True, chat_template=template)
        )
        # Only the conversation's first turn keeps its BOS.
        if config.has_bos and turn_idx > 0:
            turn_tokens = turn_tokens[1:]
        turn_len = len(turn_tokens)

        if role in _PROMPT_ROLES:
            target[idx : idx + turn_len] = ignore_index
        elif role == "assistant":
            if config.assistant_prefix_len > 0:
                target[idx : idx + config.assistant_prefix_len] = ignore_index
        else:
            raise ValueError("Wrong role value.")

        assert np.allclose(
            tokens[idx : idx + turn_len], turn_tokens
        ), f"expected turn tokens to match tokens in conversation {conversation}"
        idx += turn_len

    assert idx == len(tokens), f"mismatch in target masking the conversation {conversation}"
    return tokens, target
