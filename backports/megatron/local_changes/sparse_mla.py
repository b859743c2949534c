"""Local changes around #7617's ``fused_sparse_mla_absorbed``: index hygiene, lean copies.

Both work at the kernel boundary and hand the vendored function inputs that are already
what it would build itself (int32 indices padded with -1; q and k padded to 576 channels
and 16 heads, laid out as the kernel's ``[b, s, heads, 576]``), so that its own pads are
skipped and its ``contiguous()`` calls return their input. What reaches the kernel for
valid inputs is unchanged, bit for bit, whether the vendored function is the hand-written
one or upstream's text brought in by a sync.

The torch code lives in ``_sparse_mla_adapter`` and loads at install time, not when the
catalog is read: the job-start hook reads the catalog in every process.
"""

from collections.abc import Callable

from . import LocalChange


def _with_index_hygiene(inner: Callable[..., object]) -> Callable[..., object]:
    from ._sparse_mla_adapter import with_index_hygiene

    return with_index_hygiene(inner)


def _with_lean_copies(inner: Callable[..., object]) -> Callable[..., object]:
    from ._sparse_mla_adapter import with_lean_copies

    return with_lean_copies(inner)


INDEX_HYGIENE = LocalChange(
    name="index-hygiene",
    reason=(
        "the kernel treats only -1 as an empty slot and reads key 0 for other negative "
        "indices and out of bounds for indices >= sk: every index outside [0, sk) becomes "
        "-1 in the int32 copy of the indices that is made anyway (no extra pass, no sync)"
    ),
    wrap=_with_index_hygiene,
)

LEAN_COPIES = LocalChange(
    name="lean-copies",
    reason=(
        "q and k are written once, padded, straight into the kernel's [b, s, heads, 576] "
        "layout (one fused pass on CUDA) instead of pad-then-permute copies, the indices "
        "in one pass, and each gradient goes back in one copy"
    ),
    wrap=_with_lean_copies,
)
