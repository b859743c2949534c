"""The #7617 backport as ``apply()`` installs it, on real megatron-core 0.19.2, fake kernel.

Only ``tilelang_dsa.SparseMLA`` is replaced (``backports.megatron.testing.fake_kernel``);
everything else is the installed megatron-core. Results are compared with
tests/reference.py, an FP32 sparse attention on the caller's unpadded inputs, never with the
code under test. The tests that hold for upstream's function alone run in both modes: with
this project's local changes (the default) and upstream-only
(``apply(upstream_only=True)``).
"""

from types import ModuleType

import pytest
import torch

from backports.megatron import Action, apply
from backports.megatron.testing.fake_kernel import FakeSparseMLA
from tests.conftest import BACKPORT_ID
from tests.reference import sparse_mla_reference
from tests.reports import report_for

SCALE = 0.0625  # any scale works on CPU; one value keeps the GPU twin's compiles few
# bf16 inputs, FP32 accumulation in both: the gap is the bf16 rounding of the output
# (2^-8 relative) plus bf16 rounding of the kernel's q/k copies (exact: plain copies).
OUT_TOL = 2e-2
GRAD_TOL = 2e-2


@pytest.fixture(params=[False, True], ids=["local-changes", "upstream-only"])
def installed_any_mode(
    request: pytest.FixtureRequest, tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA
) -> ModuleType:
    report = report_for(apply(BACKPORT_ID, upstream_only=request.param), BACKPORT_ID)
    assert report.action is Action.INSTALLED, report
    assert report.evidence["mode"] == ("upstream-only" if request.param else "local-changes")
    return tilelang_dsa


@pytest.fixture
def installed(tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA) -> ModuleType:
    """The default: the vendored function with this project's local changes."""
    report = report_for(apply(BACKPORT_ID), BACKPORT_ID)
    assert report.action is Action.INSTALLED, report
    return tilelang_dsa


def _inputs(sq, sk, b, heads, width, topk, seed=0, invalid=0.25):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(sq, b, heads, width, generator=gen).to(torch.bfloat16)
    key = torch.randn(sk, b, 1, width, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, sk, (b, sq, topk), generator=gen)
    holes = torch.rand(b, sq, topk, generator=gen) < invalid
    indices[holes] = -1
    return query, key, indices


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


_HEADS = (4, 8, 16, 32, 64)
_TOPKS = (64, 65, 127, 2051)
_WIDTHS = (512, 576)
_REST_OF_THE_GRID = pytest.mark.slow(
    reason="the whole width x top-k x heads grid (0.5-3 s of CPU a case, top-k 2051 most); "
    "the fast selection runs a covering set: every (width, top-k) pair once and every "
    "head count (padded to 16 or not) at least once"
)


def _grid() -> list[object]:
    """(width, top-k, heads) for every case; the ones off the covering set are slow."""
    cases = []
    for w, width in enumerate(_WIDTHS):
        for t, topk in enumerate(_TOPKS):
            for h, heads in enumerate(_HEADS):
                covering = h == (t + 2 * w) % len(_HEADS)
                marks = () if covering else (_REST_OF_THE_GRID,)
                cases.append(pytest.param(width, topk, heads, marks=marks))
    return cases


@pytest.mark.parametrize(("width", "topk", "heads"), _grid())
def test_matches_reference_forward_and_backward(
    installed_any_mode, fake_kernel, width, topk, heads
):
    installed = installed_any_mode
    query, key, indices = _inputs(sq=6, sk=37, b=2, heads=heads, width=width, topk=topk)
    saved = (query.clone(), key.clone(), indices.clone())
    query.requires_grad_(True)
    key.requires_grad_(True)

    out = installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512)

    assert out is not None and out.shape == (6, 2, heads, 512) and out.dtype == torch.bfloat16
    assert out.is_contiguous()
    q_ref = saved[0].float().requires_grad_(True)
    k_ref = saved[1].float().requires_grad_(True)
    ref = sparse_mla_reference(q_ref, k_ref, indices, SCALE, 512)
    assert _rel(out, ref) < OUT_TOL

    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out.float() * grad).sum().backward()
    (ref * grad).sum().backward()
    assert query.grad.shape == query.shape and key.grad.shape == key.shape
    assert _rel(query.grad, q_ref.grad) < GRAD_TOL
    assert _rel(key.grad, k_ref.grad) < GRAD_TOL

    # Inputs never modified.
    assert torch.equal(query.detach(), saved[0]) and torch.equal(key.detach(), saved[1])
    assert torch.equal(indices, saved[2])

    # What the kernel saw, laid out as upstream lays it out: [b, s, heads, 576] with zeros
    # past the caller's width, heads padded to >= 16 with zeros, top-k padded to a
    # multiple of 64 with -1, the caller's scale.
    (call,) = fake_kernel.calls
    kernel_heads = max(heads, 16)
    padded_topk = -(-topk // 64) * 64
    assert call.q.shape == (2, 6, kernel_heads, 576)
    assert call.kv.shape == (2, 37, 1, 576)
    assert call.indices.shape == (2, 6, 1, padded_topk)
    assert call.scale == SCALE
    assert torch.equal(call.q[:, :, :heads, :width], saved[0].permute(1, 0, 2, 3))
    assert torch.equal(call.kv[..., :width], saved[1].permute(1, 0, 2, 3))
    assert not call.q[:, :, :, width:].any() and not call.kv[..., width:].any()
    assert not call.q[:, :, heads:].any()
    assert (call.indices[..., topk:] == -1).all()
    assert torch.equal(call.indices[:, :, 0, :topk].long(), indices)


@pytest.mark.parametrize("width", [512, 576])
def test_row_with_only_empty_slots_gives_zero_output_and_gradient(installed_any_mode, width):
    installed = installed_any_mode
    query, key, indices = _inputs(sq=4, sk=9, b=1, heads=16, width=width, topk=65)
    indices[0, 2] = -1
    query.requires_grad_(True)
    out = installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512)
    assert not out[2].any()
    out.float().square().sum().backward()
    assert not query.grad[2].any()
    assert query.grad[1].any()


@pytest.mark.parametrize("bad", [-2, -100, 9, 10, 2**31 + 3, 2**40])
def test_out_of_range_indices_are_empty_slots(installed, fake_kernel, bad):
    """The kernel reads key 0 for negatives other than -1 and out of bounds for >= sk.

    Local change "index-hygiene": upstream's function hands such indices on as they are.
    """
    query, key, indices = _inputs(sq=3, sk=9, b=1, heads=16, width=512, topk=65)
    indices[0, 1, :5] = bad
    out = installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512)
    ref = sparse_mla_reference(query, key, indices, SCALE, 512)
    assert _rel(out, ref) < OUT_TOL
    assert (fake_kernel.calls[0].indices[0, 1, 0, :5] == -1).all()


def test_int32_indices_accepted(installed_any_mode, fake_kernel):
    installed = installed_any_mode
    query, key, indices = _inputs(sq=3, sk=9, b=1, heads=16, width=512, topk=2051)
    out = installed.fused_sparse_mla_absorbed(query, key, indices.int(), SCALE, 512)
    ref = sparse_mla_reference(query, key, indices, SCALE, 512)
    assert _rel(out, ref) < OUT_TOL


def _decline_cases():
    q, k, i = _inputs(sq=4, sk=8, b=2, heads=16, width=512, topk=65)
    yield "fp16 query", q.half(), k, i, 512
    yield "fp32 key", q, k.float(), i, 512
    yield "two key heads", q, k.expand(-1, -1, 2, -1).contiguous(), i, 512
    yield "query rank 3", q[:, 0], k, i, 512
    yield "key rank 3", q, k[:, :, 0], i, 512
    yield "indices rank 2", q, k, i[0], 512
    yield "batch mismatch q/k", q, k[:, :1], i, 512
    yield "batch mismatch indices", q, k, i[:1], 512
    yield "sequence mismatch", q[:3], k, i, 512
    yield "q/k width differ", q, torch.nn.functional.pad(k, (0, 64)), i, 512
    yield "width 256", q[..., :256], k[..., :256], i, 512
    yield "width 640", *(torch.nn.functional.pad(t, (0, 128)) for t in (q, k)), i, 512
    yield "v_channels 448", q, k, i, 448
    yield "48 heads", q[:, :, :1].expand(-1, -1, 48, -1).contiguous(), k, i, 512
    yield "24 heads", q[:, :, :1].expand(-1, -1, 24, -1).contiguous(), k, i, 512


@pytest.mark.parametrize(
    "query, key, indices, v_channels",
    [pytest.param(*case[1:], id=case[0]) for case in _decline_cases()],
)
def test_declines_with_none_and_touches_nothing(
    installed_any_mode, fake_kernel, query, key, indices, v_channels
):
    installed = installed_any_mode
    saved = [t.clone() for t in (query, key, indices)]
    assert installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, v_channels) is None
    assert fake_kernel.calls == []
    for before, after in zip(saved, (query, key, indices), strict=True):
        assert torch.equal(before, after)


def test_declines_without_kernel(installed, monkeypatch):
    monkeypatch.setattr(installed, "SparseMLA", None)
    query, key, indices = _inputs(sq=4, sk=8, b=1, heads=16, width=512, topk=65)
    assert installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512) is None


def test_reads_helpers_from_the_live_module(installed, fake_kernel, monkeypatch):
    query, key, indices = _inputs(sq=4, sk=8, b=1, heads=16, width=512, topk=65)
    monkeypatch.setattr(installed, "_is_supported_sparse_mla_head_count", lambda *a, **k: False)
    assert installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512) is None
    monkeypatch.undo()
    monkeypatch.setattr(installed, "SparseMLA", fake_kernel)
    monkeypatch.setattr(installed, "_all_bfloat16", lambda *tensors: False)
    assert installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512) is None
    assert fake_kernel.calls == []


class _Config:
    """What dsa_kernels reads from a TransformerConfig (TransformerConfig itself refuses
    dsa_kernel_backend="tilelang" on a machine without CUDA)."""

    attention_backend = "auto"
    dsa_kernel_backend = "tilelang"


@pytest.mark.parametrize("width, topk, heads", [(512, 2051, 16), (576, 65, 8), (512, 127, 32)])
def test_megatron_fused_path_agrees_with_its_dense_fallback(installed, width, topk, heads):
    """End to end through dsa_kernels, against megatron's own _unfused_absorbed_dsa_fn.

    The dense fallback applies a causal mask, so the indices are causal: row s picks keys
    in [0, s], the rest -1.
    """
    from megatron.core.transformer.experimental_attention_variant import dsa, dsa_kernels

    sq = b_sk = 40
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(sq, 1, heads, width, generator=gen).to(torch.bfloat16)
    key = torch.randn(b_sk, 1, 1, width, generator=gen).to(torch.bfloat16)
    indices = torch.full((1, sq, topk), -1, dtype=torch.int64)
    for s in range(sq):
        picks = torch.randperm(s + 1, generator=gen)[: min(topk, s + 1)]
        indices[0, s, : picks.numel()] = picks

    assert dsa_kernels.use_fused_dsa_kernels(_Config())
    fused = dsa_kernels.run_fused_absorbed_sparse_attention(
        _Config(), query, key, indices, SCALE, 512
    )
    dense = dsa._unfused_absorbed_dsa_fn(query, key, indices, SCALE, 512)
    assert fused is not None
    assert fused.shape == dense.shape == (sq, 1, heads, 512)
    assert _rel(fused, dense) < OUT_TOL
