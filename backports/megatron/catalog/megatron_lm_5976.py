"""NVIDIA/Megatron-LM#5976: Megatron-FSDP's optimizer state pre-initialisation trains.

``fully_shard_optimizer`` gives every parameter a zero gradient and calls ``optimizer.step()``
once so that DCP has optimizer state to load into. In megatron-core 0.17 to 0.19.2 (and the
megatron-fsdp wheel 0.4 to 0.6.1, which ships the same function) that step is a real one:
Adam(W) counts it and weight decay is applied, so the first real update is bias-corrected as
a second step (about 1.34x too small) and the weights shrink before training starts.
Training silently follows another trajectory; nothing raises.

One fix, two distributions: megatron-core vendors Megatron-FSDP under
``megatron.core.distributed.fsdp.src.megatron_fsdp`` and megatron-fsdp ships it as
``megatron_fsdp``. Each copy is judged (its version, its installed text, the sniff on it) and
installed on its own (``copies``): a job with only megatron-core gets megatron-core's fixed,
and megatron-fsdp's copy is judged only where that wheel is installed.
"""

from collections.abc import Sequence
from typing import Any

from packaging.version import Version

from ..model import BackportSpec, Copy, Resolved, SniffFailed, SniffResult, Target
from ._untyped import MegatronFunction

_LR, _WEIGHT_DECAY = 1e-2, 0.1


class _StandInFSDP:
    """What ``fully_shard_optimizer`` reads of the MegatronFSDP model a parameter carries:
    gradients synchronised by the model (``model_auto_sync``), weights installed back."""

    model_auto_sync = True

    def __init__(self) -> None:
        self.installed = 0

    def finish_grad_sync(self) -> None:
        raise SniffFailed("fully_shard_optimizer synchronised gradients with model_auto_sync")

    def install_optimized_model_weights(self) -> None:
        self.installed += 1

    def zero_grad_buffer(self) -> None:
        pass


def _optimizer(fsdp: _StandInFSDP | None) -> tuple[Any, Any]:
    """A torch AdamW (lr 1e-2, weight decay 0.1) over one parameter of ones; the parameter
    carries the stand-in model where ``fsdp`` is given."""
    import torch

    parameter = torch.nn.Parameter(torch.ones(4))
    if fsdp is not None:
        parameter._megatron_fsdp_model = fsdp
    return torch.optim.AdamW([parameter], lr=_LR, weight_decay=_WEIGHT_DECAY), parameter


def _first_update(optimizer: Any, parameter: Any) -> float:
    """How far one real step with a gradient of ones moves the parameter's first entry."""
    import torch

    before = float(parameter.detach()[0])
    parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    return float(parameter.detach()[0]) - before


def _sniff_function(function: MegatronFunction) -> SniffResult:
    """Fixed iff after ``fully_shard_optimizer`` Adam's step is 0 and the parameter is
    untouched (then the first real update is AdamW's first); 0.19.2: step 1, the parameter
    shrunk by weight decay, and a first update smaller than a plain AdamW's."""
    fsdp = _StandInFSDP()
    optimizer, parameter = _optimizer(fsdp)
    returned = function(optimizer, preproc_state_dict_for_dcp_ckpt=False)
    if returned is not optimizer:
        raise SniffFailed("fully_shard_optimizer did not return the optimizer it was given")
    group = optimizer.param_groups[0]
    if (group["lr"], group["weight_decay"]) != (_LR, _WEIGHT_DECAY):
        raise SniffFailed(f"lr and weight decay left at {group['lr']}, {group['weight_decay']}")
    state = optimizer.state.get(parameter, {})
    if "step" not in state:
        raise SniffFailed("fully_shard_optimizer built no optimizer state to load into")
    step = float(state["step"])
    moved = float(parameter.detach().sub(1.0).abs().max())
    reference, reference_parameter = _optimizer(None)
    update = _first_update(optimizer, parameter)
    expected = _first_update(reference, reference_parameter)
    if fsdp.installed != 1:
        raise SniffFailed(f"the wrapped step installed the weights {fsdp.installed} times")
    detail = {
        "step_after_pre_init": step,
        "parameter_moved_by": moved,
        "first_update": update,
        "adamw_first_update": expected,
    }
    if step == 0 and moved == 0 and abs(update - expected) <= 1e-7:
        summary = "fully_shard_optimizer's pre-initialisation step leaves the optimizer untouched"
        return SniffResult(True, summary, detail)
    if step == 1 and moved > 0 and abs(update) < abs(expected):
        summary = (
            f"fully_shard_optimizer's pre-initialisation step trains: Adam's step is {step:g} "
            f"and weight decay moved the weights by {moved:.2g} before training; the first "
            f"real update is {expected / update:.2f}x too small"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"fully_shard_optimizer left {detail}")


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    # One copy at a time: the entry's copies are judged apart (``copies``).
    (target,) = targets
    return _sniff_function(target.original)


_PARAMETERS = ("optimizer", "preproc_state_dict_for_dcp_ckpt")

SPEC = BackportSpec(
    id="megatron-lm-5976",
    title="Megatron-FSDP: fully_shard_optimizer's state pre-initialisation step is inert",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard",),
            attribute="fully_shard_optimizer",
            parameters=_PARAMETERS,
        ),
        Target(
            distribution="megatron-fsdp",
            modules=("megatron_fsdp.fully_shard",),
            attribute="fully_shard_optimizer",
            parameters=_PARAMETERS,
            replacement="megatron_fsdp_fully_shard_optimizer",
        ),
    ),
    # fully_shard_optimizer(optimizer, preproc_state_dict_for_dcp_ckpt) is in 0.15.3 (older
    # releases not read); the pre-initialisation step arrives in 0.17 (0.16.1 has none).
    target_since=Version("0.15"),
    bug_since=Version("0.17"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    copies=(
        # megatron-fsdp 0.3 takes the optimizer (0.1, 0.2 took the model); the step: 0.4.
        Copy("megatron-fsdp", target_since=Version("0.3"), bug_since=Version("0.4")),
    ),
    sniff=_sniff,
)
