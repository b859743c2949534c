"""NVIDIA/Megatron-LM#6321: ``--exit-on-missing-checkpoint`` ends the job with status 1.

megatron-core's ``megatron.training.checkpointing._load_base_checkpoint`` (0.12 to 0.19.2)
ends the job with a bare ``sys.exit()`` when ``args.exit_on_missing_checkpoint`` is set and
the load directory holds no checkpoint: exit status 0, so schedulers and CI count a job that
trained nothing as a success. The fix exits with status 1.

Outside ``megatron.core``: the wheel ships ``megatron/training``. The vendored code is an
exit-status translation around the installed function, not a copy of it. The wheel ships
``megatron/training`` from 0.17; the signature the entry is written for (with
``dp_cp_group``, ``expt_dp_group``, ``gpt_compat_layer_maps``) arrives in 0.19, so on 0.17
and 0.18, which have the bug, the entry is ``incompatible``.
"""

import tempfile
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

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
from ..private_globals import ModuleView, with_globals
from ._untyped import MegatronFunction

_NAME = "_load_base_checkpoint"
# What 0.19.2 returns when no checkpoint is found and the flag is not set.
_NOTHING_LOADED = (None, "", False, None)


def _args(exit_on_missing_checkpoint: bool) -> SimpleNamespace:
    """What the function reads of megatron's args on the way to a missing checkpoint."""
    return SimpleNamespace(
        exit_on_missing_checkpoint=exit_on_missing_checkpoint,
        non_persistent_global_ckpt_dir=None,
        non_persistent_ckpt_type=None,
        ckpt_step=None,
    )


def _private_module_state() -> dict[str, object]:
    """Globals the function would otherwise reach in the live module or the job: the
    loaded iteration it records (a module global), its prints, and torch.distributed (a
    barrier would wait for the job's other ranks)."""
    import torch

    recorded: list[object] = []
    return {
        "set_loaded_iteration": recorded.append,
        "get_loaded_iteration": lambda: recorded[-1] if recorded else None,
        "print_rank_0": lambda *args, **kwargs: None,
        "torch": ModuleView(
            lambda: torch, {"distributed": SimpleNamespace(is_initialized=lambda: False)}
        ),
    }


def _run(function: MegatronFunction, stock: MegatronFunction, exit_flag: bool) -> object:
    """``function`` on an empty load directory with private module state; what it returned,
    or ``("SystemExit", code)``. A replacement that reaches the installed function through
    its module finds ``stock`` there, with the same private state."""
    state = _private_module_state()
    overrides = {**state, _NAME: with_globals(stock, state)}
    with tempfile.TemporaryDirectory(prefix="backports-6321-") as empty:
        try:
            return with_globals(function, overrides)(empty, _args(exit_flag))
        except SystemExit as exc:
            return ("SystemExit", exc.code)


def _sniff_function(function: MegatronFunction, stock: MegatronFunction) -> SniffResult:
    """Fixed iff a missing checkpoint under the flag exits with status 1; needed iff with
    status 0 (``sys.exit()``); the flag unset returns "nothing loaded" in both."""
    control = _run(function, stock, exit_flag=False)
    if control != _NOTHING_LOADED:
        raise SniffFailed(f"without the flag, an empty load directory gave {control!r}")
    flagged = _run(function, stock, exit_flag=True)
    detail: dict[str, Any] = {"without_flag": list(_NOTHING_LOADED), "with_flag": repr(flagged)}
    if flagged == ("SystemExit", 1):
        summary = "a missing checkpoint under --exit-on-missing-checkpoint exits with status 1"
        return SniffResult(True, summary, detail)
    if flagged in (("SystemExit", None), ("SystemExit", 0)):
        summary = (
            "--exit-on-missing-checkpoint ends the job with status 0 when no checkpoint is "
            "found: schedulers and CI count it a success"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"with the flag, an empty load directory gave {flagged!r}")


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    (target,) = recorded_as(targets, ResolvedTarget)
    stock: Callable[..., Any] = target.held
    return _sniff_function(target.original, stock)


SPEC = BackportSpec(
    id="megatron-lm-6321",
    title="--exit-on-missing-checkpoint exits with status 1, not 0",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.training.checkpointing",),
            attribute=_NAME,
            parameters=(
                "load_dir",
                "args",
                "rank0",
                "sharded_state_dict",
                "checkpointing_context",
                "dp_cp_group",
                "expt_dp_group",
                "gpt_compat_layer_maps",
            ),
            helpers=("get_loaded_iteration", "print_rank_0"),
        ),
    ),
    # The megatron-core wheel ships megatron/training from 0.17 (0.16.1's has none; 0.17.1's
    # has this function, bare sys.exit() included, as upstream's source has since before
    # 0.12). 0.17 and 0.18 take an older signature (without dp_cp_group, expt_dp_group,
    # gpt_compat_layer_maps): there the entry is incompatible, not "not needed".
    target_since=Version("0.17"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
)
