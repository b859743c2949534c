"""tools/sync_upstream.py (``backports sync``) against upstream repositories each test builds
with gitpython.

Every upstream here is written by the test, not copied from Megatron-LM: a base commit with
an unfixed ``tilelang_dsa.py``, the pull request's head commit with the fix (reachable only
through ``refs/pull/7617/head``, as after a squash-merge), the squash-merge on ``main``,
and a later commit that moves the module under ``megatron/core/ops/`` and leaves a PEP 562
forwarder at the old path. The fix is written the way the pull request writes it (F.pad,
``permute(1, 0, 2, 3).contiguous()``, ``.to(torch.int32)``, top-k padded with -1 by F.pad,
heads padded to 16) and without this project's local changes (no index hygiene), so a
sync brings in what upstream's text would, and the local changes must survive it.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import io
import os
import shutil
import signal
import stat
import subprocess
import sys
import tomllib
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import pytest
import torch
from gitdb import IStream

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))

import sync_upstream  # the thin wrapper users call

from backports.megatron.catalog import CATALOG, MEGATRON_LM_7617
from backports.megatron.sync import commands as sync_commands
from backports.megatron.sync import fetch as sync_fetch
from backports.megatron.sync import verify as sync_verify

# --check reads every vendored folder: the catalog's and those of entries left out for now.
FOLDERS = len(CATALOG)

BACKPORT = "megatron-lm-7617"
OLD_PATH = "megatron/core/transformer/experimental_attention_variant/ops/tilelang_dsa.py"
NEW_PATH = "megatron/core/ops/attention/dsa/kernels/tilelang_dsa.py"
OLD_MODULE = OLD_PATH.removesuffix(".py").replace("/", ".")
NEW_MODULE = NEW_PATH.removesuffix(".py").replace("/", ".")
READS = ["SparseMLA", "_all_bfloat16", "_is_supported_sparse_mla_head_count"]

MODULE_HEAD = '''\
"""Test stand-in for upstream's TileLang DSA module (written for these tests)."""

from typing import Optional

import torch
import torch.nn.functional as F

try:
    from megatron.core.transformer.experimental_attention_variant.ops.sparse_mla import SparseMLA
except (ImportError, OSError):
    SparseMLA = None

_UNRELATED_CACHE = {}


def _is_supported_sparse_mla_head_count(heads: int, kv_group: int = 1) -> bool:
    if kv_group <= 0 or heads % kv_group:
        return False
    per_group = heads // kv_group
    return per_group >= 16 and per_group & (per_group - 1) == 0


def _all_bfloat16(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.bfloat16 for t in tensors)


'''

MODULE_TAIL = """

def run_fused_absorbed_sparse_attention(*args, **kwargs):
    return fused_sparse_mla_absorbed(*args, **kwargs)
"""

# megatron-core 0.19.2's signature, which the fix keeps.
SIGNATURE = """\
def fused_sparse_mla_absorbed(
    query: torch.Tensor,
    key: torch.Tensor,
    topk_indices: torch.Tensor,
    softmax_scale: float,
    v_channels: int,
) -> Optional[torch.Tensor]:
"""

UNFIXED_FUNCTION = (
    SIGNATURE
    + '''\
    """Width 576 and top-k in multiples of 64 only."""
    if SparseMLA is None or not _all_bfloat16(query, key):
        return None
    if query.size(-1) != 576 or v_channels != 512 or topk_indices.size(-1) % 64:
        return None
    heads = query.size(2)
    if not _is_supported_sparse_mla_head_count(max(heads, 16), kv_group=key.size(2)):
        return None
    q = torch.nn.functional.pad(query, (0, 0, 0, max(heads, 16) - heads))
    indices = topk_indices.unsqueeze(2).to(torch.int32).contiguous()
    out, _ = SparseMLA.apply(
        q.permute(1, 0, 2, 3).contiguous(), key.permute(1, 0, 2, 3).contiguous(), indices,
        softmax_scale,
    )
    return out[:, :, :heads].permute(1, 0, 2, 3).contiguous()
'''
)

# The pull request's function as upstream writes it, with ``@@`` where a module global is
# read. Upstream has the bare names; the vendored copy must have ``_live_target().`` there
# and nowhere else (not in the docstring, the comments or the strings that mention the same
# names). Written for these tests from #7617's behaviour: F.pad for width 512 -> 576, then
# ``permute(1, 0, 2, 3).contiguous()``, ``.to(torch.int32)``, top-k padded with -1 by F.pad,
# fewer than 16 heads padded. Out-of-range indices go to the kernel as they are: mapping
# them to -1 is this project's local change "index-hygiene", not upstream's.
FIXED_TEMPLATE = (
    SIGNATURE
    + '''\
    """Fused SparseMLA for absorbed MLA: NoPE width 512 and any top-k width too.

    Reads SparseMLA, _all_bfloat16 and _is_supported_sparse_mla_head_count at call time.
    """
    if @@SparseMLA is None:
        return None  # no TileLang: the caller's dense path
    if query.ndim != 4 or key.ndim != 4 or topk_indices.ndim != 3:
        return None
    if not @@_all_bfloat16(query, key):
        return None
    if key.size(2) != 1:
        return None
    if query.size(1) != key.size(1) or topk_indices.size(0) != query.size(1):
        return None
    if topk_indices.size(1) != query.size(0):
        return None
    if query.size(-1) != key.size(-1):
        return None
    if query.size(-1) not in (512, 576) or v_channels != 512:
        return None
    num_heads = query.size(2)
    padded_heads = max(num_heads, 16)
    if not @@_is_supported_sparse_mla_head_count(padded_heads, kv_group=key.size(2)):
        return None

    if query.size(-1) == 512:
        # NoPE: "SparseMLA" is built for 576 channels. The zero channels add nothing to
        # q.k, so softmax_scale passes through unchanged.
        query = F.pad(query, (0, 64))
        key = F.pad(key, (0, 64))

    q = query.permute(1, 0, 2, 3).contiguous()
    if padded_heads != num_heads:
        # The kernel's head tile is 16: pad, and drop the extra heads from the output.
        q = F.pad(q, (0, 0, 0, padded_heads - num_heads))
    kv = key.permute(1, 0, 2, 3).contiguous()
    indices = topk_indices.unsqueeze(2).to(torch.int32)
    if indices.size(-1) % 64:
        # The kernel walks top-k in blocks of 64; -1 marks an empty slot.
        indices = F.pad(indices, (0, 64 - indices.size(-1) % 64), value=-1)
    indices = indices.contiguous()

    out, _ = @@SparseMLA.apply(q, kv, indices, softmax_scale)
    out = out[:, :, :num_heads]
    return out.permute(1, 0, 2, 3).contiguous()
'''
)
FIXED_FUNCTION = FIXED_TEMPLATE.replace("@@", "")
FIXED_LIVE = FIXED_TEMPLATE.replace("@@", "_live_target().")

FORWARDER = f'''\
"""Moved to {NEW_MODULE}; this forwarder stays for one release."""

import importlib


def __getattr__(name):
    return getattr(importlib.import_module("{NEW_MODULE}"), name)
'''

_WHEN = "1767614400 +0000"  # 2026-01-05, fixed so every run builds the same SHAs
_WHO = git.Actor("Upstream Dev", "dev@example.com")


def module_with(function: str) -> str:
    return MODULE_HEAD + function + MODULE_TAIL


# --- the upstream repository --------------------------------------------------------------


@dataclass
class Upstream:
    path: Path
    repo: git.Repo
    base: str
    pr_head: str
    merge: str
    moved: str

    def commit(self, files: dict[str, str | None], message: str, parent: str | None = None) -> str:
        """A commit on top of ``parent`` (default: the move), kept alive by a branch."""
        return commit_files(self.repo, files, message, parent or self.moved, branch=True)


def commit_files(
    repo: git.Repo,
    files: dict[str, str | None],
    message: str,
    parent: str | None,
    branch: bool = False,
) -> str:
    """Write (or, for None, delete) ``files`` over ``parent``'s tree and commit them."""
    work = Path(repo.working_tree_dir or "")
    if parent is not None:
        repo.git.checkout("--quiet", "--force", parent)
    for name, text in files.items():
        target = work / name
        if text is None:
            repo.index.remove([name], working_tree=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        repo.index.add([name])
    parents = [repo.commit(parent)] if parent is not None else []
    commit = repo.index.commit(
        message,
        parent_commits=parents,
        head=False,
        author=_WHO,
        committer=_WHO,
        author_date=_WHEN,
        commit_date=_WHEN,
    )
    if branch:
        repo.create_head(f"topic-{commit.hexsha[:10]}", commit)
    return commit.hexsha


def build_upstream(path: Path) -> Upstream:
    repo = git.Repo.init(path)
    base = commit_files(repo, {OLD_PATH: module_with(UNFIXED_FUNCTION)}, "base", None)
    pr_head = commit_files(repo, {OLD_PATH: module_with(FIXED_FUNCTION)}, "Fix #7617", base)
    git.Reference.create(repo, "refs/pull/7617/head", pr_head)
    # A squash-merge: the head's tree on top of base, so the head is on no branch.
    squash = git.Commit.create_from_tree(
        repo,
        repo.commit(pr_head).tree,
        "NoPE and unaligned top-k (#7617)",
        parent_commits=[repo.commit(base)],
        author=_WHO,
        committer=_WHO,
        author_date=_WHEN,
        commit_date=_WHEN,
    ).hexsha
    moved = commit_files(
        repo,
        {NEW_PATH: module_with(FIXED_FUNCTION), OLD_PATH: FORWARDER},
        "Move the DSA kernels under megatron/core/ops/",
        squash,
    )
    repo.git.branch("--force", "main", moved)
    repo.git.checkout("--quiet", "main")
    return Upstream(path, repo, base, pr_head, squash, moved)


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    return build_upstream(tmp_path / "Megatron-LM")


# --- running the tool ---------------------------------------------------------------------


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache clone goes under a temporary XDG_CACHE_HOME; the real home is never used.
    (A test that patches more keeps those patches in its own ``MonkeyPatch.context()``:
    ``monkeypatch.undo()`` would undo this one too.)"""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def sniff_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sniff a sync runs in a child interpreter (``verify.sniff_file``: ~5 s there, to
    import torch and megatron) runs in this process instead; the parent's side (what the
    result proves, the sha256 of the bytes sniffed) is the real one. The child itself is
    tests/sync/test_sync_child.py's (slow)."""
    monkeypatch.setattr(sync_verify, "_sniff_in_child", sync_verify.sniff_file)


@pytest.fixture
def vendor(tmp_path: Path) -> Path:
    """A copy of this repository's vendor/ to sync into."""
    copy = tmp_path / "vendor"
    shutil.copytree(ROOT / "vendor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


Tool = Callable[..., Run]


@pytest.fixture
def tool(vendor: Path, capsys: pytest.CaptureFixture[str]) -> Tool:
    def run(*args: str) -> Run:
        try:
            code = sync_upstream.main([*args, "--vendor-dir", str(vendor)])
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def manifest(vendor: Path) -> dict[str, Any]:
    return tomllib.loads((vendor / "megatron_lm_7617" / "UPSTREAM.toml").read_text())


def vendored_text(vendor: Path) -> str:
    return (vendor / "megatron_lm_7617" / "tilelang_dsa.py").read_text(encoding="utf-8")


def folder_digest(folder: Path) -> str:
    """files_sha256 as UPSTREAM.toml documents it, computed here: per .py file of the folder,
    sorted by name, ``name NUL sha256-hex LF``; the sha256 of all of that."""
    lines = sorted(
        f"{path.name}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n"
        for path in folder.glob("*.py")
    )
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def visible(folder: Path) -> dict[str, bytes]:
    """snapshot() without the hidden folders a sync stages in or sets aside."""
    return {k: v for k, v in snapshot(folder).items() if not k.startswith(".")}


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def sync_pr_head(tool: Tool, upstream: Upstream, *extra: str) -> Run:
    args = ("--sha", upstream.pr_head[:7], "--pr", "7617", "--repo", str(upstream.path))
    return tool("--backport", BACKPORT, *args, *extra)


def load_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the vendored output ------------------------------------------------------------------


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


# The pull request's function from a fork that runs code when its file is imported: a
# default computed by builtins alone, which a vendored copy keeps (nothing else of the
# upstream module is vendored). It records who ran it: pid, working directory, -I.
PAYLOAD_DEFAULT = (
    '    _ran=open(r"{marker}", "w").write(repr((__import__("os").getpid(), '
    '__import__("os").getcwd(), __import__("sys").flags.isolated))),\n'
)


def fork_head(upstream: Upstream, marker: Path) -> str:
    """A commit whose fixed function, once its vendored file is imported, writes ``marker``."""
    payload = PAYLOAD_DEFAULT.format(marker=marker)
    function = FIXED_FUNCTION.replace("    v_channels: int,\n", "    v_channels: int,\n" + payload)
    return upstream.commit({NEW_PATH: module_with(function)}, "A fork's head")


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


# --- where the source comes from ----------------------------------------------------------


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


# --- --check ------------------------------------------------------------------------------


def test_check_passes_on_a_clean_sync_and_names_a_hand_edit(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    clean = tool("--check")
    assert clean.code == 0 and f"ok: {FOLDERS} vendored folder(s)" in clean.out
    path = vendor / "megatron_lm_7617" / "tilelang_dsa.py"
    path.write_text(path.read_text().replace("return None  # no TileLang", "return None  #"))
    edited = tool("--check")
    assert edited.code == 1
    assert "drifted: vendored " in edited.out
    assert "vendor/megatron_lm_7617/tilelang_dsa.py has sha256 " in edited.out
    assert f"backports sync --backport {BACKPORT} --sha SHA" in edited.out  # synced: re-sync


@pytest.mark.parametrize("name", ["__init__.py", "extra.py"])
def test_check_covers_every_py_file_of_the_folder(tool: Tool, vendor: Path, name: str) -> None:
    """An edit to a module the loader may import, other than the named file, is drift."""
    assert tool("--check").code == 0
    path = vendor / "megatron_lm_7617" / name
    path.write_text((path.read_text() if path.exists() else "") + "# edited\n")
    run = tool("--check")
    assert run.code == 1
    assert "drifted: vendored folder " in run.out
    assert "vendor/megatron_lm_7617 has files_sha256 " in run.out
    assert "tilelang_dsa.py has sha256" not in run.out
    assert f"backports sync --backport {BACKPORT} --rehash" in run.out  # handwritten


def test_check_refuses_a_file_key_pointed_at_another_file(tool: Tool, vendor: Path) -> None:
    """``file`` at __init__.py with that file's hash, tilelang_dsa.py edited: drift."""
    folder = vendor / "megatron_lm_7617"
    path = folder / "UPSTREAM.toml"
    init_hash = hashlib.sha256((folder / "__init__.py").read_bytes()).hexdigest()
    text = path.read_text().replace('file = "tilelang_dsa.py"', 'file = "__init__.py"')
    path.write_text(text.replace(manifest(vendor)["sha256"], init_hash))
    (folder / "tilelang_dsa.py").write_text(vendored_text(vendor) + "# edited\n")
    run = tool("--check")
    assert run.code == 1 and "vendor/megatron_lm_7617 has files_sha256 " in run.out


def test_check_names_a_manifest_without_files_sha256(tool: Tool, vendor: Path) -> None:
    path = vendor / "megatron_lm_7617" / "UPSTREAM.toml"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if not line.startswith("files_sha256")))
    run = tool("--check")
    assert run.code == 1 and "has no files_sha256" in run.out


def test_check_names_a_missing_vendored_file(tool: Tool, vendor: Path) -> None:
    (vendor / "megatron_lm_7617" / "tilelang_dsa.py").unlink()
    run = tool("--check", "--backport", BACKPORT)
    says = "vendor/megatron_lm_7617/tilelang_dsa.py cannot be read (No such file or directory)"
    assert run.code == 1 and says in run.out


def test_check_on_this_repository_as_ci_runs_it() -> None:
    run = subprocess.run(
        [sys.executable, "tools/sync_upstream.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"ok: {FOLDERS} vendored folder(s) match their UPSTREAM.toml" in run.stdout


def test_the_script_reports_an_error_with_status_2(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "sync_upstream.py"),
            "--backport",
            BACKPORT,
            "--sha",
            "not-hex",
            "--vendor-dir",
            str(ROOT / "vendor"),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert run.returncode == 2
    assert "sync_upstream.py: error: --sha must be 4 to 40 hex digits" in run.stderr


# --- --rehash -----------------------------------------------------------------------------


def test_rehash_records_a_handwritten_folder_as_it_is(tool: Tool, vendor: Path) -> None:
    folder = vendor / "megatron_lm_7617"
    assert tool("--backport", BACKPORT, "--rehash").out.endswith("nothing written\n")
    init = folder / "__init__.py"
    init.write_text(init.read_text() + "# a docstring fix\n")
    (folder / "tilelang_dsa.py").write_text(vendored_text(vendor) + "# reworded\n")
    assert tool("--check").code == 1
    before = manifest(vendor)
    dry = tool("--backport", BACKPORT, "--rehash", "--dry-run")
    assert dry.code == 0 and "+files_sha256 = " in dry.out and manifest(vendor) == before
    run = tool("--backport", BACKPORT, "--rehash")
    assert run.code == 0, run.err
    assert "wrote UPSTREAM.toml in vendor/megatron_lm_7617/" in run.out
    after = manifest(vendor)
    assert after["sha256"] == hashlib.sha256((folder / "tilelang_dsa.py").read_bytes()).hexdigest()
    assert after["files_sha256"] == folder_digest(folder)
    changed = {key for key in after if after[key] != before[key]}
    assert changed == {"sha256", "files_sha256"}  # nothing else: not a sync
    assert tool("--check").code == 0


def test_this_repositorys_handwritten_folder_is_rehashed() -> None:
    """The committed hashes are what the tool records (no hand-edited hash)."""
    data = tomllib.loads((ROOT / "vendor" / "megatron_lm_7617" / "UPSTREAM.toml").read_text())
    assert data["origin"] == "handwritten"
    assert data["files_sha256"] == folder_digest(ROOT / "vendor" / "megatron_lm_7617")


def test_rehash_refuses_synced_code(tool: Tool, upstream: Upstream, vendor: Path) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    path = vendor / "megatron_lm_7617" / "tilelang_dsa.py"
    path.write_text(path.read_text() + "# a local tweak\n")
    expect_error(tool, vendor, "--backport", BACKPORT, "--rehash", says="re-sync synced code")


# --- errors: a clear message, status 2, nothing written -----------------------------------


def expect_error(tool: Tool, vendor: Path, *args: str, says: str, code: int = 2) -> Run:
    before = snapshot(vendor)
    run = tool(*args)
    assert run.code == code, (run.out, run.err)
    assert says in run.err, run.err
    assert snapshot(vendor) == before
    return run


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


# --- both files or neither ----------------------------------------------------------------


def sync_args(upstream: Upstream) -> tuple[str, ...]:
    return ("--backport", BACKPORT, "--sha", upstream.merge, "--repo", str(upstream.path))


@pytest.fixture
def synced_elsewhere(tmp_path: Path, upstream: Upstream, vendor: Path) -> dict[str, bytes]:
    """What vendor/ holds after an uninterrupted sync (run on a second copy of it)."""
    other = tmp_path / "vendor-uninterrupted"
    shutil.copytree(vendor, other)
    assert sync_upstream.main([*sync_args(upstream), "--vendor-dir", str(other)]) == 0
    return visible(other)


class FailAt:
    """Make the ``n``-th write or rename under ``vendor`` raise ``error`` (0-based)."""

    def __init__(self, vendor: Path, n: int, error: BaseException) -> None:
        self.vendor, self.n, self.error, self.seen = str(vendor), n, error, 0
        self.real_rename, self.real_write = os.rename, sync_commands.write_file

    def _step(self, *paths: Any) -> None:
        if any(str(path).startswith(self.vendor) for path in paths):
            self.seen += 1
            if self.seen - 1 == self.n:
                raise self.error

    def rename(self, src: Any, dst: Any) -> None:
        self._step(src, dst)
        self.real_rename(src, dst)

    def write_file(self, path: Path, text: str) -> None:
        self._step(path)
        self.real_write(path, text)


# A sync's steps under vendor/: write the staged file, write the staged UPSTREAM.toml,
# move the folder aside, move the staged copy in.
STEPS = 4


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("step", range(STEPS))
def test_an_interrupted_sync_leaves_the_old_pair(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    synced_elsewhere: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    step: int,
    error: BaseException,
) -> None:
    before = visible(vendor)
    fail = FailAt(vendor, step, error)
    with pytest.MonkeyPatch.context() as failing:  # undone alone: the cache stays redirected
        failing.setattr(os, "rename", fail.rename)
        failing.setattr(sync_commands, "write_file", fail.write_file)
        run = tool(*sync_args(upstream))
    assert fail.seen > step  # it really failed at that step
    ctrl_c = isinstance(error, KeyboardInterrupt)
    assert run.code == (130 if ctrl_c else 2) and run.err.count("\n") == 1, run.err
    assert run.err.startswith("sync_upstream.py: error: ")
    assert "Traceback" not in run.err
    assert ("interrupted" if ctrl_c else "No space left") in run.err
    assert visible(vendor) == before and hidden(vendor) == []
    assert tool(*sync_args(upstream)).code == 0
    assert visible(vendor) == synced_elsewhere


def test_a_swap_that_cannot_put_the_old_folder_back_is_repaired_by_the_next_run(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    synced_elsewhere: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Killed between the two renames, in effect: the folder is set aside, not back."""
    before = visible(vendor)
    real = os.rename
    renames: list[str] = []

    def rename(src: Any, dst: Any) -> None:
        renames.append(Path(src).name)
        if len(renames) > 1:
            raise OSError(5, "Input/output error")
        real(src, dst)

    with pytest.MonkeyPatch.context() as failing:  # undone alone: the cache stays redirected
        failing.setattr(os, "rename", rename)
        run = tool(*sync_args(upstream))
    assert run.code == 2 and run.err.count("\n") == 1, run.err
    aside = vendor / ".megatron_lm_7617.sync-old"
    assert f"it is {aside}; the next run puts it back" in run.err
    assert not (vendor / "megatron_lm_7617").exists()
    check = tool("--check")  # read-only: it names the leftover and fails
    assert check.code == 1 and "leftover: .megatron_lm_7617.sync-old" in check.out
    dry = tool(*sync_args(upstream), "--dry-run")
    assert "note: .megatron_lm_7617.sync-old is left by a killed sync" in dry.out
    assert not (vendor / "megatron_lm_7617").exists()  # a dry run writes nothing
    again = tool(*sync_args(upstream))
    assert again.code == 0, again.err
    assert "note: put megatron_lm_7617/ back from .megatron_lm_7617.sync-old" in again.out
    assert visible(vendor) == synced_elsewhere and hidden(vendor) == []
    assert before != synced_elsewhere


@pytest.mark.parametrize("leftover", [".megatron_lm_7617.sync-old", ".megatron_lm_7617.sync-new-x"])
def test_leftovers_of_a_finished_sync_are_removed(
    tool: Tool, upstream: Upstream, vendor: Path, leftover: str
) -> None:
    shutil.copytree(vendor / "megatron_lm_7617", vendor / leftover)
    assert tool(*sync_args(upstream)).code == 0
    assert hidden(vendor) == []
    assert manifest(vendor)["synced_sha"] == upstream.merge


def test_ctrl_c_during_the_swap_is_held_until_both_files_are_in(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    synced_elsewhere: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = os.rename

    def rename(src: Any, dst: Any) -> None:
        if Path(src).name == "megatron_lm_7617":  # the folder is being set aside
            signal.raise_signal(signal.SIGINT)
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    handler = signal.getsignal(signal.SIGINT)  # SIG_IGN under nohup or `cmd &`
    run = tool(*sync_args(upstream))
    assert run.code == 130 and run.err.count("\n") == 1, run.err
    assert "interrupted after the swap: wrote tilelang_dsa.py and UPSTREAM.toml" in run.err
    assert visible(vendor) == synced_elsewhere and hidden(vendor) == []
    assert signal.getsignal(signal.SIGINT) is handler  # restored


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
