"""Say a thing once per job, not once per process.

A job is many interpreters: torchrun ranks, and the processes each rank starts (DataLoader
workers, ``multiprocessing`` spawn children), each running the start-up hook. A notice
printed by each of them buries the one that matters, so a notice is said only

- by rank 0 (``RANK`` / ``LOCAL_RANK`` unset or 0; the other ranks log at DEBUG), and
- once along a line of processes: a process that says ``key`` records it in its own
  environment (``MEGATRON_BACKPORTS_SAID``), which the children it starts afterwards
  inherit, so they stay quiet about that key.

Only ``os``: the start-up hook reports its own failures through here, even when the rest
of the package cannot be imported.
"""

import os

SAID = "MEGATRON_BACKPORTS_SAID"  # comma-separated keys this process or an ancestor said
_SEPARATOR = ","


def is_rank_zero() -> bool:
    """False when torchrun/SLURM-style ``RANK`` or ``LOCAL_RANK`` is set and non-zero.

    Read before ``torch.distributed`` exists, so only the environment can tell; a value
    that is not a number counts as rank 0 (better a duplicate notice than none).
    """
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value.lstrip("-").isdigit() and int(value) != 0:
            return False
    return True


def _said() -> list[str]:
    return [key for key in os.environ.get(SAID, "").split(_SEPARATOR) if key]


def _clean(key: str) -> str:
    return key.replace(_SEPARATOR, "%2C")


def may_say(key: str) -> bool:
    """Whether this process should say ``key`` now (rank 0, not said by it or a parent),
    without recording it: ``record`` it once it was really shown."""
    return is_rank_zero() and _clean(key) not in _said()


def record(key: str) -> None:
    """Note ``key`` as said, for this process and the children it starts afterwards."""
    said, key = _said(), _clean(key)
    if key not in said:
        os.environ[SAID] = _SEPARATOR.join([*said, key])


def claim(key: str) -> bool:
    """Whether this process should say ``key`` now: rank 0, and neither it nor a parent
    process said it yet. A True answer records ``key`` for the children started later."""
    if not is_rank_zero():
        return False
    said, key = _said(), _clean(key)
    if key in said:
        return False
    os.environ[SAID] = _SEPARATOR.join([*said, key])
    return True


def release(prefix: str) -> None:
    """Forget the keys that start with ``prefix`` (a later decision may be said again)."""
    kept = [key for key in _said() if not key.startswith(_clean(prefix))]
    if kept:
        os.environ[SAID] = _SEPARATOR.join(kept)
    else:
        os.environ.pop(SAID, None)
