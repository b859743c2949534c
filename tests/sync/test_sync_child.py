"""``backports sync`` sniffs the candidate in a real child interpreter (backports/megatron/sync/
verify.py): the fetched code never runs in the sync's process, nor with the caller's working
directory on its path, and what is written is the very bytes the child proved.

The other sync tests run the child's function in-process (``sniff_in_process``: the child
costs ~5 s, importing torch and megatron); here the child is real, hence ``slow``.
"""

import ast
import os
from pathlib import Path

import pytest

from backports.megatron.sync import verify
from tests.sync.upstreams import (
    BACKPORT,
    Tool,
    Upstream,
    fork_head,
    snapshot,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cache_home")]  # the real child


def test_a_sync_sniffs_the_fetched_code_in_an_isolated_child(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run from a folder holding a ``json.py`` that leaves a mark: the child imports json,
    yet takes nothing from the caller's folder, and the fork's code runs only there."""
    caller = tmp_path / "caller"
    caller.mkdir()
    planted = tmp_path / "planted-json-ran"
    (caller / "json.py").write_text(f"open(r'{planted}', 'w').close()\nraise ImportError\n")
    monkeypatch.chdir(caller)
    marker = tmp_path / "fetched-code-ran"
    sha = fork_head(upstream, marker)
    run = tool("--backport", BACKPORT, "--sha", sha, "--repo", str(upstream.path))
    assert run.code == 0, run.err
    assert f"{BACKPORT}: the sniff shows the fix at {sha}" in run.out
    pid, cwd, isolated = ast.literal_eval(marker.read_text())
    assert pid != os.getpid() and isolated == 1
    assert Path(cwd).name.startswith("backports-sync-sniff-") and not Path(cwd).exists()
    assert not planted.exists()
    written = (vendor / "megatron_lm_7617" / "tilelang_dsa.py").read_text()
    assert "_ran=open(" in written  # the very code the child proved


def test_the_child_refuses_the_commit_before_the_fix(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
) -> None:
    before = snapshot(vendor)
    run = tool("--backport", BACKPORT, "--sha", upstream.base, "--repo", str(upstream.path))
    assert run.code == 1, (run.out, run.err)
    assert "would not carry the fix; the sniff saw:" in run.err
    assert snapshot(vendor) == before


def test_the_child_says_an_entry_this_environment_lacks_cannot_be_sniffed(
    tmp_path: Path,
) -> None:
    candidate = tmp_path / "utils.py"
    candidate.write_text("def divide(a, b):\n    return a // b\n")
    sniffed = verify.sniff_candidate("acme-0000", candidate)
    assert sniffed.fixed is None and sniffed.not_here, sniffed
    assert "acme-0000 is not in this environment's catalog" in sniffed.summary


def test_a_child_that_dies_is_no_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that ends without a result line: no verdict (fixed None), its last line said."""
    script = "import sys; print('noise'); sys.exit('the child gave up')"
    monkeypatch.setattr(verify, "_CHILD", script)
    candidate = tmp_path / "x.py"
    candidate.write_text("X = 1\n")
    sniffed = verify.sniff_candidate(BACKPORT, candidate)
    assert sniffed.fixed is None and not sniffed.not_here
    assert sniffed.summary == "the sniff's interpreter ended with status 1: the child gave up"
