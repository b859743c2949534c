# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     6321 (merged 2026-08-08 as e04ed198bebc4c76cab4d23c03f0094327e57224)
# path:   megatron/training/checkpointing.py
# symbol: _load_base_checkpoint
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's function; not a byte copy of upstream source.
"""PR ``_load_base_checkpoint``: a missing checkpoint under ``--exit-on-missing-checkpoint``
exits with status 1.

Upstream's behaviour and nothing else. megatron-core's ``megatron.training`` (0.12 to 0.19.2)
ends the job with a bare ``sys.exit()`` when ``args.exit_on_missing_checkpoint`` is set and
no tracker file is found: exit status 0, so schedulers and CI call the job a success. The
pull request exits with status 1 there; every other path of the function is unchanged.

An exit-status translation rather than a copy of the 186-line function: the installed
function runs as it is, and the ``SystemExit`` it raises on that one path (no checkpoint:
the iteration it recorded is -1, and the flag is set) becomes ``SystemExit(1)``. Any other
exit (a checkpoint that cannot be read exits 0 too, which the pull request leaves alone) and
every return pass through unchanged.

The installed function is the one the target module binds; where this backport is installed
there, it is the function it replaced (the applier keeps it as ``__wrapped__``).
"""

import sys

# The module that defines the function. The applier rebinds it to where it really lives.
__target_module__ = "megatron.training.checkpointing"

# Module globals of the target read at call time.
__reads__ = ("get_loaded_iteration", "print_rank_0")

# The iteration the function records when it found no checkpoint to load.
_NO_CHECKPOINT = -1


def _live_target():
    return sys.modules[__target_module__]


def _past_this_replacement(bound):
    """The target module's own function: ``bound`` itself, or, where it is this
    replacement, the function it replaced."""
    while getattr(bound, "__code__", None) is _load_base_checkpoint.__code__:
        bound = bound.__wrapped__
    return bound


def _load_base_checkpoint(
    load_dir,
    args,
    rank0=False,
    sharded_state_dict=None,
    checkpointing_context=None,
    dp_cp_group=None,
    expt_dp_group=None,
    gpt_compat_layer_maps=None,
):
    """The installed ``_load_base_checkpoint``; its exit for a missing checkpoint under
    ``--exit-on-missing-checkpoint`` has status 1."""
    # Read in this body: a private copy of it (the sniff's) answers _live_target() itself.
    installed = _past_this_replacement(_live_target()._load_base_checkpoint)
    try:
        return installed(
            load_dir,
            args,
            rank0,
            sharded_state_dict,
            checkpointing_context,
            dp_cp_group,
            expt_dp_group,
            gpt_compat_layer_maps,
        )
    except SystemExit as exc:
        missing = _live_target().get_loaded_iteration() == _NO_CHECKPOINT
        if exc.code not in (None, 0) or not missing or not args.exit_on_missing_checkpoint:
            raise
        _live_target().print_rank_0(
            f">> no checkpoint found under load directory '{load_dir}' and "
            "'--exit-on-missing-checkpoint' is set: exiting with status 1. <<"
        )
        # Non-zero, so that schedulers and CI count the job as failed.
        raise SystemExit(1) from None
