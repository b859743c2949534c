"""``backports upstream-tests``: upstream's own tests, checked out of a clone at a commit and
run stock and with the backport.

The upstream repository is built here with gitpython and holds test files written the way
upstream writes them (``tests/unit_tests/...``, a helper module the test imports, a class
``TestTop2Router``), this project's own small tests of #6114's behaviour on the installed
megatron-core 0.19.2.
"""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from backports.megatron import cli
from backports.megatron.upstream_tests import Row, verdict
from tests.test_sync_upstream import commit_files

NODE = (
    "tests/unit_tests/transformer/moe/test_routers.py::TestTop2Router::"
    "test_expert_bias_token_counts_with_padding_mask"
)
HELPER = '''\
import torch


def routing_map_for(tokens, experts):
    """Token t routed to expert t % experts."""
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool)
    for token in range(tokens):
        routing_map[token, token % experts] = True
    return routing_map
'''
TEST = """\
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # on CPU the compiled method runs eagerly

from types import SimpleNamespace

import pytest
import torch

from megatron.core.transformer.moe.router import TopKRouter
from tests.unit_tests.test_utilities import routing_map_for


class TestTop2Router:
    @pytest.mark.parametrize("with_padding_mask", [True])
    def test_expert_bias_token_counts_with_padding_mask(self, with_padding_mask):
        router = SimpleNamespace(enable_expert_bias=True, local_tokens_per_expert=torch.zeros(4))
        padding = torch.tensor([False, False, False, False, True, True])
        TopKRouter._apply_expert_bias(router, routing_map_for(6, 4), padding_mask=padding)
        assert router.local_tokens_per_expert.tolist() == [1, 1, 1, 1]

    def test_counts_without_a_mask(self):
        router = SimpleNamespace(enable_expert_bias=True, local_tokens_per_expert=torch.zeros(4))
        TopKRouter._apply_expert_bias(router, routing_map_for(4, 4))
        assert router.local_tokens_per_expert.tolist() == [1, 1, 1, 1]
"""


def test_the_verdict_needs_a_failure_on_stock_and_none_with_the_backport() -> None:
    assert verdict([Row("t", "failed", "passed")])[0] == 0
    assert verdict([Row("t", "passed", "passed")])[0] == 1  # proves nothing
    assert verdict([Row("t", "failed", "failed")])[0] == 1
    assert verdict([Row("t", "skipped", "skipped")]) == (
        1,
        "every upstream test was skipped here: they prove nothing (see the notes)",
    )
    assert verdict([Row("t", "failed", "passed"), Row("u", "skipped", "skipped")])[0] == 0
    assert verdict([Row("t", "not run", "not run")])[0] == 1


@pytest.mark.slow
def test_upstream_tests_of_6114_fail_stock_and_pass_with_the_backport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    files = {
        "tests/__init__.py": "",
        "tests/unit_tests/__init__.py": "",
        "tests/unit_tests/test_utilities.py": HELPER,
        "tests/unit_tests/transformer/moe/test_routers.py": TEST,
    }
    sha = commit_files(repo, files, "tests: expert bias counts", None)
    args = ["upstream-tests", "megatron-lm-6114", "--repo", str(tmp_path / "Megatron-LM")]
    code = cli.main([*args, "--sha", sha])
    out = capsys.readouterr().out
    assert f"{NODE}[True]  failed / passed" in out, out
    assert code == 0, out
    assert "1 test(s) fail on stock and pass with the backport" in out
    # Only the recorded node ids run: the other test in the file is not collected.
    assert "test_counts_without_a_mask" not in out


def test_a_commit_the_clone_lacks_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    commit_files(repo, {"README": "x"}, "init", None)
    args = ["upstream-tests", "megatron-lm-6114", "--repo", str(tmp_path / "Megatron-LM")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "has no commit 723db5a72790aefc02f5a0228e6607eef70c0533" in err
    assert err.count("\n") == 1
