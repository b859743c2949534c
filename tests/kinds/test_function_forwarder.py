"""Upstream's planned move: the function defined under megatron/core/ops/..., the old path a
PEP 562 forwarder. The backport must rebind where the function is defined, never on the
forwarder."""

import sys
import types

import pytest

from backports.megatron import Action, Verdict, apply, revert, status
from tests.conftest import BACKPORT_ID, TILELANG_DSA
from tests.reports import report_for

NEW = "megatron.core.ops.attention.dsa.kernels.tilelang_dsa"
COPIED = ("SparseMLA", "_all_bfloat16", "_is_supported_sparse_mla_head_count", "torch", "Optional")


@pytest.fixture
def moved_layout(tilelang_dsa, fake_kernel, monkeypatch):
    """The real 0.19.2 function and helpers, re-homed in a module at the new path."""
    new = types.ModuleType(NEW)
    for name in COPIED:
        setattr(new, name, getattr(tilelang_dsa, name))
    real = tilelang_dsa.fused_sparse_mla_absorbed
    moved = types.FunctionType(real.__code__, vars(new), real.__name__, real.__defaults__)
    moved.__module__ = NEW
    new.fused_sparse_mla_absorbed = moved

    old = types.ModuleType(TILELANG_DSA)

    def forward(name):
        return getattr(sys.modules[NEW], name)

    old.__getattr__ = forward
    monkeypatch.setitem(sys.modules, NEW, new)
    monkeypatch.setitem(sys.modules, TILELANG_DSA, old)
    return new, old, moved


def test_probe_finds_the_defining_module(moved_layout):
    report = report_for(status(), BACKPORT_ID)
    assert report.verdict is Verdict.NEEDED, report.reason
    assert report.evidence["target"]["module"] == NEW


def test_install_rebinds_the_defining_module_not_the_forwarder(moved_layout):
    new, old, moved = moved_layout
    report = report_for(apply(), BACKPORT_ID)
    assert report.action is Action.INSTALLED
    assert new.fused_sparse_mla_absorbed.__backport__ == BACKPORT_ID
    assert "fused_sparse_mla_absorbed" not in vars(old)  # the forwarder stays a forwarder
    assert old.fused_sparse_mla_absorbed is new.fused_sparse_mla_absorbed
    revert()
    assert new.fused_sparse_mla_absorbed is moved


def test_vendored_code_reads_globals_from_the_moved_module(moved_layout, fake_kernel):
    import torch

    new, _, _ = moved_layout
    apply()
    query = torch.randn(3, 1, 16, 512).to(torch.bfloat16)
    key = torch.randn(5, 1, 1, 512).to(torch.bfloat16)
    indices = torch.randint(-1, 5, (1, 3, 65))
    assert new.fused_sparse_mla_absorbed(query, key, indices, 0.0625, 512) is not None
    assert len(fake_kernel.calls) == 1
    new.SparseMLA = None  # a kernel replaced in the live module is seen at call time
    assert new.fused_sparse_mla_absorbed(query, key, indices, 0.0625, 512) is None
