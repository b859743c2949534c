"""The upstream repositories the sync tests build with gitpython, and how they run the tool
(tools/sync_upstream.py, ``backports sync``); the fixtures are tests/sync/conftest.py's.

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

import hashlib
import importlib.util
import sys
import tomllib
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))

import sync_upstream  # noqa: F401  (the thin wrapper users call; the tests run it from here)

from backports.megatron.catalog import CATALOG

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


@dataclass
class Run:
    code: int
    out: str
    err: str


Tool = Callable[..., Run]


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


def expect_error(tool: Tool, vendor: Path, *args: str, says: str, code: int = 2) -> Run:
    before = snapshot(vendor)
    run = tool(*args)
    assert run.code == code, (run.out, run.err)
    assert says in run.err, run.err
    assert snapshot(vendor) == before
    return run


def sync_args(upstream: Upstream) -> tuple[str, ...]:
    return ("--backport", BACKPORT, "--sha", upstream.merge, "--repo", str(upstream.path))
