"""Property: on any input the installed function never raises, never writes its inputs,
and returns None or the FP32 reference's answer (tests/reference.py)."""

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from backports.megatron import apply
from tests.conftest import BACKPORT_ID
from tests.reference import sparse_mla_reference

SCALE = 0.0625
FLOAT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
INDEX_DTYPES = [torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32]


@dataclass(frozen=True)
class Case:
    sq: int
    sk: int
    b: int
    heads: int
    width: int
    key_width: int
    topk: int
    v_channels: int = 512
    q_dtype: torch.dtype = torch.bfloat16
    k_dtype: torch.dtype = torch.bfloat16
    index_dtype: torch.dtype = torch.int64
    low: int = 0
    high: int = 1
    seed: int = 0
    transpose_query: bool = False  # a non-contiguous view, as a caller's permute gives

    def kernel_takes_it(self) -> bool:
        """What #7617 hands the kernel: bf16 q and k of one width, 512 or 576, v_channels
        512, heads padded up to 16 a power of two. Index dtype and range do not matter."""
        kernel_heads = max(self.heads, 16)
        return (
            self.q_dtype == self.k_dtype == torch.bfloat16
            and self.width == self.key_width in (512, 576)
            and self.v_channels == 512
            and kernel_heads & (kernel_heads - 1) == 0
        )

    def build(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        shape = (self.b, self.sq) if self.transpose_query else (self.sq, self.b)
        query = torch.randn(*shape, self.heads, self.width, generator=gen).to(self.q_dtype)
        if self.transpose_query:
            query = query.transpose(0, 1)
        key = torch.randn(self.sk, self.b, 1, self.key_width, generator=gen).to(self.k_dtype)
        indices = torch.randint(self.low, self.high, (self.b, self.sq, self.topk), generator=gen)
        if self.index_dtype == torch.int16:
            indices = indices.clamp(-(2**15), 2**15 - 1)
        if self.index_dtype == torch.uint8:
            indices = indices.clamp(0, 255)
        return query, key, indices.to(self.index_dtype)


@st.composite
def cases(draw):
    sk = draw(st.integers(1, 12))
    width = draw(st.sampled_from([512, 576, 512, 576, 64, 640]))
    q_dtype = draw(st.sampled_from(FLOAT_DTYPES + [torch.bfloat16] * 3))
    low, high = draw(st.sampled_from([(-1, sk), (-(2**40), 2**40), (-3, sk + 3), (0, sk)]))
    return Case(
        sq=draw(st.integers(1, 6)),
        sk=sk,
        b=draw(st.integers(1, 2)),
        heads=draw(st.sampled_from([1, 2, 3, 4, 8, 12, 16, 17, 32, 48, 64])),
        width=width,
        key_width=draw(st.sampled_from([width, width, width, 512, 576])),
        topk=draw(st.integers(1, 200)),
        v_channels=draw(st.sampled_from([512, 512, 512, 448])),
        q_dtype=q_dtype,
        k_dtype=draw(st.sampled_from([q_dtype, q_dtype, torch.bfloat16, torch.float32])),
        index_dtype=draw(st.sampled_from(INDEX_DTYPES + [torch.int64] * 3)),
        low=low,
        high=high,
        seed=draw(st.integers(0, 2**31 - 1)),
        transpose_query=draw(st.booleans()),
    )


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_never_raises_never_writes_and_is_none_or_right(tilelang_dsa, fake_kernel, case):
    apply(BACKPORT_ID)
    query, key, indices = case.build()
    saved = [t.clone() for t in (query, key, indices)]

    out = tilelang_dsa.fused_sparse_mla_absorbed(query, key, indices, SCALE, case.v_channels)

    for before, after in zip(saved, (query, key, indices), strict=True):
        assert torch.equal(before, after)
    event("declined" if out is None else "computed")
    # Declines exactly what the kernel cannot take (a function that always returns None
    # fails here, as does one that accepts what the kernel does not support).
    assert (out is not None) == case.kernel_takes_it(), case
    if out is None:
        return
    assert out.shape == (case.sq, case.b, case.heads, 512)
    ref = sparse_mla_reference(query, key, indices, SCALE, 512)
    err = (out.float() - ref).norm() / ref.norm().clamp_min(1e-6)
    assert float(err) < 2e-2 or float((out.float() - ref).abs().max()) < 1e-2


@pytest.mark.parametrize("heads", [1, 3, 16, 17])
def test_small_head_counts_are_padded_to_16(tilelang_dsa, fake_kernel, heads):
    apply(BACKPORT_ID)
    query, key, indices = Case(
        sq=2, sk=5, b=1, heads=heads, width=512, key_width=512, topk=3, high=5
    ).build()
    out = tilelang_dsa.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512)
    if heads == 17:  # 17 heads need no padding but are not a power of two: declined
        assert out is None
        return
    assert out is not None and out.shape == (2, 1, heads, 512)
    assert fake_kernel.calls[-1].q.shape[2] == 16
