"""NVIDIA/Megatron-LM#6357 (two halves): MFSDP v1 shards gradients in units under ZeRO-2 and
lets TE's wgrad fusion accumulate into ``main_grad`` under ZeRO-1.

In megatron-core 0.19.2, ``FullyShardedDataParallel`` (upstream's
``FullyShardedDataParallelV1`` since #5865) makes transformer, MoE and Mamba layers FSDP
units only under ``optim_grads_params``: under ``optim_grads`` (ZeRO-2) the whole model is
one unit, so every gradient is allocated at once (out of memory: upstream issue #6314). And
``MegatronFSDP.all_gather_and_wait_parameters_ready`` marks every gathered parameter
``overwrite_main_grad``: under ``optim`` (ZeRO-1) Transformer Engine's gradient accumulation
fusion then overwrites ``main_grad`` on each micro-batch instead of adding to it, so
gradient accumulation silently keeps only the last micro-batch.

Carried here: those two halves, the ones that can be shown without CUDA (which modules are
units, and the ``overwrite_main_grad`` decision). Not carried: the rest of the pull request,
in the hooks ``_register_fsdp_hooks`` makes when a model is wrapped (the reduce-scatter
condition of the post-backward hooks, two of them torch.compile'd, which also stops the
redundant reduction of unsharded buffers without ``overlap_grad_reduce``; the post-forward
reshard hook registered only under ZeRO-3) and ``synchronize_gradient_reduce``'s assertion:
they need a wrapped model on GPUs to be shown.

The constructor is construction-time: a model wrapped before the install keeps its units
(the report counts them). The megatron-fsdp wheel ships the same
``all_gather_and_wait_parameters_ready``: its copy is judged and installed on its own
(``copies``).
"""

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from packaging.version import Version

from ..kinds.constructor import Constructor
from ..model import (
    BackportSpec,
    Copy,
    Resolved,
    ResolvedTarget,
    SniffFailed,
    SniffResult,
    Target,
    recorded_as,
)
from ..private_globals import with_globals
from ._untyped import MegatronFunction

_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


class _Unset(SimpleNamespace):
    """A config stand-in: what it was not given reads as None (off)."""

    def __getattr__(self, name: str) -> None:
        return None


# What the stand-in MegatronFSDP raises once it has the unit modules: the constructor goes
# no further (the rest needs process groups and CUDA).
_CHOSEN = SniffFailed("the constructor reached MegatronFSDP (the sniff stops it there)")


def _units(owner: type, init: MegatronFunction, strategy: str) -> list[str]:
    """The FSDP unit modules ``init`` (the unwrapped constructor) chooses under ``strategy``
    when it is given none, on a bare instance of a throwaway subclass with no process group
    (its dist index and TP annotation do nothing), up to the MegatronFSDP it would build."""

    chosen: list[Any] = []

    def megatron_fsdp(**kwargs: Any) -> None:
        chosen.append(kwargs["fsdp_unit_modules"])
        raise _CHOSEN

    overrides = {
        "HAVE_MEGATRON_FSDP": True,
        "has_config_logger_enabled": lambda config: False,
        "log_single_rank": lambda *args, **kwargs: None,
        "MixedPrecisionPolicy": lambda **kwargs: None,
        "MegatronFSDP": megatron_fsdp,
    }
    sniffed = type(
        "SniffedFullyShardedDataParallel",
        (owner,),
        {
            # A torch Module never initialised: attributes go to the instance as they are.
            "__setattr__": object.__setattr__,
            "_init_dist_index": lambda self, pg_collection: None,
            "_annotate_tensor_parallelism": lambda self, module: None,
            "_fix_tensor_parallel_attributes": lambda self, module: None,  # 0.17's name
            "_fine_grained_recurse_module_types": lambda self, *args: None,
        },
    )
    instance: Any = object.__new__(sniffed)
    ddp_config = _Unset(data_parallel_sharding_strategy=strategy, bucket_size=None)
    try:
        with_globals(init, overrides)(instance, _Unset(), ddp_config, None, device="cpu")
    except SniffFailed as stopped:
        if stopped is not _CHOSEN:
            raise
        # Its traceback holds the constructor's frame, hence the bare instance: dropped,
        # or the instance would count as a model wrapped before the install.
        stopped.with_traceback(None)
    if len(chosen) != 1:
        raise SniffFailed("the constructor never built its MegatronFSDP")
    return [getattr(unit, "__name__", repr(unit)) for unit in chosen[0]]


def _overwrites(method: MegatronFunction, strategy: str) -> bool | None:
    """``overwrite_main_grad`` of a parameter ``method`` gathered under ``strategy`` (None:
    not set), on a stand-in MegatronFSDP whose all-gather does nothing."""
    fsdp = _Unset(
        data_parallel_sharding_strategy=strategy,
        all_gather_pipeline=SimpleNamespace(all_gather_params=lambda **kwargs: None),
        dist_index=SimpleNamespace(use_hybrid_fsdp=False),
        ddp_config=_Unset(),
        microbatch_count=0,
        model_auto_sync=False,
    )
    parameter = SimpleNamespace()
    method(fsdp, [parameter], wait_bucket_ready=False)
    value = getattr(parameter, "overwrite_main_grad", None)
    return None if value is None else bool(value)


_FIXED_OVERWRITE = {
    "no_shard": None,
    "optim": False,
    "optim_grads": True,
    "optim_grads_params": True,
}
_STOCK_OVERWRITE = {
    "no_shard": None,
    "optim": True,
    "optim_grads": True,
    "optim_grads_params": True,
}


def _judge_units(target: ResolvedTarget) -> bool:
    owner = target.owner
    if not isinstance(owner, type):
        raise SniffFailed(f"{target.attribute} is not a method of a class: {owner!r}")
    import inspect

    units = {s: _units(owner, inspect.unwrap(target.original), s) for s in _STRATEGIES}
    # The layers ZeRO-3 wraps (0.18 wraps TransformerLayer alone; 0.19 adds MoE and Mamba).
    layers = units["optim_grads_params"]
    fixed = {s: ([] if s == "no_shard" else layers) for s in _STRATEGIES}
    stock = {s: (layers if s == "optim_grads_params" else []) for s in _STRATEGIES}
    if not layers or units not in (fixed, stock):
        raise SniffFailed(f"the constructor chose units {units}")
    return units == fixed


def _judge_overwrite(target: ResolvedTarget) -> bool:
    seen = {s: _overwrites(target.original, s) for s in _STRATEGIES}
    if seen not in (_FIXED_OVERWRITE, _STOCK_OVERWRITE):
        raise SniffFailed(f"all_gather_and_wait_parameters_ready set overwrite_main_grad {seen}")
    return seen == _FIXED_OVERWRITE


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Per copy: megatron-core's (the constructor and the method: both fixed, or neither,
    else incompatible) or megatron-fsdp's (the method)."""
    judged: dict[str, bool] = {}
    for target in recorded_as(targets, ResolvedTarget):
        if target.name == "__init__":
            judged["units"] = _judge_units(target)
        else:
            judged["overwrite_main_grad"] = _judge_overwrite(target)
    detail: dict[str, Any] = {"fixed": judged}
    if all(judged.values()):
        summary = (
            "FSDP units under every sharding strategy but no_shard; main_grad overwritten "
            "only where the gradient is sharded"
        )
        return SniffResult(True, summary, detail)
    if not any(judged.values()):
        lacks = []
        if "units" in judged:
            lacks.append(
                "ZeRO-2 (optim_grads) wraps the whole model as one FSDP unit: every gradient "
                "is allocated at once"
            )
        lacks.append(
            "under ZeRO-1 (optim) TE's wgrad fusion overwrites main_grad instead of "
            "accumulating micro-batches"
        )
        return SniffResult(False, "; ".join(lacks), detail)
    raise SniffFailed(f"only part of the fix is there: {judged}")


_GATHER = "MegatronFSDP.all_gather_and_wait_parameters_ready"
_GATHER_PARAMETERS = ("self", "params", "prefetch", "prefetch_order", "wait_bucket_ready", "bwd")

SPEC = BackportSpec(
    id="megatron-lm-6357",
    title="MFSDP v1: FSDP units under ZeRO-2, main_grad accumulated under ZeRO-1 (partial)",
    targets=(
        # Construction-time: reaches only models wrapped after the install. Upstream's main
        # calls the class FullyShardedDataParallelV1 (#5865): UPSTREAM.toml records the name.
        Constructor(
            distribution="megatron-core",
            modules=("megatron.core.distributed.fsdp.mcore_fsdp_adapter",),
            attribute="FullyShardedDataParallel.__init__",
            parameters=(
                "self",
                "config",
                "ddp_config",
                "module",
                "fsdp_unit_modules",
                "disable_bucketing",
                "device",
                "pg_collection",
            ),
            replacement="fully_sharded_data_parallel_init",  # a module's own __init__ is taken
            # Upstream's main (#5865) renamed the class: there FullyShardedDataParallel is
            # a function that picks V1 or V2.
            owner_renamed=("FullyShardedDataParallelV1",),
        ),
        Target(
            distribution="megatron-core",
            modules=("megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp",),
            attribute=_GATHER,
            parameters=_GATHER_PARAMETERS,
        ),
        Target(
            distribution="megatron-fsdp",
            modules=("megatron_fsdp.megatron_fsdp",),
            attribute=_GATHER,
            parameters=_GATHER_PARAMETERS,
            replacement="megatron_fsdp_all_gather_and_wait_parameters_ready",
        ),
    ),
    # Both halves are in 0.15.3 (older releases not read).
    target_since=Version("0.15"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    copies=(
        # megatron-fsdp 0.1.0 never sets overwrite_main_grad; 0.2.0 sets it always.
        Copy("megatron-fsdp", target_since=Version("0.1"), bug_since=Version("0.2")),
    ),
    sniff=_sniff,
)
