"""Which process of a distributed job this is, from the launcher's environment."""

import os

__all__ = ["is_rank_zero"]


def is_rank_zero() -> bool:
    """False when torchrun/SLURM-style ``RANK`` or ``LOCAL_RANK`` is set and non-zero.

    Read before ``torch.distributed`` exists, so only the environment can tell; a value
    that is not a number counts as rank 0 (better a duplicate warning than none).
    """
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value.lstrip("-").isdigit() and int(value) != 0:
            return False
    return True
