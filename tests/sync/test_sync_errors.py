"""A sync that cannot be done: one clear line, a non-zero status, nothing written; a
clone that a failed or interrupted fetch leaves as it was.

The upstream each test builds: tests/sync/upstreams.py; the fixtures (the tool run in this
process): tests/sync/conftest.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gitdb import IStream

from backports.megatron.sync import commands as sync_commands
from backports.megatron.sync import fetch as sync_fetch
from tests.paths import ROOT
from tests.sync.upstreams import (
    BACKPORT,
    FIXED_FUNCTION,
    NEW_PATH,
    OLD_PATH,
    Tool,
    Upstream,
    expect_error,
    module_with,
    snapshot,
    sync_args,
    sync_pr_head,
)

pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")


@pytest.mark.parametrize("sha", ["xyz1234", "12", "abc", "-rf", "1" * 41, "HEAD", "3d07 347"])
def test_a_sha_that_is_not_hex(tool: Tool, vendor: Path, upstream: Upstream, sha: str) -> None:
    args = ("--backport", BACKPORT, f"--sha={sha}", "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, says="--sha must be 4 to 40 hex digits")


@pytest.mark.parametrize(
    "backport", ["megatron-lm-9999", "megatron_lm_7617", "../vendor", "MEGATRON-LM-7617", ""]
)
def test_an_invalid_backport(tool: Tool, vendor: Path, upstream: Upstream, backport: str) -> None:
    args = ("--backport", backport, "--sha", upstream.pr_head, "--repo", str(upstream.path))
    run = expect_error(tool, vendor, *args, says="unknown backport")
    assert "known under" in run.err and BACKPORT in run.err


@pytest.mark.parametrize("sha", ["deadbeef", "0" * 40])
def test_an_unknown_sha(tool: Tool, vendor: Path, upstream: Upstream, sha: str) -> None:
    args = ("--backport", BACKPORT, "--sha", sha, "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, says=f"no commit {sha} in {upstream.path}")


def test_a_sha_not_on_the_pull_request(tool: Tool, vendor: Path, upstream: Upstream) -> None:
    args = ("--backport", BACKPORT, "--sha", upstream.moved[:8], "--pr", "7617")
    says = f"no commit {upstream.moved[:8]} on refs/pull/7617/head of {upstream.path}"
    expect_error(tool, vendor, *args, "--repo", str(upstream.path), says=says)


def test_a_pr_commit_by_short_sha_needs_the_pr(
    tool: Tool, vendor: Path, upstream: Upstream
) -> None:
    args = ("--backport", BACKPORT, "--sha", upstream.pr_head[:7], "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, says="a commit only on a pull request needs --pr N")


def _commit_object(tree: str, parent: str, attempt: int) -> bytes:
    stamp = "1767614400 +0000"
    return (
        f"tree {tree}\nparent {parent}\nauthor A <a@example.com> {stamp}\n"
        f"committer A <a@example.com> {stamp}\n\nattempt {attempt}\n"
    ).encode()


def _git_sha(kind: str, body: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()


def make_ambiguous_prefix(upstream: Upstream) -> str:
    """Two commits on branches whose SHAs share four leading hex digits."""
    tree = upstream.repo.commit(upstream.moved).tree.hexsha
    seen: dict[str, bytes] = {}
    attempt = 0
    while True:
        body = _commit_object(tree, upstream.moved, attempt)
        prefix = _git_sha("commit", body)[:4]
        if prefix in seen:
            break
        seen[prefix] = body
        attempt += 1
    for data in (seen[prefix], body):
        upstream.repo.odb.store(IStream("commit", len(data), io.BytesIO(data)))
        upstream.repo.git.branch(f"twin-{_git_sha('commit', data)[:10]}", _git_sha("commit", data))
    return prefix


def test_an_ambiguous_short_sha(tool: Tool, vendor: Path, upstream: Upstream) -> None:
    prefix = make_ambiguous_prefix(upstream)
    args = ("--backport", BACKPORT, "--sha", prefix, "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, says=f"{prefix} is ambiguous in {upstream.path}")


def clones(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "megatron-backports" / "upstream").glob("*.git"))


# What git says about a path that is no repository, every sentence of it (git 2.x).
NOT_A_REPO = (
    "'{path}' does not appear to be a git repository. Could not read from remote "
    "repository. Please make sure you have the correct access rights and the repository "
    "exists."
)


def test_an_unreachable_repo(tool: Tool, vendor: Path, tmp_path: Path, cache_home: Path) -> None:
    nowhere = str(tmp_path / "nowhere")
    reason = NOT_A_REPO.format(path=nowhere)
    for sha in ("3d07347", "3d07347" + "0" * 33):
        args = ("--backport", BACKPORT, "--sha", sha, "--repo", nowhere)
        run = expect_error(tool, vendor, *args, says=f"cannot fetch from {nowhere}: {reason}")
        assert run.err.count("\n") == 1
    args = ("--backport", BACKPORT, "--sha", "3d07347", "--pr", "7617", "--repo", nowhere)
    says = f"cannot fetch refs/pull/7617/head from {nowhere}: {reason}"
    expect_error(tool, vendor, *args, says=says)
    assert clones(cache_home) == []  # no empty clone left behind


def test_the_script_gives_gits_whole_reason_in_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "sync_upstream.py"),
            "--backport",
            BACKPORT,
            "--pr",
            "7617",
            "--repo",
            "/nonexistent",
            "--vendor-dir",
            str(ROOT / "vendor"),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert run.returncode == 2
    reason = NOT_A_REPO.format(path="/nonexistent")
    says = f"sync_upstream.py: error: cannot fetch refs/pull/7617/head from /nonexistent: {reason}"
    assert run.stderr == says + "\n"
    assert clones(tmp_path) == []


def test_a_failed_fetch_into_an_existing_clone_keeps_it(
    tool: Tool, vendor: Path, upstream: Upstream, cache_home: Path
) -> None:
    assert sync_pr_head(tool, upstream, "--dry-run").code == 0
    (clone,) = clones(cache_home)
    args = ("--backport", BACKPORT, "--pr", "9999", "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, says="cannot fetch refs/pull/9999/head")
    assert clones(cache_home) == [clone]


def test_an_interrupted_fetch_leaves_no_empty_clone(
    tool: Tool, vendor: Path, upstream: Upstream, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(repo: Any, *refspecs: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sync_fetch, "_git_fetch", interrupted)
    says = "sync_upstream.py: error: interrupted"
    run = expect_error(tool, vendor, *sync_args(upstream), says=says, code=130)
    assert run.err.count("\n") == 1 and "nothing written" in run.err
    assert clones(cache_home) == []


def test_an_unknown_sha_keeps_the_fetched_clone(
    tool: Tool, vendor: Path, upstream: Upstream, cache_home: Path
) -> None:
    """A fetch that worked is worth keeping: the next sync needs no network for it."""
    args = ("--backport", BACKPORT, "--sha", "deadbeef", "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, says="no commit deadbeef")
    assert len(clones(cache_home)) == 1


def test_a_pull_request_that_does_not_exist(tool: Tool, vendor: Path, upstream: Upstream) -> None:
    args = ("--backport", BACKPORT, "--sha", upstream.pr_head, "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, "--pr", "9999", says="cannot fetch refs/pull/9999/head")


@pytest.mark.parametrize("repo", ["--upload-pack=touch pwned", "ext::sh -c touch% pwned"])
def test_a_repo_argument_git_would_run(tool: Tool, vendor: Path, repo: str) -> None:
    args = ("--backport", BACKPORT, "--sha", "3d07347", "--repo", repo)
    expect_error(tool, vendor, *args, says="is neither a URL nor a path")


def test_a_missing_path(tool: Tool, vendor: Path, upstream: Upstream) -> None:
    gone = upstream.commit({OLD_PATH: None, NEW_PATH: None, "README": "gone\n"}, "Drop DSA")
    args = ("--backport", BACKPORT, "--sha", gone, "--repo", str(upstream.path))
    expect_error(tool, vendor, *args, says=f"neither {OLD_PATH} nor {NEW_PATH} exists")


BROKEN_SOURCES = {
    "missing symbol": (
        module_with(FIXED_FUNCTION.replace("def fused_sparse_mla_absorbed(", "def renamed(")),
        "defines no top-level 'fused_sparse_mla_absorbed'",
    ),
    "a class": (
        module_with("class fused_sparse_mla_absorbed:\n    pass\n"),
        "'fused_sparse_mla_absorbed' in",
    ),
    "an assignment": (
        module_with("fused_sparse_mla_absorbed = _all_bfloat16\n"),
        "is bound by an ast.Assign statement, not a def",
    ),
    "does not parse": (module_with("def fused_sparse_mla_absorbed(:\n"), "does not parse"),
    "nonlocal without a binding": (
        module_with("def fused_sparse_mla_absorbed(query):\n    nonlocal heads\n"),
        "the vendored result does not compile: no binding for nonlocal 'heads'",
    ),
    "a class pattern on a module global": (
        module_with(
            "def fused_sparse_mla_absorbed(query):\n"
            "    match query:\n"
            "        case SparseMLA():\n"
            "            return None\n"
        ),
        "the vendored result does not compile",
    ),
    "a default read from the module": (
        module_with("def fused_sparse_mla_absorbed(query, kernel=SparseMLA):\n    return kernel\n"),
        "reads SparseMLA from its module when it is defined",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_SOURCES))
def test_an_unusable_source(tool: Tool, vendor: Path, upstream: Upstream, case: str) -> None:
    source, says = BROKEN_SOURCES[case]
    sha = upstream.commit({NEW_PATH: source}, f"Break it: {case}")
    args = ("--backport", BACKPORT, "--sha", sha, "--repo", str(upstream.path))
    run = expect_error(tool, vendor, *args, says=says)
    if case == "a class":
        assert "is a class, not a function" in run.err


@pytest.mark.parametrize(
    "args",
    [
        ("--check", "--sha", "3d07347"),
        ("--check", "--dry-run"),
        ("--backport", BACKPORT),
        ("--sha", "3d07347"),
        ("--backport", BACKPORT, "--rehash", "--sha", "3d07347"),
        ("--check", "--rehash"),
    ],
)
def test_usage_errors(tool: Tool, vendor: Path, args: tuple[str, ...]) -> None:
    before = snapshot(vendor)
    run = tool(*args)
    assert run.code == 2 and "usage:" in run.err
    assert snapshot(vendor) == before


@pytest.mark.parametrize(
    "error, says",
    [
        (PermissionError(13, "Permission denied"), "[Errno 13] Permission denied; nothing written"),
        (ValueError("a bug\nover two lines"), "unexpected ValueError: a bug over two lines"),
    ],
)
def test_any_other_error_is_one_line_with_status_2(
    tool: Tool,
    vendor: Path,
    upstream: Upstream,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    says: str,
) -> None:
    def fail(*args: Any) -> None:
        raise error

    monkeypatch.setattr(sync_commands, "render", fail)
    run = expect_error(tool, vendor, *sync_args(upstream), says=says)
    assert run.err == f"sync_upstream.py: error: {says}\n"


def test_a_non_positive_pr(tool: Tool, vendor: Path, upstream: Upstream) -> None:
    args = ("--backport", BACKPORT, "--sha", upstream.pr_head, "--pr", "0")
    expect_error(tool, vendor, *args, says="--pr must be a positive")
