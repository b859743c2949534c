# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     5077 (merged 2026-08-21 as 32a03b77c560f5f90115d49b59e4f1809a34726f)
# path:   megatron/core/optimizer/distrib_optimizer.py
# symbol: DistributedOptimizer.sharded_param_state_fully_reshardable
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's method; not a byte copy of upstream source.
"""PR ``DistributedOptimizer.sharded_param_state_fully_reshardable``: compact offsets.

Upstream's behaviour and nothing else. ``get_parameter_state_dp_zero`` returns, per gradient
buffer, world tensors with every bucket's end padding stripped (the buckets' unpadded data
back to back), while ``param_index_map`` holds offsets into the padded buffer. megatron-core
0.15 to 0.19.2 slices the compact tensors with the padded offsets: every parameter after a
padded bucket is read too far on, and where the slice runs off the end it is zero-padded with
only a warning. The pull request subtracts the padding of all earlier buckets from each
parameter's offsets and asserts, instead of padding, that the range fits.

The names in ``__reads__`` are read from the live target module at call time.
"""

import sys
from dataclasses import replace

# The module that defines the method. The applier rebinds it to where it really lives.
__target_module__ = "megatron.core.optimizer.distrib_optimizer"

# Module globals of the target that the method reads at call time.
__reads__ = (
    "KEEP_VARS_HINT",
    "ShardedTensorFactory",
    "extract_sharded_tensors_and_factories",
    "nested_values",
)

# World-tensor entries that are not per-element optimizer state.
_NOT_PER_ELEMENT = ("step", "numel_unpadded")


def _live_target():
    return sys.modules[__target_module__]


def _padding_before_each_bucket(buffer) -> list[int]:
    """For bucket i, the end padding of buckets 0 .. i-1 (stripped from the world tensors)."""
    before = [0]
    for bucket in buffer.buckets[:-1]:
        before.append(before[-1] + bucket.grad_data.numel() - bucket.numel_unpadded)
    return before


def sharded_param_state_fully_reshardable(
    self, model_sharded_state_dict, is_loading: bool = False, metadata=None
):
    """Optimizer state in model space: one tensor per parameter and state key.

    The world tensors are gathered (or, when loading, allocated empty) by
    ``get_parameter_state_dp_zero``; each parameter's slice is reshaped to the parameter and
    described like the model's own ShardedTensor for it (same replica id), under the key
    ``optimizer.state.<state key>.<parameter key>``. With
    ``metadata['distrib_optim_fully_reshardable_mem_efficient']`` the state is gathered with
    Gloo onto DP rank 0 only, and other ranks get None when saving.
    """
    target = _live_target()
    if metadata.get("distrib_optim_fully_reshardable_mem_efficient", False):
        use_gloo_comm, return_on_all_ranks = True, False
    else:
        use_gloo_comm, return_on_all_ranks = False, True
    dp_zero_state_dict = self.get_parameter_state_dp_zero(
        use_gloo_comm=use_gloo_comm,
        empty_data=is_loading,
        return_on_all_ranks=return_on_all_ranks or is_loading,
    )

    model_sharded_state_dict, _ = target.extract_sharded_tensors_and_factories(
        model_sharded_state_dict
    )
    sharded_by_param = {sh.data: sh for sh in target.nested_values(model_sharded_state_dict)}

    if dp_zero_state_dict is None:
        return None

    model_space_state = {}
    param_idx = 0
    for gbuf_idx, gbuf_range_maps in enumerate(self.gbuf_ranges):
        buffer = self.buffers[gbuf_idx]
        assert len(gbuf_range_maps) == 1, "single dtype supported, for now."
        padding_before = _padding_before_each_bucket(buffer)
        for dtype in gbuf_range_maps:
            world_tensors = dp_zero_state_dict[gbuf_idx][dtype]
            for model_param, (start, end, bucket_id) in buffer.param_index_map.items():
                try:
                    sharded_metadata = sharded_by_param[model_param]
                except KeyError as e:
                    raise ValueError(
                        f"Model param {model_param} not in model_sharded_state_dict."
                        f" Hint: {target.KEEP_VARS_HINT}"
                    ) from e
                assert (
                    sharded_metadata.flattened_range is None
                ), f"Flattened model tensor not supported ({sharded_metadata})"
                # Offsets into the padded buffer, moved back by the padding stripped before
                # this parameter's bucket.
                compact_start = start - padding_before[bucket_id]
                compact_end = end - padding_before[bucket_id]

                tensors = {}
                for state_key, world_tensor in world_tensors.items():
                    if state_key in _NOT_PER_ELEMENT:
                        # step comes from param_groups; numel_unpadded is not saved.
                        continue
                    assert compact_end <= world_tensor.numel(), (
                        f"'{sharded_metadata.key}' range [{compact_start}, {compact_end}) runs"
                        f" past the compact world tensor ({world_tensor.numel()} elements)"
                    )
                    state_ten = world_tensor[compact_start:compact_end]
                    assert len(state_ten) == end - start, (len(state_ten), end - start)
                    state_ten = state_ten.reshape(sharded_metadata.data.shape)
                    replace_kwargs = dict(
                        key=f"optimizer.state.{state_key}.{sharded_metadata.key}",
                        data=state_ten,
                        dtype=state_ten.dtype,
                        replica_id=sharded_metadata.replica_id,
                    )
                    if isinstance(sharded_metadata, target.ShardedTensorFactory):
                        replace_kwargs.pop("dtype")
                    tensors[state_key] = replace(sharded_metadata, **replace_kwargs)
                    tensors[state_key].validate_metadata_integrity()
                model_space_state[param_idx] = tensors
                param_idx += 1

    return model_space_state
