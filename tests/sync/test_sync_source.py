"""Where a sync takes the source from: the planned move past a forwarder, the old path
while it still defines the function, a file URL and the cache clone, git without a shell.

The upstream each test builds: tests/sync/upstreams.py; the fixtures (the tool run in this
process): tests/sync/conftest.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import git
import pytest

from tests.sync.upstreams import (
    BACKPORT,
    NEW_PATH,
    OLD_MODULE,
    OLD_PATH,
    Tool,
    Upstream,
    manifest,
    snapshot,
    sync_pr_head,
    vendored_text,
)

pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")


def test_follows_the_planned_move_past_a_forwarder(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    run = tool("--backport", BACKPORT, "--sha", upstream.moved[:9], "--repo", str(upstream.path))
    assert run.code == 0, run.err
    assert f"note: {OLD_PATH} does not define fused_sparse_mla_absorbed (a forwarder)" in run.out
    assert f"reading the planned new location {NEW_PATH}" in run.out
    assert manifest(vendor)["synced_path"] == NEW_PATH
    assert f"# path:   {NEW_PATH}\n" in vendored_text(vendor)
    # The default target stays where installed releases define the function.
    assert f'__target_module__ = "{OLD_MODULE}"' in vendored_text(vendor)


def test_follows_the_planned_move_when_the_old_path_is_gone(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    gone = upstream.commit({OLD_PATH: None}, "Drop the forwarder")
    run = tool("--backport", BACKPORT, "--sha", gone, "--repo", str(upstream.path))
    assert run.code == 0, run.err
    assert f"note: {OLD_PATH} is gone at {gone[:12]}" in run.out
    assert manifest(vendor)["synced_path"] == NEW_PATH


def test_reads_the_old_path_while_it_still_defines_the_function(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    run = tool("--backport", BACKPORT, "--sha", upstream.merge[:8], "--repo", str(upstream.path))
    assert run.code == 0, run.err
    assert "note:" not in run.out
    assert manifest(vendor)["synced_path"] == OLD_PATH


def test_file_url_and_the_cache_clone(
    tool: Tool, upstream: Upstream, cache_home: Path, vendor: Path
) -> None:
    url = upstream.path.as_uri()
    run = tool("--backport", BACKPORT, "--sha", upstream.merge, "--repo", url)
    assert run.code == 0, run.err
    assert "synced_repo" not in manifest(vendor)
    clones = list((cache_home / "megatron-backports" / "upstream").glob("Megatron-LM-*.git"))
    assert len(clones) == 1 and git.Repo(clones[0]).bare
    assert not (cache_home.parent / "home").exists()


def test_a_full_sha_already_cached_needs_no_network(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    first = snapshot(vendor)
    shutil.rmtree(upstream.path)  # the "network" is gone
    run = tool("--backport", BACKPORT, "--sha", upstream.pr_head, "--repo", str(upstream.path))
    assert run.code == 0, run.err
    assert snapshot(vendor) == first


def test_git_runs_without_a_shell(
    tool: Tool, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []
    real = subprocess.Popen.__init__

    def popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        calls.append((args, kwargs))
        real(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    assert sync_pr_head(tool, upstream).code == 0
    assert calls
    assert all(not kwargs.get("shell") and isinstance(args, list) for args, kwargs in calls)
    assert all(Path(args[0]).name == "git" for args, _ in calls)
