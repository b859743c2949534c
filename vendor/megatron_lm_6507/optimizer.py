# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     6507 (merged 2026-08-17 as 39d0896c4c8d8435cfb3bcf69197dcec378a6d05)
# path:   megatron/core/optimizer/__init__.py
# symbol: get_megatron_optimizer
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's function; not a byte copy of upstream source.
"""PR ``get_megatron_optimizer``: release each parameter's high-precision init value once
the optimizers are built.

Upstream's behaviour and nothing else. With FP8 / MXFP8 primary weights, Transformer Engine
keeps a high-precision copy of each parameter's initial value in host memory
(``get_high_precision_init_val``); the distributed optimizer reads it for the main weights
of its own shard and releases only those, so the rest stay for the whole run and host
memory grows with the model (to OOM). The pull request, as the builder's last step for the
standard optimizers, releases every parameter's value that is still held.

An epilogue rather than a copy of the 237-line builder (which drifted upstream): the
installed function runs as it is, then, where it took the path the pull request changed
(Adam or SGD, not Megatron-FSDP, not a MiMo model: those return earlier, before the new
lines), the values are released. What it returns is returned unchanged.

The installed function is the one the target module binds; where this backport is installed
there, it is the function it replaced (the applier keeps it as ``__wrapped__``).
"""

import sys

# The module that defines the function. The applier rebinds it to where it really lives.
__target_module__ = "megatron.core.optimizer"

# Module globals of the target read at call time: none but the function itself.
__reads__: tuple[str, ...] = ()

# The optimizers that reach the builder's last return (others have a builder of their own).
_STANDARD_OPTIMIZERS = ("adam", "sgd")


def _live_target():
    return sys.modules[__target_module__]


def _past_this_replacement(bound):
    """The target module's own function: ``bound`` itself, or, where it is this
    replacement, the function it replaced."""
    while getattr(bound, "__code__", None) is get_megatron_optimizer.__code__:
        bound = bound.__wrapped__
    return bound


def _is_mimo_model(model_chunk):
    try:
        from megatron.core.models.mimo.model.base import MimoModel
    except ImportError:  # a release without MiMo models
        return False
    return isinstance(model_chunk, MimoModel)


def _reached_the_last_return(config, model_chunks):
    """Whether the builder took the path that ends in the pull request's new lines."""
    if _is_mimo_model(model_chunks[0]):
        return False
    if config.optimizer not in _STANDARD_OPTIMIZERS:
        return False
    return not model_chunks[0].ddp_config.use_megatron_fsdp


def _release_high_precision_init_vals(model_chunks):
    """Clear every parameter's high-precision init value that is still held."""
    for model_chunk in model_chunks:
        for param in model_chunk.parameters():
            get_value = getattr(param, "get_high_precision_init_val", None)
            clear_value = getattr(param, "clear_high_precision_init_val", None)
            if get_value is None or clear_value is None:
                continue
            if get_value() is not None:
                clear_value()


def get_megatron_optimizer(
    config,
    model_chunks,
    config_overrides=None,
    use_gloo_process_groups=True,
    pg_collection=None,
    dump_param_to_param_group_map=None,
):
    """The installed ``get_megatron_optimizer``; on its standard path, every parameter's
    high-precision init value is released once the optimizers are built."""
    # Read in this body: a private copy of it (the sniff's) answers _live_target() itself.
    installed = _past_this_replacement(_live_target().get_megatron_optimizer)
    optimizer = installed(
        config,
        model_chunks,
        config_overrides,
        use_gloo_process_groups,
        pg_collection,
        dump_param_to_param_group_map,
    )
    if _reached_the_last_return(config, model_chunks):
        _release_high_precision_init_vals(model_chunks)
    return optimizer
