"""verify_ranks in one process (a world of one); two torchrun ranks: test_job_start.py."""

import pytest
import torch.distributed as dist

from backports.megatron import BackportError, apply, verify_ranks
from backports.megatron.ranks import _rank_list, installed_backports
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


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([1], "rank 1"), ([0, 1, 2, 5], "ranks 0-2,5"), ([3, 4, 7, 8, 9], "ranks 3-4,7-9")],
)
def test_rank_list(ranks, text):
    assert _rank_list(ranks) == text
