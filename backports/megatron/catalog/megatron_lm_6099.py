"""NVIDIA/Megatron-LM#6099: the layer-wise optimizer counts gradients with its TP groups.

megatron-core 0.16 to 0.19.2's ``LayerWiseDistributedOptimizer`` (Muon) never tells
``count_zeros_fp32`` its tensor-parallel and expert-tensor-parallel groups, nor gives them to
its child optimizers, which filter TP replicas when they collect gradients: with expert
biases, EP > 1, TP > 1 and ETP = 1 the zero count and the gradient norm count replicas, so
clipping is off. Nothing raises.

Two targets, applied and reverted together: the constructor (it keeps the groups and hands
them to the children) and ``count_zeros`` (it passes them on). The constructor is a
construction-time target: an optimizer built before the backport is installed keeps the
0.19.2 behaviour (see the README section).
"""

import inspect
from collections.abc import Sequence
from types import SimpleNamespace

from packaging.version import Version

from ..kinds.constructor import Constructor
from ..model import (
    BackportSpec,
    Resolved,
    ResolvedTarget,
    SniffFailed,
    SniffResult,
    Target,
    recorded_as,
)
from ..private_globals import with_globals
from ._untyped import MegatronFunction, MegatronObject

# What the sniff's stand-in process-group collection holds: one object per group, so that
# the optimizer's use of each is seen by identity.
_TP, _EXPERT_TP = "tp group", "expert tp group"


def _constructed(
    owner: type, init: MegatronFunction, expert_tp: bool
) -> dict[str, list[str | None] | None]:
    """Run ``init`` (the unwrapped constructor) on a bare instance of a throwaway subclass
    whose parameter sharding does nothing (it needs process groups), with one child
    optimizer; the groups the optimizer and its child were left with."""
    groups = SimpleNamespace(tp=_TP, dp_cp=None, expt_dp=None, intra_dp_cp=None)
    if expert_tp:
        groups.expt_tp = _EXPERT_TP
    config = SimpleNamespace(overlap_param_gather=False, bf16=False)
    child = SimpleNamespace(config=config)
    sniffed = type("SniffedLayerWise", (owner,), {"shard_params": lambda self, *args: None})
    optimizer: MegatronObject = object.__new__(sniffed)
    init(optimizer, [child], config, groups)
    if optimizer.chained_optimizers != [child]:
        raise SniffFailed(f"the constructor chained {optimizer.chained_optimizers}, not its child")
    found = {
        "optimizer": [getattr(optimizer, n, None) for n in ("tp_group", "expert_tp_group")],
        "child": [getattr(child, n, None) for n in ("tp_group", "expert_tp_group")],
    }
    return {where: pair if any(pair) else None for where, pair in found.items()}


def _judge_constructor(
    owner: type, init: MegatronFunction
) -> tuple[bool, dict[str, dict[str, list[str | None] | None]]]:
    """Fixed: both groups kept and handed to the child (``expt_tp``, else ``tp``); 0.19.2:
    neither."""
    seen = {
        "with_expt_tp": _constructed(owner, init, expert_tp=True),
        "without_expt_tp": _constructed(owner, init, expert_tp=False),
    }
    fixed = {
        "with_expt_tp": {"optimizer": [_TP, _EXPERT_TP], "child": [_TP, _EXPERT_TP]},
        "without_expt_tp": {"optimizer": [_TP, _TP], "child": [_TP, _TP]},
    }
    unfixed = {case: {"optimizer": None, "child": None} for case in fixed}
    if seen not in (fixed, unfixed):
        raise SniffFailed(f"the constructor left groups {seen}")
    return seen == fixed, seen


def _judge_count_zeros(count_zeros: MegatronFunction) -> tuple[bool, dict[str, object]]:
    """``count_zeros`` on a stand-in optimizer, ``count_zeros_fp32`` recorded in a private
    copy of its globals (the real one allocates on CUDA): which groups it was given."""
    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def count_zeros_fp32(*args: object, **kwargs: object) -> float:
        calls.append((args, kwargs))
        return 0.0

    params = ["p0", "p1"]
    optimizer = SimpleNamespace(
        chained_optimizers=[SimpleNamespace(get_parameters=lambda: list(params))],
        config=SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False),
        tp_group=_TP,
        expert_tp_group=_EXPERT_TP,
    )
    with_globals(count_zeros, {"count_zeros_fp32": count_zeros_fp32})(optimizer)
    if len(calls) != 1:
        raise SniffFailed(f"count_zeros called count_zeros_fp32 {len(calls)} times")
    args, kwargs = calls[0]
    if args != (params,) or kwargs.get("grad_stats_parallel_group", 0) is not None:
        raise SniffFailed(f"count_zeros_fp32 got {args}, {kwargs}")
    groups = [kwargs.get(name) for name in ("tp_group", "expert_tp_group")]
    if groups not in ([_TP, _EXPERT_TP], [None, None]):
        raise SniffFailed(f"count_zeros_fp32 got groups {groups}")
    return groups == [_TP, _EXPERT_TP], {"count_zeros_fp32_groups": groups}


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Fixed iff the constructor keeps and hands on both groups and ``count_zeros`` passes
    them; needed iff neither does; one without the other is neither release (incompatible)."""
    init, count_zeros = recorded_as(targets, ResolvedTarget)
    owner = init.owner
    if not isinstance(owner, type):
        raise SniffFailed(f"{init.attribute} is not a method of a class: {owner!r}")
    constructor_fixed, built = _judge_constructor(owner, inspect.unwrap(init.original))
    count_fixed, counted = _judge_count_zeros(inspect.unwrap(count_zeros.original))
    detail = {"constructor": built, "count_zeros": counted}
    if constructor_fixed and count_fixed:
        summary = (
            "the layer-wise optimizer keeps its TP / expert-TP groups, hands them to its "
            "children and passes them to count_zeros_fp32"
        )
        return SniffResult(True, summary, detail)
    if not constructor_fixed and not count_fixed:
        summary = (
            "the layer-wise optimizer never gives count_zeros_fp32 or its children the TP / "
            "expert-TP groups: with expert biases under EP > 1, TP > 1, ETP = 1 the zero "
            "count and grad norm count TP replicas"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(
        f"only one half is fixed: constructor {constructor_fixed}, count_zeros {count_fixed}"
    )


_MODULE = "megatron.core.optimizer.layer_wise_optimizer"

SPEC = BackportSpec(
    id="megatron-lm-6099",
    title="Layer-wise optimizer (Muon): TP and expert-TP groups for zero counts and grad norms",
    targets=(
        # Construction-time: reaches only optimizers built after the install.
        Constructor(
            distribution="megatron-core",
            modules=(_MODULE,),
            attribute="LayerWiseDistributedOptimizer.__init__",
            parameters=(
                "self",
                "optimizers",
                "config",
                "pg_collection",
                "init_state_fn_list",
                "model_chunks",
            ),
            replacement="layer_wise_optimizer_init",  # a module's own __init__ is taken
        ),
        Target(
            distribution="megatron-core",
            modules=(_MODULE,),
            attribute="LayerWiseDistributedOptimizer.count_zeros",
            parameters=("self",),
            helpers=("count_zeros_fp32",),
            # @torch.no_grad() (a bare torch.no_grad decorates as well).
            decorator="torch:no_grad",
        ),
    ),
    # The layer-wise optimizer arrives in 0.16 (its constructor takes model_chunks from 0.18).
    target_since=Version("0.16"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
)
