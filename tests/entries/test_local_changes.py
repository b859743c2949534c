"""The local changes around #7617's vendored function: named, switchable, invisible to the kernel.

Each local change is checked against the vendored function alone (upstream's behaviour):
for valid inputs the kernel must receive the same tensors, bit for bit, and the output and
gradients must be the same bits. Then what each one is for: index hygiene keeps every
index outside [0, sk) from the kernel; lean copies write each kernel input once.
"""

import json
from types import ModuleType

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from backports.megatron import Action, Verdict, apply, cli, status
from backports.megatron.catalog import MEGATRON_LM_7617
from backports.megatron.local_changes import _sparse_mla_adapter as adapter
from backports.megatron.local_changes import wrap_all
from backports.megatron.local_changes.sparse_mla import INDEX_HYGIENE, LEAN_COPIES
from backports.megatron.testing.fake_kernel import FakeSparseMLA
from backports.megatron.vendored import load_replacement
from tests.conftest import BACKPORT_ID, TILELANG_DSA
from tests.reports import report_for

SCALE = 0.0625
SUBSETS = {
    "index-hygiene": (INDEX_HYGIENE,),
    "lean-copies": (LEAN_COPIES,),
    "both": (INDEX_HYGIENE, LEAN_COPIES),
}


@pytest.fixture
def deterministic():
    """The fake kernel's dK sums with index_put(accumulate=True), which on CPU adds in a
    thread-dependent order (the real kernel's atomics do too): ask for the fixed order."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def vendored(tilelang_dsa: ModuleType):
    return load_replacement(MEGATRON_LM_7617.vendored, TILELANG_DSA)


def _inputs(sq, sk, b, heads, width, topk, seed=0, low=-1):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(sq, b, heads, width, generator=gen).to(torch.bfloat16)
    key = torch.randn(sk, b, 1, width, generator=gen).to(torch.bfloat16)
    indices = torch.randint(low, sk, (b, sq, topk), generator=gen)
    return query, key, indices


def _run(function, kernel, query, key, indices, seed=1):
    """Forward and backward; returns (output, dq, dk, the kernel's one call)."""
    q = query.clone().requires_grad_(True)
    k = key.clone().requires_grad_(True)
    before = len(kernel.calls)
    out = function(q, k, indices, SCALE, 512)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (out.float() * grad).sum().backward()
    (call,) = kernel.calls[before:]
    return out, q.grad, k.grad, call


# ---- declared, listed, switchable ---------------------------------------------------------


def test_the_catalog_declares_named_local_changes_with_reasons():
    changes = MEGATRON_LM_7617.local_changes
    assert [c.name for c in changes] == ["index-hygiene", "lean-copies"]
    for change in changes:
        assert change.reason and "\n" not in change.reason
        assert change.to_dict() == {"name": change.name, "reason": change.reason}


def test_status_json_lists_them_and_the_mode(tilelang_dsa, capsys):
    assert cli.main(["status", "--json"]) == 0
    report = report_for(json.loads(capsys.readouterr().out), BACKPORT_ID)
    listed = report["evidence"]["local_changes"]
    assert [(c["name"], c["reason"]) for c in listed] == [
        (c.name, c.reason) for c in MEGATRON_LM_7617.local_changes
    ]
    assert all(c["active"] for c in listed)
    assert report["evidence"]["mode"] == "local-changes"


def test_upstream_only_by_argument_installs_the_vendored_function_alone(tilelang_dsa, vendored):
    report = report_for(apply(BACKPORT_ID, upstream_only=True), BACKPORT_ID)
    installed = tilelang_dsa.fused_sparse_mla_absorbed
    assert report.action is Action.INSTALLED and report.evidence["mode"] == "upstream-only"
    assert not any(c["active"] for c in report.evidence["local_changes"])
    assert "upstream only" in report.reason
    assert installed.__code__ is vendored.__code__
    seen = report_for(status(), BACKPORT_ID)
    assert seen.action is Action.ALREADY_INSTALLED and seen.evidence["mode"] == "upstream-only"


def test_upstream_only_by_environment(tilelang_dsa, vendored, monkeypatch):
    monkeypatch.setenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY", "1")
    would = report_for(status(), BACKPORT_ID)
    assert would.action is Action.WOULD_INSTALL and would.evidence["mode"] == "upstream-only"
    report = report_for(apply(BACKPORT_ID), BACKPORT_ID)
    assert report.evidence["mode"] == "upstream-only"
    assert tilelang_dsa.fused_sparse_mla_absorbed.__code__ is vendored.__code__


def test_default_mode_wraps_and_asking_for_the_other_mode_swaps(tilelang_dsa, vendored):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    report = report_for(apply(BACKPORT_ID), BACKPORT_ID)
    wrapped = tilelang_dsa.fused_sparse_mla_absorbed
    assert report.evidence["mode"] == "local-changes"
    assert wrapped.__code__ is not vendored.__code__
    assert wrapped.__backport__ == BACKPORT_ID and wrapped.__wrapped__ is original
    swapped = report_for(apply(BACKPORT_ID, upstream_only=True), BACKPORT_ID)
    assert swapped.action is Action.INSTALLED and swapped.verdict is Verdict.NEEDED
    assert tilelang_dsa.fused_sparse_mla_absorbed.__code__ is vendored.__code__
    assert tilelang_dsa.fused_sparse_mla_absorbed.__wrapped__ is original
    again = report_for(apply(BACKPORT_ID, upstream_only=True), BACKPORT_ID)
    assert again.action is Action.ALREADY_INSTALLED


# ---- never visible at the kernel for valid inputs ----------------------------------------


@pytest.mark.parametrize("subset", list(SUBSETS))
@pytest.mark.parametrize(
    "b, heads, width, topk",
    [(1, 16, 512, 2051), (2, 16, 512, 65), (2, 8, 512, 64), (1, 32, 576, 127), (2, 4, 576, 65)],
)
def test_same_kernel_inputs_and_bits_as_the_vendored_function_alone(
    vendored, fake_kernel, deterministic, subset, b, heads, width, topk
):
    query, key, indices = _inputs(sq=5, sk=11, b=b, heads=heads, width=width, topk=topk)
    alone = _run(vendored, fake_kernel, query, key, indices)
    wrapped = _run(wrap_all(vendored, SUBSETS[subset]), fake_kernel, query, key, indices)
    (out_a, dq_a, dk_a, call_a), (out_w, dq_w, dk_w, call_w) = alone, wrapped
    for name in ("q", "kv", "indices"):
        a, w = getattr(call_a, name), getattr(call_w, name)
        assert (a.shape, a.dtype) == (w.shape, w.dtype), name
        assert torch.equal(a, w), name
    assert call_a.scale == call_w.scale == SCALE
    assert out_w.is_contiguous() == out_a.is_contiguous()
    for a, w in ((out_a, out_w), (dq_a, dq_w), (dk_a, dk_w)):
        assert a.shape == w.shape and a.dtype == w.dtype
        assert torch.equal(a, w)


@pytest.mark.parametrize("subset", list(SUBSETS))
def test_declined_calls_are_declined_as_upstream_declines_them(vendored, fake_kernel, subset):
    query, key, indices = _inputs(sq=3, sk=5, b=1, heads=24, width=512, topk=65)
    function = wrap_all(vendored, SUBSETS[subset])
    assert vendored(query, key, indices, SCALE, 512) is None  # 24 heads: not a kernel size
    assert function(query, key, indices, SCALE, 512) is None
    assert function(query[..., :256], key[..., :256], indices, SCALE, 512) is None
    assert fake_kernel.calls == []


# ---- index hygiene -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.float32])
@pytest.mark.parametrize("bad", [-2, -7, 11, 12, 2**31 + 3])
def test_index_hygiene_keeps_out_of_range_indices_from_the_kernel(
    vendored, fake_kernel, dtype, bad
):
    if dtype == torch.int16 and bad > 2**15 - 1:
        pytest.skip("not an int16 value")
    query, key, indices = _inputs(sq=3, sk=11, b=2, heads=16, width=512, topk=65, low=0)
    indices[1, 2, :4] = bad
    indices = indices.to(dtype)
    saved = indices.clone()
    out = wrap_all(vendored, (INDEX_HYGIENE,))(query, key, indices, SCALE, 512)
    assert out is not None
    (call,) = fake_kernel.calls
    assert (call.indices[1, 2, 0, :4] == -1).all()
    assert torch.equal(call.indices[0, :, 0, :65].long(), saved[0].long())
    assert torch.equal(indices, saved)  # the caller's tensor is not written


@pytest.mark.parametrize(
    "dtype, num_keys", [(torch.int16, 40000), (torch.uint8, 300), (torch.int32, 2**31 - 1)]
)
def test_index_hygiene_with_more_keys_than_the_index_dtype_holds(dtype, num_keys):
    """Every value of a narrow dtype in [0, num_keys) stays, however narrow the dtype.
    (A GPU run found the plain path turning all of them into -1: torch casts the bound
    to the indices' dtype, and 40000 wraps negative in int16.)"""
    info = torch.iinfo(dtype)
    values = torch.tensor([info.min, -1, 0, 1, info.max - 1, info.max]).clamp(info.min)
    indices = values.to(dtype).view(1, 1, -1)
    got = adapter.kernel_indices(indices, num_keys)[0, 0, : values.numel()]
    inside = (values >= 0) & (values < num_keys)  # in int64, whatever the dtype
    expect = torch.where(inside, values, -1)
    assert got.tolist() == expect.tolist()


def test_without_index_hygiene_the_kernel_gets_the_bad_index(vendored, fake_kernel):
    """Why the local change exists: upstream hands an index >= sk on as it is."""
    query, key, indices = _inputs(sq=3, sk=11, b=1, heads=16, width=512, topk=65, low=0)
    indices[0, 1, 0] = 11
    with pytest.raises(AssertionError, match="out-of-bounds"):
        vendored(query, key, indices, SCALE, 512)


# ---- lean copies ---------------------------------------------------------------------------


class BytesWritten(TorchDispatchMode):
    """Bytes written by every aten op: its in-place targets, else its new results."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        name = schema.name.split("::")[-1]
        if name in ("empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided"):
            return out
        mutated = [
            a
            for a, arg in zip(args, schema.arguments, strict=False)
            if arg.alias_info is not None and arg.alias_info.is_write
        ]
        results = [] if mutated else (out if isinstance(out, (tuple, list)) else [out])
        fresh = [
            r
            for r, ret in zip(results, schema.returns, strict=False)
            if isinstance(r, torch.Tensor) and ret.alias_info is None
        ]
        self.written += sum(t.numel() * t.element_size() for t in (*mutated, *fresh))
        return out


class _CountingKernel(FakeSparseMLA):
    """The fake kernel, counting what was written before it was called."""

    def __init__(self, counter: BytesWritten) -> None:
        super().__init__()
        self.counter = counter
        self.before = 0

    def apply(self, q, kv, indices, scale):
        self.before = self.counter.written
        with torch.utils._python_dispatch._disable_current_modes():
            return super().apply(q, kv, indices, scale)


def _bytes_written(function, tilelang_dsa, monkeypatch, query, key, indices):
    """(forward before the kernel, forward in all, backward) bytes written by aten ops."""
    counter = BytesWritten()
    kernel = _CountingKernel(counter)
    monkeypatch.setattr(tilelang_dsa, "SparseMLA", kernel)
    q, k = query.clone().requires_grad_(True), key.clone().requires_grad_(True)
    with counter:
        out = function(q, k, indices, SCALE, 512)
    forward = counter.written
    grad = torch.ones_like(out)
    backward = BytesWritten()
    with backward:
        out.backward(grad)
    return kernel.before, forward, backward.written


@pytest.mark.parametrize("b, heads", [(1, 16), (2, 16), (2, 32)])
def test_lean_copies_write_each_kernel_input_once(vendored, tilelang_dsa, monkeypatch, b, heads):
    sq, sk, topk = 6, 9, 65
    query, key, indices = _inputs(sq, sk, b, heads, 512, topk, low=0)
    lean = _bytes_written(
        wrap_all(vendored, (LEAN_COPIES,)), tilelang_dsa, monkeypatch, query, key, indices
    )
    alone = _bytes_written(vendored, tilelang_dsa, monkeypatch, query, key, indices)
    kernel_inputs = 2 * b * sq * heads * 576 + 2 * b * sk * 576 + 4 * b * sq * 128
    assert lean[0] == kernel_inputs
    # Upstream's function pads, then makes the permuted tensors contiguous: more, and
    # never less in all or in the backward (the kernel's own work is the same in both).
    assert alone[0] > kernel_inputs
    assert lean[1] < alone[1] and lean[2] <= alone[2]


@pytest.mark.parametrize("b, width", [(1, 512), (2, 512), (2, 576)])
def test_lean_copies_never_write_more_with_few_heads(vendored, tilelang_dsa, monkeypatch, b, width):
    query, key, indices = _inputs(6, 9, b, 8, width, 65, low=0)
    lean = _bytes_written(
        wrap_all(vendored, (LEAN_COPIES,)), tilelang_dsa, monkeypatch, query, key, indices
    )
    alone = _bytes_written(vendored, tilelang_dsa, monkeypatch, query, key, indices)
    assert lean[1] <= alone[1] and lean[2] <= alone[2]


# ---- the output ----------------------------------------------------------------------------


class _Bf16CopiesAfterKernel(TorchDispatchMode):
    """bf16 elements that copy ops write after the kernel returns (a word copy moves the
    same bytes as complex128 or int64 and is not counted)."""

    COPIES = frozenset({torch.ops.aten.copy_.default, torch.ops.aten.clone.default})

    def __init__(self) -> None:
        super().__init__()
        self.kernel_returned = False
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.kernel_returned and func in self.COPIES and out.dtype == torch.bfloat16:
            self.elements += out.numel()
        return out


class _KernelTellingMode(FakeSparseMLA):
    def __init__(self, mode: _Bf16CopiesAfterKernel, module: ModuleType) -> None:
        super().__init__()
        self.mode, self.module, self.live_during_call = mode, module, []

    def apply(self, q, kv, indices, scale):
        self.live_during_call.append(self.module.SparseMLA is self)
        with torch.utils._python_dispatch._disable_current_modes():
            result = super().apply(q, kv, indices, scale)
        self.mode.kernel_returned = True
        return result


@pytest.mark.parametrize("b, heads, width", [(2, 16, 512), (3, 32, 576)])
def test_lean_copies_return_the_output_without_an_element_wise_copy(
    vendored, tilelang_dsa, monkeypatch, b, heads, width
):
    """Upstream's function makes the kernel's [b, s] output contiguous in [s, b] order,
    bf16 element by element; under lean copies it arrives in that order, moved as words.
    The live module's SparseMLA stays what it was during the call (nothing swapped)."""
    query, key, indices = _inputs(7, 9, b, heads, width, 65, low=0)
    results = {}
    for name, function in (("alone", vendored), ("lean", wrap_all(vendored, (LEAN_COPIES,)))):
        mode = _Bf16CopiesAfterKernel()
        kernel = _KernelTellingMode(mode, tilelang_dsa)
        monkeypatch.setattr(tilelang_dsa, "SparseMLA", kernel)
        with mode:
            out = function(query, key, indices, SCALE, 512)
        assert kernel.live_during_call == [True]
        assert out.shape == (7, b, heads, 512) and out.is_contiguous()
        results[name] = (out, mode.elements)
    assert results["alone"][1] == out.numel()  # why the local change exists
    assert results["lean"][1] == 0
    assert torch.equal(results["lean"][0], results["alone"][0])


def test_lean_copies_keep_the_element_wise_output_copy_with_few_heads(
    vendored, tilelang_dsa, monkeypatch
):
    """Below 16 heads the vendored function drops the padded heads first; a word-order
    output would be copied twice, so the kernel is seen as it is."""
    query, key, indices = _inputs(7, 9, 2, 8, 512, 65, low=0)
    mode = _Bf16CopiesAfterKernel()
    monkeypatch.setattr(tilelang_dsa, "SparseMLA", _KernelTellingMode(mode, tilelang_dsa))
    with mode:
        out = wrap_all(vendored, (LEAN_COPIES,))(query, key, indices, SCALE, 512)
    assert mode.elements == out.numel()


def test_lean_copies_leave_the_vendored_function_and_module_untouched(vendored, fake_kernel):
    """The caller-layout output comes from a private copy of the vendored function."""
    live_target = vendored.__globals__["_live_target"]
    function = wrap_all(vendored, (LEAN_COPIES,))
    query, key, indices = _inputs(5, 9, 2, 16, 512, 64, low=0)
    function(query, key, indices, SCALE, 512)
    assert vendored.__globals__["_live_target"] is live_target
    assert vendored.__globals__["_live_target"]().SparseMLA is fake_kernel
