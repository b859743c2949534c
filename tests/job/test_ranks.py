"""verify_ranks in one process (a world of one); two torchrun ranks: test_start_up.py."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from backports.megatron import BackportError, apply, revert, verify_ranks
from backports.megatron.job.ranks import _describe, _rank_list, installed_backports, is_rank_zero
from tests.conftest import BACKPORT_ID


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_needs_an_initialised_process_group():
    with pytest.raises(BackportError, match="initialised"):
        verify_ranks()


def test_returns_what_this_rank_runs(world_of_one, tilelang_dsa):
    assert verify_ranks() == {}
    apply(BACKPORT_ID)
    (sha,) = installed_backports().values()
    assert verify_ranks() == {BACKPORT_ID: sha} and len(sha) == 64


def test_group_argument(world_of_one):
    assert verify_ranks(dist.new_group([0])) == {}


# One rank of a two-rank gloo world on CPU. Rank 0 runs the backport, rank 1 does not (as
# under MEGATRON_BACKPORTS=0 there): what this rank runs is stood in, the comparison is real.
_TWO_RANKS = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from backports.megatron.job import ranks

    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    ranks.installed_backports = lambda: {"megatron-lm-7617": "ab" * 32} if rank == 0 else {}
    singletons = [dist.new_group([0]), dist.new_group([1])]  # every rank creates every group
    seen = {}
    for name, group in (("world", None), ("own", singletons[rank]), ("both", dist.group.WORLD)):
        try:
            seen[name] = {"returned": ranks.verify_ranks(group)}
        except Exception as exc:
            seen[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(seen), flush=True)
    # Drop our references to the subgroups before the teardown: with them alive, 2 of 16
    # runs aborted at interpreter exit, after destroy_process_group() had returned ("terminate
    # called without an active exception"); without them 0 of 16.
    dist.barrier()
    del singletons, group
    dist.destroy_process_group()
    """
)


def test_group_limits_the_comparison_to_its_ranks(tmp_path: Path):
    """Ranks that differ across the world agree within their own one-rank groups."""
    store = str(tmp_path / "store")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _TWO_RANKS, str(rank), store],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    seen = []
    for child in children:
        out, err = child.communicate(timeout=180)
        assert child.returncode == 0, err
        seen.append(json.loads(out.strip().splitlines()[-1]))
    for rank in (0, 1):
        for name in ("world", "both"):
            error = seen[rank][name].get("error", "")
            assert error.startswith("BackportError: "), seen
            assert "differing from rank 0: rank 1. " in error, error
            assert "rank 0: megatron-lm-7617 (abababababab local-changes" in error, error
            assert "; rank 1: none." in error, error
    assert seen[0]["own"] == {"returned": {"megatron-lm-7617": "ab" * 32}}
    assert seen[1]["own"] == {"returned": {}}


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([1], "rank 1"), ([0, 1, 2, 5], "ranks 0-2,5"), ([3, 4, 7, 8, 9], "ranks 3-4,7-9")],
)
def test_rank_list(ranks, text):
    assert _rank_list(ranks) == text


@pytest.mark.parametrize(
    ("env", "zero"),
    [
        ({}, True),
        ({"RANK": "0", "LOCAL_RANK": "0"}, True),
        ({"RANK": "3"}, False),
        ({"RANK": "0", "LOCAL_RANK": "1"}, False),
        ({"RANK": " 2 "}, False),
        ({"RANK": "not-a-number"}, True),  # better a duplicate warning than none
    ],
)
def test_is_rank_zero(monkeypatch, env, zero):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert is_rank_zero() is zero


def test_describe_names_each_backport_with_its_short_hash():
    assert _describe({}) == "none"
    assert _describe({"b": "1" * 64, "a": "2" * 64}) == "a (222222222222), b (111111111111)"


def test_a_rank_running_upstream_only_differs_from_one_with_local_changes(
    world_of_one, tilelang_dsa, monkeypatch
):
    """The same vendored file in another mode is other code: verify_ranks() says so.

    The other rank is this process under the other mode: what it sends is captured from a
    real verify_ranks() call, then handed back as rank 1's in a world of two."""
    sent: list = []
    real = dist.all_gather_object

    def capture(out, obj, group=None):
        sent.append(obj)
        real(out, obj, group=group)

    monkeypatch.setattr(dist, "all_gather_object", capture)
    apply(BACKPORT_ID, upstream_only=True)
    verify_ranks()
    revert(BACKPORT_ID)
    (upstream_rank,) = sent

    def two_ranks(out, obj, group=None):
        out[0], out[1] = obj, upstream_rank

    monkeypatch.setattr(dist, "all_gather_object", two_ranks)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    apply(BACKPORT_ID)
    with pytest.raises(BackportError, match="differing from rank 0: rank 1") as raised:
        verify_ranks()
    assert "upstream-only" in str(raised.value) and "index-hygiene" in str(raised.value)
