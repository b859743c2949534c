"""The #7091 backport: top-k widths TileLang cannot lay out take the PyTorch path, on real
megatron-core 0.19.2; beside #7617 on the same module; and after a sync from an upstream
repository built here."""

import contextlib
import dataclasses
import io
import shutil
import sys
import tomllib

import pytest
import torch

from backports.megatron import Action, Verdict, apply, catalog, revert, status
from backports.megatron.catalog import MEGATRON_LM_7091
from backports.megatron.model import ResolvedTarget
from backports.megatron.private_globals import with_globals
from backports.megatron.vendored import load_replacement
from tests.conftest import BACKPORT_ID as ID_7617
from tests.conftest import TILELANG_DSA
from tests.paths import ROOT
from tests.reports import report_for

ID = "megatron-lm-7091"
NAME = "_can_use_fused_sparse_indexer_target"
KERNEL = "sparse_indexer_target_interface"
# Written by hand from the pull request's description: <= 256, or a multiple of 256.
FIXED_ACCEPTS = [64, 128, 192, 256, 512, 768, 1024, 1280, 1536, 1792, 2048]
MULTIPLES_OF_64 = list(range(64, 2049, 64))


class OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA (the predicate tests ``.is_cuda``)."""

    @property
    def is_cuda(self):
        return True


def cuda_like(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype).as_subclass(OnCuda)


def accepts(predicate, width, query=None, key=None):
    query = cuda_like(2, 4, 128) if query is None else query
    key = cuda_like(8, 128) if key is None else key
    return predicate(query, key, cuda_like(2, width, dtype=torch.int64))


@pytest.fixture(params=["installed", "vendored"])
def predicate(request, tilelang_dsa):
    """0.19.2's predicate or the vendored one, each seeing a sentinel kernel privately."""
    if request.param == "installed":
        function = vars(tilelang_dsa)[NAME]
    else:
        function = load_replacement(MEGATRON_LM_7091.vendored, TILELANG_DSA)
    return request.param, with_globals(function, {KERNEL: object()})


def test_the_width_table(predicate):
    which, function = predicate
    accepted = [w for w in MULTIPLES_OF_64 if accepts(function, w)]
    assert accepted == (MULTIPLES_OF_64 if which == "installed" else FIXED_ACCEPTS)
    for width in (65, 100, 250, 2049):
        assert accepts(function, width) is False, width


def test_every_0192_condition_is_kept(predicate):
    _, function = predicate
    q, k, idx = cuda_like(2, 4, 128), cuda_like(8, 128), cuda_like(2, 256, dtype=torch.int64)
    assert function(q, k, idx) is True
    assert function(q, None, idx) is False
    assert function(torch.zeros(2, 4, 128, dtype=torch.bfloat16), k, idx) is False  # CPU
    assert function(q, k, torch.zeros(2, 256, dtype=torch.int64)) is False
    assert function(cuda_like(4, 128), k, idx) is False  # q not 3-D
    assert function(q, cuda_like(1, 8, 128), idx) is False  # k not 2-D
    assert function(cuda_like(2, 4, 128, dtype=torch.float16), k, idx) is False
    assert function(q, cuda_like(8, 128, dtype=torch.float32), idx) is False
    assert function(q, cuda_like(8, 64), idx) is False  # widths differ
    assert function(cuda_like(2, 4, 120), cuda_like(8, 120), idx) is False  # not % 16
    assert function(q, k, cuda_like(2, 1, 256, dtype=torch.int64)) is False  # idx not 2-D


def test_no_kernel_declines_every_width(tilelang_dsa):
    vendored = load_replacement(MEGATRON_LM_7091.vendored, TILELANG_DSA)
    without = with_globals(vendored, {KERNEL: None})
    assert [w for w in MULTIPLES_OF_64 if accepts(without, w)] == []


def _resolved(tilelang_dsa, function):
    return ResolvedTarget(TILELANG_DSA, tilelang_dsa, NAME, function, None)


def test_sniff_says_needed_on_0192_and_fixed_on_the_vendored_code(tilelang_dsa):
    before = getattr(tilelang_dsa, KERNEL)
    unfixed = MEGATRON_LM_7091.sniff([_resolved(tilelang_dsa, vars(tilelang_dsa)[NAME])])
    vendored = load_replacement(MEGATRON_LM_7091.vendored, TILELANG_DSA)
    fixed = MEGATRON_LM_7091.sniff([_resolved(tilelang_dsa, vendored)])
    assert (unfixed.fixed, fixed.fixed) == (False, True)
    assert unfixed.detail["probes"] == {"320": True, "448": True, "1984": True}
    assert fixed.detail["probes"] == {"320": False, "448": False, "1984": False}
    assert getattr(tilelang_dsa, KERNEL) is before  # the live module never saw the sentinel


@pytest.mark.parametrize(
    "stand_in, says",
    [
        (lambda query, key, topk_indices: False, "controls"),  # declines 256 and 512
        (lambda query, key, topk_indices: topk_indices.size(-1) in (256, 512, 320), "partly"),
    ],
)
def test_sniff_raises_on_a_predicate_like_no_version(tilelang_dsa, stand_in, says):
    with pytest.raises(RuntimeError, match=says):
        MEGATRON_LM_7091.sniff([_resolved(tilelang_dsa, _as_function(stand_in))])


def _as_function(function):
    def predicate(query, key, topk_indices):
        return function(query, key, topk_indices)

    return predicate


def test_status_reports_needed_with_its_own_reason(tilelang_dsa):
    report = report_for(status(), ID)
    assert report.verdict is Verdict.NEEDED and report.action is Action.WOULD_INSTALL
    assert "320, 448 and 1984 reach the TileLang kernel" in report.reason
    assert report.evidence["upstream"]["head_sha"] is None  # unknown, not invented
    assert report.evidence["git"]["checkout"] is False


def test_installed_predicate_declines_320_for_the_caller(tilelang_dsa, monkeypatch):
    original = vars(tilelang_dsa)[NAME]
    report = report_for(apply(ID), ID)
    assert report.action is Action.INSTALLED
    live = getattr(tilelang_dsa, NAME)  # what fused_qk_topk_... looks up as a global
    assert live.__backport__ == ID and live.__wrapped__ is original
    monkeypatch.setattr(tilelang_dsa, KERNEL, object())  # a kernel "is" importable
    assert [w for w in (256, 320, 448, 512, 1984) if accepts(live, w)] == [256, 512]


def test_both_backports_on_one_module_keep_their_own_marks(tilelang_dsa):
    fused, predicate = tilelang_dsa.fused_sparse_mla_absorbed, vars(tilelang_dsa)[NAME]
    reports = apply()
    assert report_for(reports, ID).action is Action.INSTALLED
    assert report_for(reports, ID_7617).action is Action.INSTALLED
    assert getattr(tilelang_dsa, NAME).__backport__ == ID
    assert getattr(tilelang_dsa, NAME).__wrapped__ is predicate
    assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == ID_7617
    assert tilelang_dsa.fused_sparse_mla_absorbed.__wrapped__ is fused


def test_7091_alone_leaves_fused_sparse_mla_absorbed_alone(tilelang_dsa):
    fused = tilelang_dsa.fused_sparse_mla_absorbed
    apply(ID)
    assert tilelang_dsa.fused_sparse_mla_absorbed is fused


@pytest.mark.parametrize("first, second", [(ID, ID_7617), (ID_7617, ID)])
def test_revert_in_either_order_restores_both_originals(tilelang_dsa, first, second):
    fused, predicate = tilelang_dsa.fused_sparse_mla_absorbed, vars(tilelang_dsa)[NAME]
    apply([ID, ID_7617])
    assert report_for(revert(first), first).action is Action.REVERTED
    still = {ID: (NAME, ID), ID_7617: ("fused_sparse_mla_absorbed", ID_7617)}[second]
    assert getattr(tilelang_dsa, still[0]).__backport__ == still[1]
    assert report_for(revert(second), second).action is Action.REVERTED
    assert tilelang_dsa.fused_sparse_mla_absorbed is fused
    assert vars(tilelang_dsa)[NAME] is predicate


def test_status_shows_both_ids_for_one_module(tilelang_dsa):
    reports = status()
    modules = {r.id: r.evidence["target"]["module"] for r in reports if r.id in (ID, ID_7617)}
    assert modules == {ID: TILELANG_DSA, ID_7617: TILELANG_DSA}
    assert {report_for(reports, i).verdict for i in (ID, ID_7617)} == {Verdict.NEEDED}


# ---- a sync from an upstream repository built here --------------------------------------

UNFIXED = '''\
"""Test stand-in for upstream's TileLang DSA module (written for these tests)."""

from typing import Optional

import torch

try:
    from megatron.core.transformer.experimental_attention_variant.ops.tilelang_indexer import (
        sparse_indexer_target_interface,
    )
except (ImportError, OSError):
    sparse_indexer_target_interface = None


def _can_use_fused_sparse_indexer_target(
    query: torch.Tensor, key: Optional[torch.Tensor], topk_indices: torch.Tensor
) -> bool:
    """Whether the fused target kernel takes these tensors."""
    return (
        sparse_indexer_target_interface is not None
        and key is not None
        and query.is_cuda
        and key.is_cuda
        and topk_indices.is_cuda
        and query.ndim == 3
        and key.ndim == 2
        and query.dtype == torch.bfloat16
        and key.dtype == torch.bfloat16
        and query.size(-1) == key.size(-1)
        and query.size(-1) % 16 == 0
        and topk_indices.ndim == 2
        and topk_indices.size(-1) % 64 == 0
    )
'''
FIXED = UNFIXED.replace(
    "        and topk_indices.size(-1) % 64 == 0\n",
    "        and topk_indices.size(-1) % 64 == 0\n"
    "        and (topk_indices.size(-1) <= 256 or topk_indices.size(-1) % 256 == 0)\n",
)
PATH = "megatron/core/transformer/experimental_attention_variant/ops/tilelang_dsa.py"
PACKAGE = "synced_vendor_7091"


@pytest.fixture
def synced(tmp_path, monkeypatch):
    """vendor/ copied into an importable package and #7091 synced from the PR's head."""
    from tests.paths import ROOT
    from tests.sync.upstreams import commit_files, sync_upstream

    git = pytest.importorskip("git")
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    base = commit_files(repo, {PATH: UNFIXED}, "base", None)
    head = commit_files(repo, {PATH: FIXED}, "Decline widths TileLang cannot lay out", base)
    git.Reference.create(repo, "refs/pull/7091/head", head)
    vendor = tmp_path / "pkgs" / PACKAGE
    shutil.copytree(ROOT / "vendor", vendor, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = io.StringIO()
    args = ["--backport", ID, "--pr", "7091", "--repo", str(repo.working_tree_dir)]
    with contextlib.redirect_stdout(out):
        assert sync_upstream.main([*args, "--vendor-dir", str(vendor)]) == 0, out.getvalue()
    with contextlib.redirect_stdout(io.StringIO()):
        assert sync_upstream.main(["--check", "--vendor-dir", str(vendor)]) == 0
    monkeypatch.syspath_prepend(str(vendor.parent))
    ref = dataclasses.replace(MEGATRON_LM_7091.vendored, package=f"{PACKAGE}.megatron_lm_7091")
    monkeypatch.setattr(catalog, "CATALOG", (dataclasses.replace(MEGATRON_LM_7091, vendored=ref),))
    yield vendor / "megatron_lm_7091", head
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


def test_a_sync_from_upstream_survives(synced, tilelang_dsa, monkeypatch):
    folder, head = synced
    manifest = tomllib.loads((folder / "UPSTREAM.toml").read_text())
    assert manifest["origin"] == "synced" and manifest["head_sha"] == head
    assert manifest["reads"] == [KERNEL]
    text = (folder / "tilelang_dsa.py").read_text()
    assert "_live_target().sparse_indexer_target_interface is not None" in text
    report = report_for(apply(), ID)
    assert report.verdict is Verdict.NEEDED and report.action is Action.INSTALLED, report
    assert report.evidence["vendored"]["ok"] and report.evidence["upstream"]["origin"] == "synced"
    live = getattr(tilelang_dsa, NAME)
    assert live.__code__.co_filename == str(folder / "tilelang_dsa.py")
    monkeypatch.setattr(tilelang_dsa, KERNEL, object())
    assert [w for w in MULTIPLES_OF_64 if accepts(live, w)] == FIXED_ACCEPTS


def test_the_committed_manifest_records_no_invented_head(tilelang_dsa):
    data = tomllib.loads((ROOT / "vendor" / "megatron_lm_7091" / "UPSTREAM.toml").read_text())
    assert "head_sha" not in data and "merge_sha" not in data
    assert data["origin"] == "handwritten" and "No head_sha" in data["origin_note"]
