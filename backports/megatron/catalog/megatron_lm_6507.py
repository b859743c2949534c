"""NVIDIA/Megatron-LM#6507: the optimizer builder releases every high-precision init value.

With FP8 / MXFP8 primary weights (``--fp8-param-gather``), Transformer Engine keeps a
high-precision copy of each parameter's initial value in host memory; megatron-core 0.9 to
0.19.2's ``get_megatron_optimizer`` leaves every copy but those the distributed optimizer
releases for its own shard, so host memory grows with the model, to OOM on large ones.
The fix clears them all at the end of the builder's standard (Adam / SGD) path.

An epilogue on a 237-line function that is imported by name elsewhere
(``megatron.training.training``; MiMo's optimizer and ``muon`` import it lazily): the vendored
code runs the installed function and then releases; the function kind rebinds every module
that holds the original.
"""

from collections.abc import Sequence
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
from ..private_globals import with_globals
from ._untyped import MegatronFunction

_NAME = "get_megatron_optimizer"
_BUILT = "the optimizer the builder returned"


class _Parameter:
    """A parameter as Transformer Engine's FP8 primary weights carry it: a high-precision
    init value behind a getter and a clearer (or neither, as a plain parameter)."""

    def __init__(self, name: str, value: object, with_methods: bool = True) -> None:
        self.name, self.value, self.cleared = name, value, False
        if with_methods:
            self.get_high_precision_init_val = lambda: self.value
            self.clear_high_precision_init_val = self._clear

    def _clear(self) -> None:
        self.value, self.cleared = None, True


class _ProcessGroups(dict[str, object]):
    """What ``setup_process_groups_for_optimizer`` returns: every group None (size 1)."""

    def __missing__(self, key: str) -> None:
        return None


def _model_chunk(params: list[_Parameter], megatron_fsdp: bool) -> SimpleNamespace:
    return SimpleNamespace(
        parameters=lambda: list(params),
        ddp_config=SimpleNamespace(
            use_megatron_fsdp=megatron_fsdp,
            data_parallel_sharding_strategy="optim_grads_params",
            num_distributed_optimizer_instances=1,
        ),
    )


def _stubs() -> dict[str, object]:
    """The builder's helpers that need process groups or real parameters: each optimizer
    part is a marker, the chain the list of parts."""
    return {
        "ProcessGroupCollection": SimpleNamespace(
            setup_process_groups_for_optimizer=lambda *args, **kwargs: _ProcessGroups()
        ),
        "_get_param_groups_and_buffers": lambda *args, **kwargs: ([], {}),
        "_get_megatron_optimizer_based_on_param_groups": lambda **kwargs: SimpleNamespace(
            optimizer=SimpleNamespace()
        ),
        "ChainedOptimizer": lambda optimizers: _BUILT,
        "check_config_overrides_consistency": lambda *args, **kwargs: None,
        "log_single_rank": lambda *args, **kwargs: None,
    }


def _build(
    function: MegatronFunction, stock: MegatronFunction, megatron_fsdp: bool
) -> dict[str, Any]:
    """``function`` on one model chunk of three parameters (a held value, a released one, a
    plain parameter) with the stubs; which values it cleared. A replacement that reaches
    the installed function through its module finds ``stock`` there, with the same stubs."""
    params = [
        _Parameter("held", "a high-precision copy"),
        _Parameter("released", None),
        _Parameter("plain", None, with_methods=False),
    ]
    config = SimpleNamespace(
        optimizer="adam",
        overlap_param_gather_with_optimizer_step=False,
        use_precision_aware_optimizer=False,
    )
    stubs = _stubs()
    run = with_globals(function, {**stubs, _NAME: with_globals(stock, stubs)})
    returned = run(config, [_model_chunk(params, megatron_fsdp)], {}, False, None, None)
    return {
        "returned": "the chain" if returned == _BUILT else type(returned).__name__,
        "cleared": [p.name for p in params if p.cleared],
    }


def _sniff_function(function: MegatronFunction, stock: MegatronFunction) -> SniffResult:
    """Fixed iff the standard path clears the held value (and only that one); needed iff it
    clears none. Megatron-FSDP returns before the new lines: it clears none in either."""
    fsdp = _build(function, stock, megatron_fsdp=True)
    if fsdp["cleared"]:
        raise SniffFailed(f"the Megatron-FSDP path cleared {fsdp['cleared']}")
    standard = _build(function, stock, megatron_fsdp=False)
    detail = {"standard": standard, "megatron_fsdp": fsdp}
    if standard["returned"] != "the chain":
        raise SniffFailed(f"the standard path returned {standard['returned']}, not the chain")
    if standard["cleared"] == ["held"]:
        summary = "the optimizer builder releases every parameter's high-precision init value"
        return SniffResult(True, summary, detail)
    if standard["cleared"] == []:
        summary = (
            "the optimizer builder keeps every parameter's high-precision init value: with "
            "FP8/MXFP8 primary weights host memory holds a full-precision copy of the model"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"the standard path cleared {standard['cleared']}")


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    (target,) = recorded_as(targets, ResolvedTarget)
    return _sniff_function(target.original, target.held)


SPEC = BackportSpec(
    id="megatron-lm-6507",
    title="FP8/MXFP8 primary weights: the optimizer builder releases high-precision init values",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.core.optimizer",),
            attribute=_NAME,
            parameters=(
                "config",
                "model_chunks",
                "config_overrides",
                "use_gloo_process_groups",
                "pg_collection",
                "dump_param_to_param_group_map",
            ),
        ),
    ),
    # get_megatron_optimizer is in megatron.core from 0.6; the values it never releases come
    # with FP8 primary weights in 0.9 (#1669, 033d8b0de5). The signature the entry is
    # written for arrives in 0.16: on 0.9 to 0.15 the entry is incompatible.
    target_since=Version("0.6"),
    bug_since=Version("0.9"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
    # The builder's first line imports MiMo: on a fresh GPU host that first import outlasted
    # the in-process limit (tests/gpu, H100, 2026-12-06: "sniff timed out after 60 s").
    sniff_imports=("megatron.core.models.mimo.model.base",),
)
