"""NVIDIA/Megatron-LM#5077: fully-reshardable optimizer state read at the right offsets.

In megatron-core 0.15 to 0.19.2, ``DistributedOptimizer.sharded_param_state_fully_reshardable``
slices the gathered optimizer state (bucket-end padding stripped) with offsets into the padded
gradient buffer. With more than one bucket and a padded bucket end, every parameter after
it is saved from the wrong elements, or as zeros with only a warning ("padded with zeros
which can lead to data corruption"): a ``--dist-ckpt-optim-fully-reshardable`` checkpoint
silently loses Adam moments.
"""

import logging
from collections.abc import Sequence
from types import SimpleNamespace

from packaging.version import Version

from ..model import BackportSpec, Resolved, SniffFailed, SniffResult, Target
from ..private_globals import with_globals
from ._untyped import MegatronFunction

_NUMEL = 4  # each of the two parameters
# Compact world tensors (what get_parameter_state_dp_zero returns): 8 elements, the two
# parameters back to back. exp_avg_sq differs from exp_avg so a swap shows.
_COMPACT = 2 * _NUMEL
_SECOND_FIXED = [4.0, 5.0, 6.0, 7.0]
_SECOND_UNFIXED = [0.0, 0.0, 0.0, 0.0]


def _quiet_logger() -> logging.Logger:
    # 0.19.2 warns "padded with zeros" on the probe's own stand-in: not the user's news.
    quiet = logging.Logger("backports.megatron.sniff.megatron-lm-5077")
    quiet.disabled = True
    return quiet


def _second_parameter_state(
    method: MegatronFunction, padded: bool
) -> dict[str, dict[str, list[float]]]:
    """Run ``method`` on a stand-in optimizer with one buffer of two 4-element parameters.

    ``padded``: two buckets, bucket 0 padded from 4 to 8 elements, so the second parameter
    sits at 8..12 in the buffer and at 4..8 in the compact state. Otherwise one bucket, no
    padding (every version agrees there). Returns each parameter's exp_avg and exp_avg_sq.
    """
    import torch

    from megatron.core.dist_checkpointing import ShardedTensor

    params = [torch.zeros(_NUMEL), torch.zeros(_NUMEL)]
    second_start = 2 * _NUMEL if padded else _NUMEL
    buckets = [SimpleNamespace(grad_data=torch.zeros(second_start), numel_unpadded=_NUMEL)]
    if padded:
        buckets.append(SimpleNamespace(grad_data=torch.zeros(_NUMEL), numel_unpadded=_NUMEL))
    buffer = SimpleNamespace(
        param_index_map={
            params[0]: (0, _NUMEL, 0),
            params[1]: (second_start, second_start + _NUMEL, len(buckets) - 1),
        },
        buckets=buckets,
        numel_unpadded=_COMPACT,
    )
    world = {
        "param": torch.arange(_COMPACT, dtype=torch.float32) - 10,
        "exp_avg": torch.arange(_COMPACT, dtype=torch.float32),
        "exp_avg_sq": torch.arange(_COMPACT, dtype=torch.float32) + 100,
        "numel_unpadded": _COMPACT,
    }
    calls: list[dict[str, object]] = []

    def get_parameter_state_dp_zero(**kwargs: object) -> dict[int, dict[object, dict[str, object]]]:
        calls.append(kwargs)
        return {0: {torch.float32: world}}

    optimizer = SimpleNamespace(
        gbuf_ranges=[{torch.float32: [{}] * len(buckets)}],
        buffers=[buffer],
        get_parameter_state_dp_zero=get_parameter_state_dp_zero,
    )
    model = {
        f"p{i}": ShardedTensor.from_rank_offsets(f"p{i}", param) for i, param in enumerate(params)
    }
    state = method(optimizer, model, is_loading=False, metadata={})
    if calls != [{"use_gloo_comm": False, "empty_data": False, "return_on_all_ranks": True}]:
        raise SniffFailed(f"it gathered the state with {calls}")
    if sorted(state) != [0, 1]:
        raise SniffFailed(f"it returned state for parameters {sorted(state)}")
    out: dict[str, dict[str, list[float]]] = {}
    for index, tensors in sorted(state.items()):
        if sorted(tensors) != ["exp_avg", "exp_avg_sq", "param"]:
            raise SniffFailed(f"parameter {index} has state keys {sorted(tensors)}")
        if tensors["exp_avg"].key != f"optimizer.state.exp_avg.p{index}":
            raise SniffFailed(f"parameter {index} is saved as {tensors['exp_avg'].key!r}")
        out[f"p{index}"] = {key: tensors[key].data.tolist() for key in ("exp_avg", "exp_avg_sq")}
    return out


def _sniff_method(method: MegatronFunction) -> SniffResult:
    """Fixed iff the parameter after a padded bucket gets its own moments, not zeros."""
    one_bucket = _second_parameter_state(method, padded=False)
    expected_one = {
        "p0": {"exp_avg": [0.0, 1.0, 2.0, 3.0], "exp_avg_sq": [100.0, 101.0, 102.0, 103.0]},
        "p1": {"exp_avg": _SECOND_FIXED, "exp_avg_sq": [104.0, 105.0, 106.0, 107.0]},
    }
    if one_bucket != expected_one:
        raise SniffFailed(f"one unpadded bucket gave {one_bucket}")
    two_buckets = _second_parameter_state(method, padded=True)
    if two_buckets["p0"] != expected_one["p0"]:
        raise SniffFailed(f"the first parameter of two buckets gave {two_buckets['p0']}")
    second = two_buckets["p1"]["exp_avg"]
    detail = {"one_bucket": one_bucket, "two_buckets": two_buckets}
    if two_buckets["p1"] == expected_one["p1"]:
        summary = "a parameter after a padded bucket is saved with its own optimizer state"
        return SniffResult(True, summary, detail)
    if second == _SECOND_UNFIXED and two_buckets["p1"]["exp_avg_sq"] == _SECOND_UNFIXED:
        summary = (
            "a parameter after a padded gradient bucket is read at its padded offset: "
            f"its exp_avg is saved as {second}, not {_SECOND_FIXED}"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"the parameter after a padded bucket gave {two_buckets['p1']}")


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Sniff a private copy of the method that logs nowhere."""
    (target,) = targets
    return _sniff_method(with_globals(target.original, {"logger": _quiet_logger()}))


SPEC = BackportSpec(
    id="megatron-lm-5077",
    title="Distributed optimizer: fully-reshardable checkpoints keep every bucket's state",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.core.optimizer.distrib_optimizer",),
            attribute="DistributedOptimizer.sharded_param_state_fully_reshardable",
            parameters=("self", "model_sharded_state_dict", "is_loading", "metadata"),
            helpers=(
                "KEEP_VARS_HINT",
                "ShardedTensorFactory",
                "extract_sharded_tensors_and_factories",
                "nested_values",
            ),
        ),
    ),
    # The fully_reshardable format (and its zero padding) arrives in 0.15.
    target_since=Version("0.15"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
)
