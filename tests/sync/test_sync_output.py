"""What a sync writes: the vendored function with live reads, its header and
UPSTREAM.toml, the diff, a dry run, a second sync, the fix text recorded at the merge.

The upstream each test builds: tests/sync/upstreams.py; the fixtures (the tool run in this
process): tests/sync/conftest.py.
"""

from __future__ import annotations

import datetime
import hashlib
import stat
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import git
import pytest
import torch

from backports.megatron.catalog import MEGATRON_LM_7617
from backports.megatron.sync import verify as sync_verify
from tests.paths import ROOT
from tests.sync.upstreams import (
    BACKPORT,
    FIXED_FUNCTION,
    FIXED_LIVE,
    OLD_PATH,
    READS,
    Tool,
    Upstream,
    folder_digest,
    fork_head,
    load_module,
    manifest,
    snapshot,
    sync_args,
    sync_pr_head,
    vendored_text,
)

pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")


def test_sync_writes_the_upstream_function_with_live_reads(tool: Tool, upstream: Upstream) -> None:
    run = sync_pr_head(tool, upstream)
    assert run.code == 0, run.err
    text = vendored_text(upstream.path.parent / "vendor")
    # Byte for byte upstream's function (comments, blank lines, docstring and strings that
    # mention the same names included), with only the global reads made live.
    assert text.endswith("\n\n\n" + FIXED_LIVE)
    compile(text, "tilelang_dsa.py", "exec", dont_inherit=True)
    assert "from typing import Optional\nimport torch\nimport torch.nn.functional as F\n" in text
    assert "F.pad(" in text and "_live_target().F" not in text  # an import, repeated


def test_header_names_repo_pr_sha_path_and_symbol(tool: Tool, upstream: Upstream) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    head = vendored_text(upstream.path.parent / "vendor").splitlines()[:7]
    assert head == [
        "# Vendored for megatron-backports; see UPSTREAM.toml beside this file.",
        "# repo:   https://github.com/NVIDIA/Megatron-LM.git",
        "# pr:     7617",
        f"# sha:    {upstream.pr_head}",
        f"# path:   {OLD_PATH}",
        "# symbol: fused_sparse_mla_absorbed",
        "# origin: synced by backports sync: upstream's code as it is, except that the module",
    ]


def test_manifest_records_the_sync(tool: Tool, upstream: Upstream, vendor: Path) -> None:
    before = manifest(vendor)
    assert sync_pr_head(tool, upstream).code == 0
    after = manifest(vendor)
    data = (vendor / "megatron_lm_7617" / "tilelang_dsa.py").read_bytes()
    assert after["sha256"] == hashlib.sha256(data).hexdigest()
    assert after["files_sha256"] == folder_digest(vendor / "megatron_lm_7617")
    assert after["upstream_sha256"] == hashlib.sha256(FIXED_FUNCTION.encode()).hexdigest()
    assert after["origin"] == "synced"
    assert after["synced_sha"] == upstream.pr_head
    assert after["synced_path"] == OLD_PATH
    # The canonical URL stays; the local clone synced from is this machine's business.
    assert "synced_repo" not in after and str(upstream.path) not in str(after)
    assert after["synced_date"] == datetime.datetime.now(datetime.UTC).date().isoformat()
    assert after["reads"] == READS
    kept = ("id", "repo", "pr", "head_sha", "merge_sha", "path", "moved_path", "symbol", "file")
    assert {k: after.get(k) for k in kept} == {k: before.get(k) for k in kept}
    text = (vendor / "megatron_lm_7617" / "UPSTREAM.toml").read_text()
    assert text.startswith("# Provenance of the vendored code in this folder.")


def test_the_diff_is_printed(tool: Tool, upstream: Upstream) -> None:
    run = sync_pr_head(tool, upstream)
    assert run.code == 0
    assert "--- a/vendor/megatron_lm_7617/tilelang_dsa.py\n" in run.out
    assert "+++ b/vendor/megatron_lm_7617/tilelang_dsa.py\n" in run.out
    assert "-# origin: handwritten in this repository" in run.out
    assert "+# origin: synced by backports sync" in run.out
    assert '\n-origin = "handwritten"\n' in run.out and '\n+origin = "synced"\n' in run.out
    assert f"reads from the target module: {', '.join(READS)}" in run.out


def test_a_sha_off_the_pull_request_is_noted(tool: Tool, upstream: Upstream) -> None:
    args = ("--sha", upstream.moved, "--repo", str(upstream.path))
    assert tool("--backport", BACKPORT, *args, "--dry-run").code == 0  # now in the cache
    run = tool("--backport", BACKPORT, *args, "--pr", "7617", "--dry-run")
    assert run.code == 0, run.err
    assert f"note: {upstream.moved[:12]} is not on refs/pull/7617/head" in run.out
    assert "is not on refs/pull" not in sync_pr_head(tool, upstream, "--dry-run").out


def test_dry_run_prints_the_diff_and_writes_nothing(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    before = snapshot(vendor)
    run = sync_pr_head(tool, upstream, "--dry-run")
    assert run.code == 0
    assert "+++ b/vendor/megatron_lm_7617/tilelang_dsa.py" in run.out
    assert "dry run; nothing written" in run.out
    assert snapshot(vendor) == before


def test_dry_run_runs_nothing_it_fetched(
    tool: Tool, upstream: Upstream, vendor: Path, tmp_path: Path
) -> None:
    """The reviewer's step: the diff, and no line of the fetched code run (issue 33, item 4)."""
    marker = tmp_path / "fetched-code-ran"
    sha = fork_head(upstream, marker)
    before = snapshot(vendor)
    run = tool("--backport", BACKPORT, "--sha", sha, "--repo", str(upstream.path), "--dry-run")
    assert run.code == 0, run.err
    assert not marker.exists()
    assert "_ran=open(" in run.out  # the diff shows what would run
    assert f"note: {BACKPORT}: not sniffed: dry run" in run.out
    assert snapshot(vendor) == before
    # The same commit synced for real is sniffed, so its code does run (here in-process;
    # tests/sync/test_sync_child.py runs the real child).
    assert tool("--backport", BACKPORT, "--sha", sha, "--repo", str(upstream.path)).code == 0
    assert marker.exists()


@pytest.mark.parametrize(
    "report, says",
    [
        ({"fixed": True, "summary": "fixed", "sha256": "0" * 64}, "not the staged one"),
        ({"summary": "the sniff did not finish in 300 s"}, "not sniffed: the sniff did not"),
    ],
    ids=["other-bytes", "no-verdict"],
)
def test_only_the_bytes_the_sniff_proved_are_written(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    monkeypatch: pytest.MonkeyPatch,
    report: dict[str, Any],
    says: str,
) -> None:
    """A child that proved other bytes than the staged file, or gave no verdict: refused."""
    monkeypatch.setattr(sync_verify, "_sniff_in_child", lambda backport_id, path: report)
    before = snapshot(vendor)
    run = sync_pr_head(tool, upstream)
    assert run.code == 1 and says in run.err and "nothing written" in run.err, run.err
    assert snapshot(vendor) == before


def test_a_second_sync_changes_nothing(tool: Tool, upstream: Upstream, vendor: Path) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    first = snapshot(vendor)
    run = sync_pr_head(tool, upstream)
    assert run.code == 0
    assert "up to date" in run.out and "---" not in run.out
    assert snapshot(vendor) == first
    # By full SHA, without --pr, from the cache: the same bytes again.
    again = tool("--backport", BACKPORT, "--sha", upstream.pr_head, "--repo", str(upstream.path))
    assert again.code == 0 and "up to date" in again.out
    assert snapshot(vendor) == first


def test_an_old_sync_date_survives_a_sync_that_changes_nothing(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    path = vendor / "megatron_lm_7617" / "UPSTREAM.toml"
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    path.write_text(path.read_text().replace(today, "2026-01-02"))
    assert sync_pr_head(tool, upstream).code == 0
    assert manifest(vendor)["synced_date"] == "2026-01-02"


def test_synced_function_reads_the_live_target_module(
    tool: Tool, upstream: Upstream, vendor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    vendored = load_module(vendor / "megatron_lm_7617" / "tilelang_dsa.py", "synced_7617_live")
    assert vendored.__reads__ == tuple(READS)
    target = types.ModuleType("fake_tilelang_dsa")
    monkeypatch.setitem(sys.modules, target.__name__, target)
    monkeypatch.setattr(vendored, "__target_module__", target.__name__)

    class Recorder:
        def __init__(self) -> None:
            self.seen: list[tuple[int, ...]] = []

        def apply(self, q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, scale: float):
            self.seen.append((q.size(2), q.size(3), kv.size(3), idx.size(3)))
            return q.new_zeros((*q.shape[:3], 512)), None

    target.SparseMLA = first = Recorder()
    target._all_bfloat16 = lambda *tensors: True
    target._is_supported_sparse_mla_head_count = lambda heads, kv_group=1: heads == 16
    query = torch.zeros(2, 1, 3, 512, dtype=torch.bfloat16)
    key = torch.zeros(5, 1, 1, 512, dtype=torch.bfloat16)
    topk = torch.zeros(1, 2, 65, dtype=torch.int64)
    out = vendored.fused_sparse_mla_absorbed(query, key, topk, 0.5, 512)
    assert out is not None and out.shape == (2, 1, 3, 512)
    assert first.seen == [(16, 576, 576, 128)]
    # Replaced on the target after import: the vendored code sees the new objects.
    target.SparseMLA = second = Recorder()
    assert vendored.fused_sparse_mla_absorbed(query, key, topk, 0.5, 512) is not None
    assert len(first.seen) == 1 and len(second.seen) == 1
    target._all_bfloat16 = lambda *tensors: False
    assert vendored.fused_sparse_mla_absorbed(query, key, topk, 0.5, 512) is None
    target._all_bfloat16 = lambda *tensors: True
    target.SparseMLA = None
    assert vendored.fused_sparse_mla_absorbed(query, key, topk, 0.5, 512) is None


def test_a_sync_names_the_local_changes_it_kept(tool: Tool, upstream: Upstream) -> None:
    """They live outside vendor/ and wrap whatever function is vendored: one line each."""
    run = sync_pr_head(tool, upstream)
    assert run.code == 0, run.err
    kept = [line for line in run.out.splitlines() if line.startswith("kept local change")]
    declared = MEGATRON_LM_7617.local_changes  # the catalog entry, outside vendor/
    assert [change.name for change in declared] == ["index-hygiene", "lean-copies"]
    assert kept == [f"kept local change {change.name}: {change.reason}" for change in declared]
    assert "kept local change" in sync_pr_head(tool, upstream).out  # nothing new: still said


def test_the_pull_request_alone_syncs_its_head(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    """``--pr`` without ``--sha``, as --help says: refs/pull/N/head's commit."""
    run = tool("--backport", BACKPORT, "--pr", "7617", "--repo", str(upstream.path))
    assert run.code == 0, run.err
    assert manifest(vendor)["synced_sha"] == upstream.pr_head
    assert vendored_text(vendor).endswith("\n\n\n" + FIXED_LIVE)


def test_upstream_toml_keeps_its_comments_and_key_order(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    path = vendor / "megatron_lm_7617" / "UPSTREAM.toml"
    before = path.read_text()
    edited = before.replace(
        'head_sha = "3d07347181ae6d34ab7d381b586a81b39a2e6c23"',
        '# the SHAs upstream gave\nhead_sha = "3d07347181ae6d34ab7d381b586a81b39a2e6c23"',
    )
    edited = edited.replace("pr = 7617", "pr = 7617  # NVIDIA/Megatron-LM#7617")
    path.write_text(edited)
    old_keys = list(tomllib.loads(edited))
    assert sync_pr_head(tool, upstream).code == 0
    text = path.read_text()
    assert "# the SHAs upstream gave\nhead_sha = " in text
    assert "pr = 7617  # NVIDIA/Megatron-LM#7617\n" in text
    assert text.startswith(before.split("\nid = ")[0])  # the leading comment block
    new_keys = list(tomllib.loads(text))
    assert new_keys[: len(old_keys)] == old_keys  # kept in place, new keys after


def test_the_tool_is_executable() -> None:
    path = ROOT / "tools" / "sync_upstream.py"
    assert path.read_text().startswith("#!/usr/bin/env python3\n")
    assert path.stat().st_mode & stat.S_IXUSR
    if (ROOT / ".git").exists():  # the mode git records, which a fresh clone gets
        mode = git.Repo(ROOT).git.ls_files("-s", "tools/sync_upstream.py").split()[0]
        assert mode == "100755"


def test_a_sync_at_the_merge_records_the_fix_text_and_another_commit_keeps_it(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    """At the merge named in UPSTREAM.toml, the sync records each symbol's normalised
    digest (``fixed_symbols_sha256``: what the ``upstream`` verdict compares the installed
    text with); a later sync at another commit keeps the merge's record."""
    from backports.megatron.evidence.fix_text import symbol_digest

    toml = vendor / "megatron_lm_7617" / "UPSTREAM.toml"
    text = toml.read_text()
    toml.write_text(text.replace("pr = 7617\n", f'pr = 7617\nmerge_sha = "{upstream.merge}"\n', 1))
    assert tool(*sync_args(upstream)).code == 0
    data = manifest(vendor)
    source = git.Repo(upstream.path).git.show(f"{upstream.merge}:{data['synced_path']}")
    expected = symbol_digest(source, "fused_sparse_mla_absorbed")
    assert expected is not None
    assert data["fixed_symbols_sha256"] == {"fused_sparse_mla_absorbed": expected}
    args = ("--backport", BACKPORT, "--sha", upstream.pr_head, "--repo", str(upstream.path))
    assert tool(*args).code == 0
    assert manifest(vendor)["fixed_symbols_sha256"] == {"fused_sparse_mla_absorbed": expected}
