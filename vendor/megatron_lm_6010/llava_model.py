# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:    https://github.com/NVIDIA/Megatron-LM
# pr:      6010 (merged 2026-08-06 as 3d3323fbdafe697b6d67904a0bf9ad0dbef601ae)
# symbols: LLaVAModel.forward (megatron/core/models/multimodal/llava_model.py),
#          MimoModel._forward_all_modules and MimoModel._forward_language_module
#          (megatron/core/models/mimo/model/base.py)
# origin:  no upstream text: each method is megatron-core's installed one, rebuilt at run
#          time by the rule below (see _source_rule.py), whose sha256 pins the installed text.
"""#6010: the multimodal models hand the loss mask to the language model.

megatron-core 0.19.2's ``LLaVAModel.forward`` expands the text loss mask over the image and
sound positions (they get 0) and returns it, but calls the language model without it; so do
``MimoModel._forward_all_modules`` and ``_forward_language_module`` with the (CP-sharded)
loss mask. The language model then trains a multi-token-prediction head
(``mtp_num_layers > 0``) on every position, modality placeholders included. The pull request
passes ``loss_mask=`` to each of those four calls, and nothing else.

Rule ``loss-mask-to-language-model``: every ``self.language_model(...)`` call in the three
methods gets ``loss_mask=<the method's loss mask>`` (``new_loss_mask`` in LLaVA, the sharded
``loss_mask`` in MiMo) after its ``labels=``. The attributes of this module with the methods'
names are the rebuilt methods, made on first use from the methods as installed.
"""

import ast
import importlib
from collections.abc import Callable
from typing import Any

from ._source_rule import SourceRule, installed_function, rebuild

# The module that defines the first target; the applier rebinds it where LLaVAModel lives.
__target_module__ = "megatron.core.models.multimodal.llava_model"
_MIMO_MODULE = "megatron.core.models.mimo.model.base"

RULE = "loss-mask-to-language-model"


def _is_language_model_call(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "language_model"
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    )


def _hand_the_loss_mask(mask_name: str) -> Callable[[ast.FunctionDef], int]:
    """The edit: ``loss_mask=<mask_name>`` after ``labels=`` in each language-model call
    that does not pass a loss mask yet; returns how many calls it changed."""

    def edit(definition: ast.FunctionDef) -> int:
        changed = 0
        for call in [node for node in ast.walk(definition) if _is_language_model_call(node)]:
            assert isinstance(call, ast.Call)
            if any(keyword.arg == "loss_mask" for keyword in call.keywords):
                continue
            names = [keyword.arg for keyword in call.keywords]
            at = names.index("labels") + 1 if "labels" in names else len(names)
            mask = ast.Name(id=mask_name, ctx=ast.Load())
            call.keywords.insert(at, ast.keyword(arg="loss_mask", value=mask))
            changed += 1
        return changed

    return edit


# attribute -> (its module, its class, the rule that rebuilds it). The sha256 is that of
# megatron-core 0.19.2's definition (identical to the pull request's base).
_RULES: dict[str, tuple[str | None, str, SourceRule]] = {
    "forward": (
        None,  # __target_module__, read when used
        "LLaVAModel",
        SourceRule(
            name=RULE,
            symbol="LLaVAModel.forward",
            installed_sha256="46214a6391988310fecd7de66dccda3c41d40e324cc6ef8c4c76895c0349a8ff",
            edit=_hand_the_loss_mask("new_loss_mask"),
            places=1,
        ),
    ),
    "_forward_all_modules": (
        _MIMO_MODULE,
        "MimoModel",
        SourceRule(
            name=RULE,
            symbol="MimoModel._forward_all_modules",
            installed_sha256="cba5470f36fe78a994e4f4bc89a98c1eeb7c9af448070f20eae2b6257f69b60a",
            edit=_hand_the_loss_mask("loss_mask"),
            places=1,
        ),
    ),
    "_forward_language_module": (
        _MIMO_MODULE,
        "MimoModel",
        SourceRule(
            name=RULE,
            symbol="MimoModel._forward_language_module",
            installed_sha256="ac87e5ae22fcfdf569e8106d6f31c92dc87b7a6a33fb1db506bc95511c1dd77a",
            edit=_hand_the_loss_mask("loss_mask"),
            places=2,  # the first pipeline stage's call and the later stages'
        ),
    ),
}

# attribute -> (the installed method it was rebuilt from, the rebuilt method)
_BUILT: dict[str, tuple[Any, Any]] = {}


def __getattr__(name: str) -> Any:
    """The rebuilt method ``name``, made again whenever the installed one changed (a
    reload); an ``AttributeError`` for any other name."""
    if name not in _RULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, owner_name, rule = _RULES[name]
    module = importlib.import_module(module_name or __target_module__)
    original = installed_function(vars(getattr(module, owner_name))[name], module)
    built = _BUILT.get(name)
    if built is None or built[0] is not original:
        built = (original, rebuild(original, rule))
        _BUILT[name] = built
    return built[1]
