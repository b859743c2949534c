# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:    https://github.com/NVIDIA/Megatron-LM
# pr:      5976 (merged 2026-07-30 as ce8a8a736ffae0a0d254d03042eec57cd1b4fc3c)
# path:    megatron/core/distributed/fsdp/src/megatron_fsdp/fully_shard.py
# symbol:  fully_shard_optimizer (megatron-core's copy, and megatron-fsdp's: the same text)
# origin:  no upstream text: the installed function, rebuilt at run time by the rule below
#          (see _source_rule.py), whose sha256 pins the installed text.
"""#5976: ``fully_shard_optimizer``'s state pre-initialisation no longer trains.

To give DCP state tensors to load into, Megatron-FSDP's ``fully_shard_optimizer`` sets a
zero gradient on every parameter and calls ``optimizer.step()`` once. A zero gradient does not
make a step inert: Adam(W) counts it (``step`` 1, so the first real update is bias-corrected
as a second step: about 1.34x too small with the default betas) and applies weight decay
(decoupled in AdamW: the parameters shrink; coupled in Adam: the decay enters the moments).
The pull request takes that step with the learning rate and weight decay at zero, puts the
caller's values back, and sets every ``step`` counter (per group and per parameter state)
back to zero, so the first real update is the optimizer's first step.

Rule ``inert-dcp-pre-init-step``: the one top-level ``optimizer.step()`` of the installed
function runs between ``_make_inert`` and ``_restore_and_rewind`` (a ``try``/``finally``).

The same text ships twice: in megatron-core (``megatron.core.distributed.fsdp.src.
megatron_fsdp.fully_shard``) and in the megatron-fsdp wheel (``megatron_fsdp.fully_shard``).
Each copy is rebuilt from its own installed function, with its own module's globals.
"""

import ast
import importlib
from typing import Any

from ._source_rule import SourceRule, installed_function, rebuild

RULE = "inert-dcp-pre-init-step"

# Replacement name -> the module whose fully_shard_optimizer it is rebuilt from.
_COPIES = {
    "fully_shard_optimizer": "megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard",
    "megatron_fsdp_fully_shard_optimizer": "megatron_fsdp.fully_shard",
}

# The settings of a param group that move parameters or moments on a zero gradient.
_MOVING = ("lr", "weight_decay")


def _make_inert(optimizer: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every param group's learning rate and weight decay set to zero (a tensor learning
    rate stays a tensor of its device: capturable optimizers need one); what they were."""
    import torch

    saved = []
    for group in optimizer.param_groups:
        saved.append((group, {key: group[key] for key in _MOVING if key in group}))
        if "lr" in group:
            lr = group["lr"]
            group["lr"] = torch.zeros_like(lr) if isinstance(lr, torch.Tensor) else 0.0
        if "weight_decay" in group:
            group["weight_decay"] = 0.0
    return saved


def _restore_and_rewind(
    optimizer: Any, saved: list[tuple[dict[str, Any], dict[str, Any]]]
) -> None:
    """The caller's settings back, and every step counter the inert step advanced (a
    group's, a parameter state's; a tensor in place) back to zero."""
    import torch

    for group, settings in saved:
        group.update(settings)
    for holder in (*optimizer.param_groups, *optimizer.state.values()):
        if "step" not in holder:
            continue
        if isinstance(holder["step"], torch.Tensor):
            holder["step"].zero_()
        else:
            holder["step"] = 0


_INERT_STEP = """
__backport_saved__ = __backport_make_inert__(optimizer)
try:
    optimizer.step()
finally:
    __backport_restore_and_rewind__(optimizer, __backport_saved__)
"""


def _is_pre_init_step(statement: ast.stmt) -> bool:
    """``optimizer.step()`` as a statement of its own, with no argument."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and not call.args
        and not call.keywords
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "step"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "optimizer"
    )


def _inert_pre_init_step(definition: ast.FunctionDef) -> int:
    # Top level only: the optimizer.step() the function defines for later runs stays as is.
    at = [index for index, statement in enumerate(definition.body) if _is_pre_init_step(statement)]
    for index in reversed(at):
        definition.body[index : index + 1] = ast.parse(_INERT_STEP).body
    return len(at)


# megatron-core 0.17 to 0.19.2 and megatron-fsdp 0.4 to 0.6.1 hold this very text.
RULE_FOR_BOTH = SourceRule(
    name=RULE,
    symbol="fully_shard_optimizer",
    installed_sha256="880c83da3eb547bf4f20c51341c5dd4cc583667c9f58ed409394fc9a640f2099",
    edit=_inert_pre_init_step,
    places=1,
)
_HELPERS = {
    "__backport_make_inert__": _make_inert,
    "__backport_restore_and_rewind__": _restore_and_rewind,
}

# replacement name -> (the installed function it was rebuilt from, the rebuilt function)
_BUILT: dict[str, tuple[Any, Any]] = {}


def __getattr__(name: str) -> Any:
    """The rebuilt ``fully_shard_optimizer`` of the copy ``name`` stands for, made again
    whenever the installed one changed (a reload)."""
    if name not in _COPIES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_COPIES[name])
    original = installed_function(vars(module)["fully_shard_optimizer"], module)
    built = _BUILT.get(name)
    if built is None or built[0] is not original:
        rebuilt = rebuild(original, RULE_FOR_BOTH, _HELPERS)
        # What the installed function's @experimental_api marks it with.
        rebuilt.__dict__.update(vars(original))
        built = (original, rebuilt)
        _BUILT[name] = built
    return built[1]
