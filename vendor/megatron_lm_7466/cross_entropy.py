# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     7466 (open: not merged, its head commit in no mirror this project reads)
# path:   megatron/core/tensor_parallel/cross_entropy.py
# symbol: _VocabParallelCrossEntropy.forward
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's function; not a byte copy of upstream source.
"""PR ``_VocabParallelCrossEntropy.forward``: label smoothing over the whole vocabulary.

Upstream's behaviour and nothing else. With ``label_smoothing > 0`` and the vocabulary split
over tensor-parallel ranks, megatron-core (up to 0.19.2) smooths with each rank's partition
as if it were the vocabulary: the smoothing coefficient uses the partition's size, and the
mean log-probability averages the rank's own slice only. Each rank then has another loss,
and none is the loss of the whole vocabulary; the size saved for backward is the
partition's too, so the gradients are wrong as well. It also takes the log of probabilities
that may have underflowed to 0 (an infinite loss for large logit gaps).

The pull request uses the global vocabulary size (partition x group size) for the
coefficient and for backward, and the global mean log-probability: the sum of the logits
shifted by the global maximum is all-reduced over the group before they are exponentiated,
and the mean log-probability is that sum over the vocabulary size less the log of the
global normaliser (finite however small a probability is). Without label smoothing nothing
changes. The installed ``backward`` reads the size this forward saves in ``ctx``, so it is
right as it stands.

The steps the fix does not touch are megatron's own (``VocabParallelCrossEntropy``'s
helpers, read from the live module at call time).
"""

import sys

import torch

# The module that defines the class. The applier rebinds it to where it really lives.
__target_module__ = "megatron.core.tensor_parallel.cross_entropy"

# Module globals of the target read at call time.
__reads__ = (
    "VocabParallelCrossEntropy",
    "VocabUtility",
    "get_tensor_model_parallel_group",
    "get_pg_rank",
    "get_pg_size",
)


def _live_target():
    return sys.modules[__target_module__]


def _all_reduce(tensor, op, group):
    torch.distributed.all_reduce(tensor, op=op, group=group)


def _smoothed(loss, shifted_sum, sum_exp_logits, vocab_size, label_smoothing):
    """The loss against the smoothed target (NeMo's form: 1 - s on the label's log-prob,
    s on the mean log-prob, s = alpha V / (V - 1)), with the whole vocabulary's mean
    log-probability: mean(shifted logits) - log(sum of exp(shifted logits))."""
    assert 1.0 > label_smoothing > 0.0
    smoothing = label_smoothing * vocab_size / (vocab_size - 1)
    mean_log_probs = shifted_sum / vocab_size - torch.log(sum_exp_logits)
    return (1.0 - smoothing) * loss - smoothing * mean_log_probs


def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0, tp_group=None):
    """Vocab-parallel cross entropy; label smoothing over the global vocabulary."""
    live = _live_target()
    helpers = live.VocabParallelCrossEntropy
    if tp_group is None:
        tp_group = live.get_tensor_model_parallel_group()

    vocab_parallel_logits, logits_max = helpers.calculate_logits_max(vocab_parallel_logits)
    _all_reduce(logits_max, torch.distributed.ReduceOp.MAX, tp_group)

    partition_vocab_size = vocab_parallel_logits.size()[-1]
    rank = live.get_pg_rank(tp_group)
    world_size = live.get_pg_size(tp_group)
    get_vocab_range = live.VocabUtility.vocab_range_from_per_partition_vocab_size
    vocab_start_index, vocab_end_index = get_vocab_range(partition_vocab_size, rank, world_size)
    vocab_size = partition_vocab_size * world_size

    shifted_sum = None
    if label_smoothing > 0:
        # Before the helper below shifts the logits in place and exponentiates them.
        shifted_sum = (vocab_parallel_logits - logits_max.unsqueeze(dim=-1)).sum(dim=-1)
        _all_reduce(shifted_sum, torch.distributed.ReduceOp.SUM, tp_group)

    (target_mask, masked_target_1d, predicted_logits, sum_exp_logits, exp_logits) = (
        helpers.calculate_predicted_logits(
            vocab_parallel_logits, target, logits_max, vocab_start_index, vocab_end_index
        )
    )
    _all_reduce(predicted_logits, torch.distributed.ReduceOp.SUM, tp_group)
    _all_reduce(sum_exp_logits, torch.distributed.ReduceOp.SUM, tp_group)

    exp_logits, loss = helpers.calculate_cross_entropy_loss(
        exp_logits, predicted_logits, sum_exp_logits
    )
    if label_smoothing > 0:
        loss = _smoothed(loss, shifted_sum, sum_exp_logits, vocab_size, label_smoothing)

    # The global size: the installed backward smooths the gradient with it.
    ctx.label_smoothing, ctx.vocab_size = label_smoothing, vocab_size
    ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
    return loss
