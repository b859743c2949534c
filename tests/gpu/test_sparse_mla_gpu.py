"""The real TileLang SparseMLA kernel through the installed #7617 backport, on a CUDA GPU.

``backports.megatron.apply()`` installs the vendored ``fused_sparse_mla_absorbed`` onto
megatron-core 0.19.2, with this project's local changes around it (the default) or alone
(``upstream_only=True``); every call here goes through the installed function (or through
megatron's own ``dsa_kernels`` hook) to megatron-core's TileLang ``SparseMLA``. Results
are compared with tests/reference.py, an FP32 sparse attention on the caller's unpadded
inputs that knows nothing of kernel layouts, padding or sentinels.

Tolerances, as ||x - ref|| / ||ref|| against the FP32 reference on the same bf16 inputs:
- output 1e-2: the kernel accumulates in FP32 but rounds the softmax probabilities to
  bf16 before P.V and the output to bf16, each a 2^-9 relative rounding; about 3e-3 is
  expected.
- dq, dk 2e-2: the backward also rounds P and dP = P * (dO.V^T - delta) (after that
  cancellation) to bf16 before the dq / dk products, and dk accumulates with FP32 atomics
  before its bf16 cast; 5e-3 to 1e-2 is expected.
Seen on an H200 (benchmarks/results/gpu_test_errors.json): output <= 2.0e-3, dq <= 3.1e-3,
dk <= 3.0e-3 over every case, so both bounds keep a 3x to 6x margin. The worst errors are
written out again whenever GPU_TEST_RECORD names a file (conftest.py).
Forward results are also checked bit for bit where the kernel gets identical inputs;
backward results only numerically, since dK accumulates with atomics in any order.
"""

from types import ModuleType

import pytest
import torch

from backports.megatron import Action, apply
from backports.megatron.local_changes import _sparse_mla_adapter as adapter
from backports.megatron.local_changes import _sparse_mla_triton as fused
from backports.megatron.testing.prewarm import CompileCounter
from tests.conftest import BACKPORT_ID
from tests.gpu.conftest import SCALE
from tests.reference import sparse_mla_reference
from tests.reports import report_for

pytestmark = pytest.mark.gpu

OUT_TOL = 1e-2
GRAD_TOL = 2e-2
V = 512  # v_channels: the latent width, the first 512 channels of key


class _Spy:
    """Stands in for ``SparseMLA``: records what the kernel was given, then runs it."""

    def __init__(self, real):
        self.real = real
        self.calls = []

    def apply(self, q, kv, indices, scale):
        self.calls.append((q, kv, indices, scale))
        return self.real.apply(q, kv, indices, scale)


@pytest.fixture
def installed(tilelang_dsa: ModuleType, compiled_kernels) -> ModuleType:
    report = report_for(apply(), BACKPORT_ID)
    assert report.action is Action.INSTALLED, report
    assert report.evidence["mode"] == "local-changes"
    assert getattr(tilelang_dsa.fused_sparse_mla_absorbed, "__backport__", None)
    return tilelang_dsa


@pytest.fixture
def spy(installed: ModuleType, monkeypatch) -> _Spy:
    # Set after apply(): the probe's sniff swaps SparseMLA for a stand-in of its own.
    spy = _Spy(installed.SparseMLA)
    monkeypatch.setattr(installed, "SparseMLA", spy)
    return spy


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().float(), ref.detach().float()
    assert torch.isfinite(x).all(), "non-finite values"
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def _inputs(sq, sk, b, heads, width, topk, *, seed, holes=0.2, dtype=torch.int64):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    query = torch.randn(sq, b, heads, width, generator=gen, device="cuda").bfloat16()
    key = torch.randn(sk, b, 1, width, generator=gen, device="cuda").bfloat16()
    indices = torch.randint(0, sk, (b, sq, topk), generator=gen, device="cuda")
    indices[torch.rand(b, sq, topk, generator=gen, device="cuda") < holes] = -1
    return query, key, indices.to(dtype)


def _output_grad(sq, b, heads, *, seed):
    """A seeded FP32 output-gradient: dq / dk errors then compare across runs."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(sq, b, heads, V, generator=gen, device="cuda")


def _reference_with_grads(query, key, indices, grad):
    """FP32 reference output and its dq, dk for loss = sum(out * grad)."""
    q = query.detach().float().requires_grad_(True)
    k = key.detach().float().requires_grad_(True)
    with torch.device(q.device):  # the reference makes index tensors with the default device
        ref = sparse_mla_reference(q, k, indices, SCALE, V)
    (ref * grad).sum().backward()
    return ref.detach(), q.grad, k.grad


def _run(module, query, key, indices, grad=None):
    """Backport forward (and backward with ``grad``) on fresh leaves of the inputs."""
    q = query.detach().clone().requires_grad_(grad is not None)
    k = key.detach().clone().requires_grad_(grad is not None)
    out = module.fused_sparse_mla_absorbed(q, k, indices, SCALE, V)
    assert out is not None, "declined: the kernel path was not taken"
    if grad is not None:
        (out.float() * grad).sum().backward()
    return out.detach(), q.grad, k.grad


# -- the shape matrix ----------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("heads", [8, 16, 32, 64])
@pytest.mark.parametrize("topk", [64, 65, 127, 2051])
@pytest.mark.parametrize("width", [512, 576])
def test_matches_fp32_reference(installed, spy, error_record, width, topk, heads, batch):
    sq, sk = 300, 2300  # neither a multiple of 256: the kernel's sequence bucket pads both
    query, key, indices = _inputs(sq, sk, batch, heads, width, topk, seed=topk + heads)
    saved = [t.clone() for t in (query, key, indices)]
    grad = _output_grad(sq, batch, heads, seed=topk + heads + 1)

    out, dq, dk = _run(installed, query, key, indices, grad)
    ref, dq_ref, dk_ref = _reference_with_grads(query, key, indices, grad)

    assert out.shape == (sq, batch, heads, V) and out.dtype == torch.bfloat16
    assert dq.shape == query.shape and dk.shape == key.shape
    errors = {"out": _rel(out, ref), "dq": _rel(dq, dq_ref), "dk": _rel(dk, dk_ref)}
    error_record[f"matrix/w{width}/k{topk}/h{heads}/b{batch}"] = errors
    assert errors["out"] < OUT_TOL, errors
    assert errors["dq"] < GRAD_TOL and errors["dk"] < GRAD_TOL, errors
    for before, after in zip(saved, (query, key, indices), strict=True):
        assert torch.equal(before, after), "an input was modified"

    # What the real kernel was given, in upstream's layout: zero channels past the
    # caller's width, zero heads past the caller's, -1 past the caller's top-k, the scale.
    ((q_k, kv_k, idx_k, scale_k),) = spy.calls
    kernel_heads, padded = max(heads, 16), -(-topk // 64) * 64
    assert q_k.shape == (batch, sq, kernel_heads, 576) and kv_k.shape == (batch, sk, 1, 576)
    assert idx_k.shape == (batch, sq, 1, padded) and idx_k.dtype == torch.int32
    assert scale_k == SCALE
    assert torch.equal(q_k[:, :, :heads, :width], query.permute(1, 0, 2, 3))
    assert torch.equal(kv_k[..., :width], key.permute(1, 0, 2, 3))
    assert not q_k[..., width:].any() and not q_k[:, :, heads:].any()
    assert not kv_k[..., width:].any()
    assert torch.equal(idx_k[:, :, 0, :topk].long(), indices)
    assert (idx_k[..., topk:] == -1).all()


# -- empty rows and out-of-range indices ---------------------------------------------------


@pytest.mark.parametrize("heads", [8, 16])
@pytest.mark.parametrize("width", [512, 576])
def test_row_with_no_valid_slot_is_exactly_zero(installed, error_record, width, heads):
    sq, sk, b, topk = 300, 2300, 2, 127
    query, key, indices = _inputs(sq, sk, b, heads, width, topk, seed=7)
    empty = [(0, 0), (0, 7), (0, sq - 1), (1, 5)]
    for bi, s in empty:
        indices[bi, s] = -1
    grad = _output_grad(sq, b, heads, seed=8)

    out, dq, dk = _run(installed, query, key, indices, grad)
    ref, dq_ref, dk_ref = _reference_with_grads(query, key, indices, grad)

    for bi, s in empty:
        assert not out[s, bi].any(), f"row {s} of batch {bi}: output not exactly zero"
        assert not dq[s, bi].any(), f"row {s} of batch {bi}: q-gradient not exactly zero"
    assert dq[1, 0].any() and out[1, 0].any()
    errors = {"out": _rel(out, ref), "dq": _rel(dq, dq_ref), "dk": _rel(dk, dk_ref)}
    error_record[f"empty_rows/w{width}/h{heads}"] = errors
    assert errors["out"] < OUT_TOL and errors["dq"] < GRAD_TOL and errors["dk"] < GRAD_TOL


def _bad_values(dtype, sk):
    if dtype == torch.int32:
        return [-2, -3, -1000, -(2**31), sk, sk + 1, sk + 999, 2**31 - 1]
    return [-2, -3, -1000, -(2**40), sk, sk + 1, sk + 999, 2**31 + 5, 2**40]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_out_of_range_indices_are_empty_slots(installed, spy, error_record, dtype):
    """Negatives other than -1 would read key 0 and indices >= sk out of bounds."""
    sq, sk, b, heads, width, topk = 300, 2300, 2, 16, 512, 2051
    query, key, clean = _inputs(sq, sk, b, heads, width, topk, seed=11, dtype=dtype)
    gen = torch.Generator(device="cuda").manual_seed(12)
    bad = torch.tensor(_bad_values(dtype, sk), device="cuda", dtype=dtype)
    where = torch.rand(clean.shape, generator=gen, device="cuda") < 0.1
    where[1, 3] = True  # a row with nothing in range
    pick = torch.randint(0, bad.numel(), clean.shape, generator=gen, device="cuda")
    dirty = torch.where(where, bad[pick], clean)
    clean = clean.masked_fill(where, -1)
    grad = _output_grad(sq, b, heads, seed=12)

    out_dirty, dq, dk = _run(installed, query, key, dirty, grad)
    out_clean, _, _ = _run(installed, query, key, clean)

    # The kernel got the very indices it gets with -1 in those slots: nothing out of range
    # was read (reading key 0 or past the end would change the result).
    assert torch.equal(spy.calls[0][2], spy.calls[1][2])
    assert torch.equal(out_dirty, out_clean)
    assert not out_dirty[3, 1].any() and not dq[3, 1].any()
    ref, dq_ref, dk_ref = _reference_with_grads(query, key, dirty, grad)
    errors = {"out": _rel(out_dirty, ref), "dq": _rel(dq, dq_ref), "dk": _rel(dk, dk_ref)}
    error_record[f"out_of_range/{str(dtype).removeprefix('torch.')}"] = errors
    assert errors["out"] < OUT_TOL and errors["dq"] < GRAD_TOL and errors["dk"] < GRAD_TOL


@pytest.mark.parametrize("batch", [1, 2])
def test_keys_past_the_end_are_never_read(installed, spy, batch):
    """Width 576, sk a multiple of 256, NaN rows right past key's end: any output that read
    them would be NaN. At batch 1 the kernel reads the caller's q and key in place (their
    permute is already dense), so the NaN rows sit right after what it may read."""
    sq, sk, heads, topk = 300, 512, 16, 127
    query, _, indices = _inputs(sq, sk, batch, heads, 576, topk, seed=13)
    storage = torch.full((2 * sk, batch, 1, 576), float("nan"), device="cuda").bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(14)
    storage[:sk] = torch.randn(sk, batch, 1, 576, generator=gen, device="cuda").bfloat16()
    key = storage[:sk]
    dirty = indices.clone()
    dirty[:, :, ::3] = torch.randint(sk, 2 * sk, dirty[:, :, ::3].shape, device="cuda")

    out = installed.fused_sparse_mla_absorbed(query, key, dirty, SCALE, V)

    if batch == 1:
        assert spy.calls[0][1].data_ptr() == key.data_ptr(), "kernel did not read key in place"
        assert spy.calls[0][0].data_ptr() == query.data_ptr(), "kernel did not read q in place"
    assert torch.isfinite(out).all()
    clean = dirty.masked_fill(dirty >= sk, -1)
    assert torch.equal(out, installed.fused_sparse_mla_absorbed(query, key, clean, SCALE, V))


def test_fused_index_pass_matches_tensor_ops(installed):
    """The one-pass CUDA index conversion against the tensor-op path, bit for bit, with
    and without the bounds (index hygiene)."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    for dtype, sk in [
        (torch.int64, 3000),
        (torch.int32, 3000),
        (torch.int16, 3000),
        (torch.int16, 40000),
        (torch.int32, 2**31 - 1),
    ]:
        info = torch.iinfo(dtype)
        for topk in (64, 65, 2051):
            raw = torch.randint(-4, sk + 4, (2, 257, topk), generator=gen, device="cuda")
            raw = raw.clamp(info.min, info.max).to(dtype)
            raw[0, 0, :4] = torch.tensor([info.min, info.max, -1, 0], dtype=dtype)
            for indices in (raw, raw.transpose(0, 1).contiguous().transpose(0, 1)):
                for num_keys in (sk, None):
                    got = adapter.kernel_indices(indices, num_keys)
                    assert fused.disabled_because is None, fused.disabled_because
                    plain = adapter.kernel_indices(indices.cpu(), num_keys)
                    assert torch.equal(got.cpu(), plain), (dtype, sk, topk, num_keys)
                    assert got.shape == (2, 257, -(-topk // 64) * 64)  # [b, sq, topk']
                    assert got.unsqueeze(2).is_contiguous()
                    wide = indices.long()  # in int64: sk need not fit the indices' dtype
                    expect = (
                        wide.int()
                        if num_keys is None
                        else torch.where((wide >= 0) & (wide < sk), wide, -1)
                    )
                    assert torch.equal(got[..., :topk].long(), expect.long())
                    assert (got[..., topk:] == -1).all()


def test_fused_pad_pass_matches_plain_copy(installed):
    """The one-pass CUDA q / k layout pass against the two-op path, bit for bit: the
    caller's channels where they were, exact zeros after them, for strided callers too."""
    gen = torch.Generator(device="cuda").manual_seed(19)
    for shape in [(300, 2, 16, 512), (257, 1, 32, 512), (301, 3, 1, 512)]:
        x = torch.randn(shape, generator=gen, device="cuda").bfloat16()
        strided = x.transpose(0, 1).contiguous().transpose(0, 1)
        for src in (x, strided, x.new_full(shape, float("nan"))):
            got = adapter.to_kernel_layout(src)
            assert fused.disabled_because is None, fused.disabled_because
            plain = adapter.to_kernel_layout(src.cpu())
            assert got.shape == plain.shape == (*shape[:3], 576)
            assert got.permute(1, 0, 2, 3).is_contiguous()
            assert not got[..., 512:].any(), "padding channels not zero"
            # Compared as bits: NaN channels must come through as the very same NaNs.
            assert torch.equal(got.cpu().view(torch.int16), plain.view(torch.int16))
            assert torch.equal(got[..., :512].view(torch.int16), src.view(torch.int16))


# -- the local changes change nothing the kernel computes ----------------------------------


@pytest.mark.parametrize(
    "batch, heads, width, topk",
    [(1, 16, 512, 2051), (2, 16, 512, 65), (2, 8, 576, 127), (1, 32, 512, 64), (3, 16, 512, 2051)],
)
def test_local_changes_are_bit_exact_with_upstream_only(
    tilelang_dsa, compiled_kernels, monkeypatch, error_record, batch, heads, width, topk
):
    sq, sk = 300, 2300
    query, key, indices = _inputs(sq, sk, batch, heads, width, topk, seed=41 + batch)
    grad = _output_grad(sq, batch, heads, seed=42)
    runs = {}
    for upstream_only in (False, True):
        apply(upstream_only=upstream_only)
        spy = _Spy(tilelang_dsa.SparseMLA)
        monkeypatch.setattr(tilelang_dsa, "SparseMLA", spy)
        runs[upstream_only] = (*_run(tilelang_dsa, query, key, indices, grad), spy.calls[0])
        monkeypatch.undo()
    (out_l, dq_l, dk_l, call_l), (out_u, dq_u, dk_u, call_u) = runs[False], runs[True]
    for mine, theirs in zip(call_l, call_u, strict=True):  # q, kv, indices, scale
        if isinstance(mine, torch.Tensor):
            assert _layout(mine) == _layout(theirs)
            assert torch.equal(mine, theirs)
        else:
            assert mine == theirs
    assert torch.equal(out_l, out_u), "forward output differs from upstream's function alone"
    # dK sums with atomics in any order: the backward agrees numerically only.
    errors = {"dq_vs_upstream_only": _rel(dq_l, dq_u), "dk_vs_upstream_only": _rel(dk_l, dk_u)}
    error_record[f"local_vs_upstream/b{batch}/h{heads}/w{width}/k{topk}"] = errors
    assert errors["dq_vs_upstream_only"] < 1e-3 and errors["dk_vs_upstream_only"] < 1e-3


def _layout(t: torch.Tensor) -> tuple:
    """Shape and the strides that address memory (a size-1 dimension's stride does not)."""
    return tuple(t.shape), tuple(st for st, n in zip(t.stride(), t.shape, strict=True) if n > 1)


def test_batch_sizes_share_one_kernel_set(installed):
    """After batch 1, batches 2, 3, 4 compile no new TileLang kernel: upstream's layout has
    one key group at every batch size (the prewarm compiled kv_group 1 kernels only)."""
    query, key, indices = _inputs(512, 512, 1, 16, 512, 2051, seed=51)
    _run(installed, query, key, indices, _output_grad(512, 1, 16, seed=52))
    counter = CompileCounter().attach()
    for batch in (2, 3, 4):
        query, key, indices = _inputs(512, 512, batch, 16, 512, 2051, seed=51 + batch)
        _run(installed, query, key, indices, _output_grad(512, batch, 16, seed=52))
    torch.cuda.synchronize()
    assert counter.count == 0, f"{counter.count} TileLang kernels compiled at batch 2-4"


# -- megatron's own entry point, at the GLM-5.3-Flash shape --------------------------------


class _Config:
    """What dsa_kernels reads from a TransformerConfig."""

    attention_backend = "auto"
    dsa_kernel_backend = "tilelang"


def _causal_topk(sq, topk, seed):
    """Row s picks min(topk, s + 1) distinct keys in [0, s], the rest -1: int32, as
    megatron's TileLang indexer returns them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(sq, sq, generator=gen, device="cuda")
    scores.masked_fill_(torch.ones_like(scores, dtype=torch.bool).triu_(1), float("-inf"))
    values, indices = scores.topk(topk, dim=-1)
    return indices.masked_fill(values == float("-inf"), -1).int().unsqueeze(0)


def _chunked_reference(query, key, indices, grad, rows=512):
    q = query.detach().float().requires_grad_(True)
    k = key.detach().float().requires_grad_(True)
    outs = []
    for s0 in range(0, q.size(0), rows):
        s1 = min(s0 + rows, q.size(0))
        with torch.device(q.device):
            ref = sparse_mla_reference(q[s0:s1], k, indices[:, s0:s1], SCALE, V)
        (ref * grad[s0:s1]).sum().backward()
        outs.append(ref.detach())
    return torch.cat(outs), q.grad, k.grad


def test_glm_flash_shape_through_dsa_kernels(installed, spy, error_record):
    from megatron.core.transformer.experimental_attention_variant import dsa, dsa_kernels

    sq, heads, width, topk = 4096, 16, 512, 2051
    gen = torch.Generator(device="cuda").manual_seed(21)
    query = torch.randn(sq, 1, heads, width, generator=gen, device="cuda").bfloat16()
    key = torch.randn(sq, 1, 1, width, generator=gen, device="cuda").bfloat16()
    indices = _causal_topk(sq, topk, seed=22)
    grad = torch.randn(sq, 1, heads, V, generator=gen, device="cuda")

    config = _Config()
    assert dsa_kernels.use_fused_dsa_kernels(config)
    q = query.clone().requires_grad_(True)
    k = key.clone().requires_grad_(True)
    out = dsa_kernels.run_fused_absorbed_sparse_attention(config, q, k, indices, SCALE, V)
    assert out is not None and out.shape == (sq, 1, heads, V)
    ((q_k, _, idx_k, _),) = spy.calls
    assert q_k.shape == (1, sq, 16, 576) and idx_k.shape == (1, sq, 1, 2112)
    (out.float() * grad).sum().backward()

    ref, dq_ref, dk_ref = _chunked_reference(query, key, indices, grad)
    dense = dsa._unfused_absorbed_dsa_fn(query, key, indices, SCALE, V)
    errors = {
        "out": _rel(out, ref),
        "dq": _rel(q.grad, dq_ref),
        "dk": _rel(k.grad, dk_ref),
        "out_vs_dense_fallback": _rel(out, dense),
    }
    error_record["glm_flash_4k"] = errors
    assert errors["out"] < OUT_TOL and errors["out_vs_dense_fallback"] < OUT_TOL, errors
    assert errors["dq"] < GRAD_TOL and errors["dk"] < GRAD_TOL, errors


# -- replay --------------------------------------------------------------------------------


def test_forward_bit_exact_on_replay_and_beside_a_busy_stream(installed, error_record):
    sq, sk, b, heads, width, topk = 1000, 3000, 2, 16, 512, 2051
    query, key, indices = _inputs(sq, sk, b, heads, width, topk, seed=31)
    grad = _output_grad(sq, b, heads, seed=32)

    first, dq1, dk1 = _run(installed, query, key, indices, grad)
    second, dq2, dk2 = _run(installed, query, key, indices, grad)
    assert torch.equal(first, second)

    side = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda").bfloat16()
    c = torch.empty_like(a)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(24):  # tens of milliseconds of matrix products on another stream
            torch.matmul(a, a, out=c)
    third = installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, V)
    overlapped = not side.query()
    torch.cuda.synchronize()
    assert torch.equal(first, third)

    # Backward: dK sums over atomics in any order, so two runs agree numerically only.
    errors = {"replay_dq": _rel(dq2, dq1), "replay_dk": _rel(dk2, dk1)}
    error_record["replay"] = {**errors, "side_stream_still_busy": float(overlapped)}
    assert errors["replay_dq"] < GRAD_TOL and errors["replay_dk"] < GRAD_TOL, errors
