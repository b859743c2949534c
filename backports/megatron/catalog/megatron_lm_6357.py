"""NVIDIA/Megatron-LM#6357: MFSDP v1 shards gradients in units under ZeRO-2, lets TE's wgrad
fusion accumulate into ``main_grad`` under ZeRO-1, and gives a wrapped model only the hooks
its sharding strategy needs.

In megatron-core 0.19.2, ``FullyShardedDataParallel`` (upstream's
``FullyShardedDataParallelV1`` since #5865) makes transformer, MoE and Mamba layers FSDP
units only under ``optim_grads_params``: under ``optim_grads`` (ZeRO-2) the whole model is
one unit, so every gradient is allocated at once (out of memory: upstream issue #6314). And
``MegatronFSDP.all_gather_and_wait_parameters_ready`` marks every gathered parameter
``overwrite_main_grad``: under ``optim`` (ZeRO-1) Transformer Engine's gradient accumulation
fusion then overwrites ``main_grad`` on each micro-batch instead of adding to it, so
gradient accumulation silently keeps only the last micro-batch. The hooks
``MegatronFSDP._register_fsdp_hooks`` registers when a model is wrapped reduce the
gradients of ``no_shard`` and ``optim`` in backward on the last micro-batch even without
``overlap_grad_reduce`` (``start_grad_sync`` then reduces the unsharded buffer again), and
release every FSDP unit's parameters after its forward although only ZeRO-3 shards them
(with the units above, ZeRO-1/2 models get those hooks too); ``synchronize_gradient_reduce``
reduces ZeRO-2/3 gradients synchronously where it should refuse.

Carried: all of it, in four methods, each rebuilt from its installed text by a source rule.
The sniff shows each half on CPU: the units the constructor chooses, the
``overwrite_main_grad`` decision, what the installed hooks do in one forward and backward of
a two-layer model on a stand-in MegatronFSDP, and what ``synchronize_gradient_reduce`` does
without ``overlap_grad_reduce``; some halves fixed and others not is ``incompatible``.

The constructor and ``_register_fsdp_hooks`` are construction-time: a model wrapped before
the install keeps its units and its hooks (the report counts the FullyShardedDataParallel and
MegatronFSDP objects built before it). The megatron-fsdp wheel ships the same three
MegatronFSDP methods: its copy is judged and installed on its own (``copies``).
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


# --- the hooks a wrapped model gets, on a stand-in MegatronFSDP over a two-layer model -------

# The gradient buffers are sharded under these (gradients reduce-scattered as they are made;
# MegatronFSDP's constructor forces overlap_grad_reduce on for them).
_SHARDED_GRADS = ("optim_grads", "optim_grads_params")


def _hooks_seen(register: MegatronFunction, strategy: str) -> dict[str, bool]:
    """What the hooks ``register`` (``_register_fsdp_hooks``, unwrapped) makes do in one
    forward and backward on the last micro-batch, ``overlap_grad_reduce`` off but where the
    gradient is sharded: whether the FSDP unit's parameters are released after its forward
    (``resharded``), and whether the per-parameter post-backward hook and the root one (for a
    shared parameter, which only the root hook handles) reduce gradients."""
    import torch

    unit = type("Unit", (torch.nn.Linear,), {})  # the FSDP unit module
    # On the CPU, whatever the caller's default device; the caller's random stream untouched;
    # with gradients even where the caller judges under no_grad() or inference_mode().
    with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad():
        model = torch.nn.Sequential(
            unit(2, 2, device="cpu"), torch.nn.Linear(2, 1, bias=False, device="cpu")
        )
        return _run_hooks(register, strategy, unit, model)


def _run_hooks(
    register: MegatronFunction, strategy: str, unit: type, model: Any
) -> dict[str, bool]:
    import torch

    names = {parameter: name for name, parameter in model.named_parameters()}
    shared = model[1].weight
    for parameter in names:
        parameter.grad_added_to_main_grad = False
        parameter.get_main_grad = lambda p=parameter: torch.zeros_like(p)
    shared._is_shared = True
    phase = ["forward"]
    released: list[str] = []
    reduced: list[str] = []

    def release_bucket(bucket_id: int, bwd: bool, lazy: bool = False) -> None:
        released.append(phase[0])

    def reduce_gradients(params: list[Any], **kwargs: Any) -> None:
        reduced.extend(names[p] for p in params)

    group = _Unset(
        requires_grad=True,
        params=list(names),
        main_grad_buffer=_Unset(is_data_distributed=strategy in _SHARDED_GRADS),
    )
    fsdp = _Unset(
        module=model,
        data_parallel_sharding_strategy=strategy,
        ddp_config=_Unset(
            data_parallel_sharding_strategy=strategy,
            overlap_grad_reduce=strategy in _SHARDED_GRADS,
            keep_fp8_transpose_cache=True,
        ),
        fsdp_unit_modules=[unit],
        param_to_name=names,
        param_and_grad_buffer=_Unset(
            param_to_param_group=dict.fromkeys(names, 0), parameter_groups=[group]
        ),
        all_gather_pipeline=_Unset(
            release_bucket=release_bucket,
            num_buckets=1,
            bucket_can_be_released={},
            get_bucket_key=lambda bucket_id, bwd: (bucket_id, bwd),
        ),
        all_gather_and_wait_parameters_ready=lambda *args, **kwargs: None,
        grad_reduce_pipeline=_Unset(reduce_gradients=reduce_gradients, reset=lambda: None),
        dist_index=_Unset(use_hybrid_fsdp=False),
        named_modules=lambda: iter(()),
        is_last_microbatch=True,
        model_auto_sync=False,
        microbatch_count=0,
    )
    register(fsdp, model)
    output = model(torch.ones(1, 2, device="cpu"))
    phase[0] = "backward"
    output.sum().backward()
    return {
        "resharded": "forward" in released,
        "hook_reduced": any(name != "1.weight" for name in reduced),
        "root_reduced": "1.weight" in reduced,
    }


def _hooks_expected(strategy: str, fixed: bool) -> dict[str, bool]:
    if not fixed:  # every unit resharded after forward, every gradient reduced in backward
        return {"resharded": True, "hook_reduced": True, "root_reduced": True}
    reduces = strategy in _SHARDED_GRADS  # or overlap_grad_reduce, off here
    resharded = strategy == "optim_grads_params"
    return {"resharded": resharded, "hook_reduced": reduces, "root_reduced": reduces}


def _sync_seen(method: MegatronFunction, strategy: str) -> str:
    """What ``synchronize_gradient_reduce`` does without ``overlap_grad_reduce``: "reduced"
    (start_grad_sync) or "refused" (an AssertionError)."""
    done: list[str] = []
    fsdp = _Unset(
        data_parallel_sharding_strategy=strategy,
        ddp_config=_Unset(data_parallel_sharding_strategy=strategy, overlap_grad_reduce=False),
        start_grad_sync=lambda *args: done.append("reduced"),
    )
    try:
        method(fsdp)
    except AssertionError:
        return "refused"
    if done != ["reduced"]:
        raise SniffFailed(f"synchronize_gradient_reduce did {done} under {strategy}")
    return "reduced"


def _judge_hooks(target: ResolvedTarget) -> bool:
    import inspect

    register = inspect.unwrap(target.original)
    seen = {s: _hooks_seen(register, s) for s in _STRATEGIES}
    fixed = {s: _hooks_expected(s, True) for s in _STRATEGIES}
    if seen not in (fixed, {s: _hooks_expected(s, False) for s in _STRATEGIES}):
        raise SniffFailed(f"the hooks _register_fsdp_hooks made did {seen}")
    return seen == fixed


def _judge_sync(target: ResolvedTarget) -> bool:
    seen = {s: _sync_seen(target.original, s) for s in _STRATEGIES}
    fixed = {s: ("refused" if s in _SHARDED_GRADS else "reduced") for s in _STRATEGIES}
    if seen not in (fixed, dict.fromkeys(_STRATEGIES, "reduced")):
        raise SniffFailed(f"synchronize_gradient_reduce without overlap_grad_reduce: {seen}")
    return seen == fixed


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
    judged = {
        _HALVES[target.name][0]: _HALVES[target.name][1](target)
        for target in recorded_as(targets, ResolvedTarget)
    }
    detail: dict[str, Any] = {"fixed": judged}
    if all(judged.values()):
        return SniffResult(True, "; ".join(_HAS[half] for half in judged), detail)
    if not any(judged.values()):
        lacks = [_LACKS[half] for half in judged]
        return SniffResult(False, "; ".join(lacks), detail)
    raise SniffFailed(f"only part of the fix is there: {judged}")


# target name -> (the half it carries, its judge)
_HALVES: dict[str, tuple[str, Any]] = {
    "__init__": ("units", _judge_units),
    "all_gather_and_wait_parameters_ready": ("overwrite_main_grad", _judge_overwrite),
    "_register_fsdp_hooks": ("hooks", _judge_hooks),
    "synchronize_gradient_reduce": ("sync_assertion", _judge_sync),
}
_HAS = {
    "units": "FSDP units under every sharding strategy but no_shard",
    "overwrite_main_grad": "main_grad overwritten only where the gradient is sharded",
    "hooks": (
        "unsharded gradients reduced in backward only when overlapped; unit parameters "
        "released after forward only under ZeRO-3"
    ),
    "sync_assertion": "no synchronous reduction of sharded gradients",
}
_LACKS = {
    "units": (
        "ZeRO-2 (optim_grads) wraps the whole model as one FSDP unit: every gradient is "
        "allocated at once"
    ),
    "overwrite_main_grad": (
        "under ZeRO-1 (optim) TE's wgrad fusion overwrites main_grad instead of accumulating "
        "micro-batches"
    ),
    "hooks": (
        "the hooks of a wrapped model reduce no_shard/optim gradients in backward without "
        "overlap_grad_reduce (start_grad_sync reduces them again) and release FSDP unit "
        "parameters after forward under every strategy"
    ),
    "sync_assertion": (
        "synchronize_gradient_reduce reduces optim_grads/optim_grads_params gradients "
        "synchronously instead of refusing"
    ),
}


_CORE = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp"
_WHEEL = "megatron_fsdp.megatron_fsdp"
_GATHER = "MegatronFSDP.all_gather_and_wait_parameters_ready"
_HOOKS = "MegatronFSDP._register_fsdp_hooks"
_SYNC = "MegatronFSDP.synchronize_gradient_reduce"
_GATHER_PARAMETERS = ("self", "params", "prefetch", "prefetch_order", "wait_bucket_ready", "bwd")

SPEC = BackportSpec(
    id="megatron-lm-6357",
    title="MFSDP v1: units under ZeRO-2, main_grad accumulated under ZeRO-1, hooks per strategy",
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
            modules=(_CORE,),
            attribute=_GATHER,
            parameters=_GATHER_PARAMETERS,
        ),
        # Construction-time too: MegatronFSDP's constructor registers the hooks, whose
        # closures a model wrapped before the install keeps (the report counts those).
        Constructor(
            distribution="megatron-core",
            modules=(_CORE,),
            attribute=_HOOKS,
            parameters=("self", "root_module"),
            called_from="__init__",
        ),
        Target(
            distribution="megatron-core",
            modules=(_CORE,),
            attribute=_SYNC,
            parameters=("self",),
        ),
        Target(
            distribution="megatron-fsdp",
            modules=(_WHEEL,),
            attribute=_GATHER,
            parameters=_GATHER_PARAMETERS,
            replacement="megatron_fsdp_all_gather_and_wait_parameters_ready",
        ),
        Constructor(
            distribution="megatron-fsdp",
            modules=(_WHEEL,),
            attribute=_HOOKS,
            parameters=("self", "root_module"),
            replacement="megatron_fsdp_register_fsdp_hooks",
            called_from="__init__",
        ),
        Target(
            distribution="megatron-fsdp",
            modules=(_WHEEL,),
            attribute=_SYNC,
            parameters=("self",),
            replacement="megatron_fsdp_synchronize_gradient_reduce",
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
