"""Which process of a distributed job this is, and whether all of them run the same backports."""

from collections.abc import Mapping, Sequence
from typing import Any

from ..catalog import by_id, entries
from ..errors import BackportError
from ..interpreter.once_per_job import is_rank_zero
from ..kinds.install import installed
from ..model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, BackportSpec
from ..session import SESSION
from ..vendored import check_integrity, read_upstream
from .deferred import is_deferred

__all__ = [
    "deferred_backports",
    "disagreement",
    "installed_backports",
    "is_rank_zero",
    "running_backports",
    "verify_ranks",
]


def installed_backports() -> dict[str, str]:
    """Backports installed in this process: id -> sha256 of the vendored file it runs."""
    return {spec.id: _vendored_sha(spec) for spec in entries() if installed(spec.id) is not None}


def deferred_backports() -> dict[str, str]:
    """Backports waiting for their target's import here: id -> sha256 of the vendored file
    they will run (a rank that never imported the target runs it the moment it does)."""
    return {spec.id: _vendored_sha(spec) for spec in entries() if is_deferred(spec.id)}


def _vendored_sha(spec: BackportSpec) -> str:
    return check_integrity(spec.vendored, read_upstream(spec.vendored)).actual


def _mode(backport_id: str) -> str:
    installation = installed(backport_id)
    if installation is not None:
        return str(installation.mode)
    watched = SESSION.watched.get(backport_id)
    return WITH_LOCAL_CHANGES if watched is None else str(watched.mode)


def running_backports() -> dict[str, str]:
    """What each installed or deferred backport runs: id -> "<sha256 of the vendored file>
    <mode>", and the local changes in force: the same vendored file upstream-only, or with
    other local changes (another version of this package), is other code."""
    running = {}
    for backport_id, sha in {**deferred_backports(), **installed_backports()}.items():
        mode = _mode(backport_id)
        changes = (
            [] if mode == UPSTREAM_ONLY else [c.name for c in by_id(backport_id).local_changes]
        )
        running[backport_id] = f"{sha} {mode}" + (f" [{', '.join(changes)}]" if changes else "")
    return running


def _describe(backports: Mapping[str, str]) -> str:
    """ "a (1234abcd5678 upstream-only)": the short hash, and the mode where it is given."""
    return (
        ", ".join(f"{bid} ({what[:12]}{what[64:]})" for bid, what in sorted(backports.items()))
        or "none"
    )


def _rank_list(ranks: Sequence[int], noun: str = "rank") -> str:
    """[0, 1, 2, 5] -> "ranks 0-2,5"."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][-1] + 1:
            spans[-1].append(rank)
        else:
            spans.append([rank])
    text = ",".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else f"{s[0]}" for s in spans)
    return f"{noun}{'s' if len(ranks) > 1 else ''} {text}"


def disagreement(
    labels: Sequence[int], sets: Sequence[Mapping[str, str]], noun: str = "rank"
) -> str | None:
    """None when every process runs the first one's set; else which differ and what each runs.

    ``sets[i]`` is what ``installed_backports()`` returned in the process ``labels[i]``
    (a rank, or an index into a list of Ray actors).
    """
    differing = [label for label, seen in zip(labels, sets, strict=True) if seen != sets[0]]
    if not differing:
        return None
    by_set: dict[str, list[int]] = {}
    for label, seen in zip(labels, sets, strict=True):
        by_set.setdefault(_describe(seen), []).append(label)
    found = "; ".join(f"{_rank_list(ls, noun)}: {text}" for text, ls in by_set.items())
    head = f"differing from {noun} {labels[0]}: {_rank_list(differing, noun)}."
    return f"{head} Per {noun}: {found}."


def verify_ranks(group: Any = None) -> dict[str, str]:
    """Check every rank of ``group`` runs the same backports, in the same mode with the same
    local changes (``running_backports``); returns this rank's set (id -> sha256).

    Call after ``torch.distributed.init_process_group`` and after megatron's target
    modules are imported (a deferred backport installs on that import). Ranks running
    different code paths hang in a collective or diverge silently, so a difference raises
    ``BackportError`` on every rank, naming the ranks that differ from rank 0's set.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise BackportError("verify_ranks() needs torch.distributed initialised first")
    mine = installed_backports()
    gathered: list[Any] = [None] * dist.get_world_size(group)
    # Compared: the vendored code, the mode and the local changes each rank runs.
    dist.all_gather_object(gathered, running_backports(), group=group)
    ranks = [i if group is None else dist.get_global_rank(group, i) for i in range(len(gathered))]
    found = disagreement(ranks, gathered)
    if found is not None:
        raise BackportError(
            f"megatron-backports differ across ranks; {found} Ranks running different code "
            "hang or diverge; "
            "apply the same backports on every rank (same MEGATRON_BACKPORTS* variables, "
            "the same environment, `backports apply` on every node)."
        )
    return mine
