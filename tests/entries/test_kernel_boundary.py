"""What reaches ``SparseMLA``, as upstream's own CPU adapter tests check it: a stub kernel.

The stub records its inputs and computes ``out = 2 * q[..., :512] + kv[..., :512]`` (key
row s added to query row s), differentiable, so the expected output and gradients follow
from the caller's tensors alone: nothing here reads the code under test. Both modes must
hand the kernel the same thing: q ``[b, sq, max(h, 16), 576]``, kv ``[b, sk, 1, 576]``,
indices int32 ``[b, sq, 1, topk']`` (top-k padded with -1 to a multiple of 64), the
caller's softmax scale; and return ``[sq, b, h, 512]``.
"""

from types import ModuleType

import pytest
import torch

from backports.megatron import Action, apply
from tests.conftest import BACKPORT_ID
from tests.reports import report_for

SCALE = 0.0625


class StubSparseMLA:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def apply(self, q, kv, indices, scale):
        self.calls.append(
            {
                "q": q.detach().clone(),
                "kv": kv.detach().clone(),
                "indices": indices.clone(),
                "scale": scale,
                "contiguous": (q.is_contiguous(), kv.is_contiguous(), indices.is_contiguous()),
            }
        )
        out = 2 * q[..., :512] + kv[..., :512]  # kv's one head broadcasts over q's heads
        return out, torch.zeros(q.shape[:3], dtype=torch.float32)


@pytest.fixture
def stub(tilelang_dsa: ModuleType, monkeypatch: pytest.MonkeyPatch) -> StubSparseMLA:
    kernel = StubSparseMLA()
    monkeypatch.setattr(tilelang_dsa, "SparseMLA", kernel)
    return kernel


@pytest.fixture(params=[False, True], ids=["local-changes", "upstream-only"])
def installed(request: pytest.FixtureRequest, tilelang_dsa: ModuleType, stub) -> ModuleType:
    report = report_for(apply(BACKPORT_ID, upstream_only=request.param), BACKPORT_ID)
    assert report.action is Action.INSTALLED
    return tilelang_dsa


def _inputs(s, b, heads, width, topk, seed=0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(s, b, heads, width, generator=gen).to(torch.bfloat16)
    key = torch.randn(s, b, 1, width, generator=gen).to(torch.bfloat16)
    indices = torch.randint(-1, s, (b, s, topk), generator=gen)
    return query, key, indices


@pytest.mark.parametrize("topk", [64, 65, 127, 2051])
@pytest.mark.parametrize("width", [512, 576])
@pytest.mark.parametrize("heads", [8, 16, 32])
@pytest.mark.parametrize("b", [1, 2])
def test_kernel_receives_upstreams_layout_and_values(installed, stub, b, heads, width, topk):
    s = 5
    query, key, indices = _inputs(s, b, heads, width, topk)
    query.requires_grad_(True)
    key.requires_grad_(True)

    out = installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512)

    (call,) = stub.calls
    kernel_heads, padded = max(heads, 16), -(-topk // 64) * 64
    q, kv, idx = call["q"], call["kv"], call["indices"]
    assert (q.shape, q.dtype) == ((b, s, kernel_heads, 576), torch.bfloat16)
    assert (kv.shape, kv.dtype) == ((b, s, 1, 576), torch.bfloat16)
    assert (idx.shape, idx.dtype) == ((b, s, 1, padded), torch.int32)
    assert call["contiguous"] == (True, True, True)
    assert call["scale"] == SCALE
    assert torch.equal(q[:, :, :heads, :width], query.detach().permute(1, 0, 2, 3))
    assert not q[:, :, heads:].any() and not q[..., width:].any()
    assert torch.equal(kv[..., :width], key.detach().permute(1, 0, 2, 3))
    assert not kv[..., width:].any()
    assert torch.equal(idx[:, :, 0, :topk].long(), indices)
    assert (idx[..., topk:] == -1).all()

    # The output: the stub's, real heads only, in the caller's [s, b, h, 512].
    expected = 2 * query.detach()[..., :512] + key.detach()[..., :512]
    assert out.shape == (s, b, heads, 512) and out.is_contiguous()
    assert torch.equal(out, expected)

    # Gradients reach the caller's q and k, through the real heads and channels only.
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out.backward(grad)
    grad_q = torch.zeros_like(query)
    grad_q[..., :512] = 2 * grad
    assert torch.equal(query.grad, grad_q)
    grad_k = torch.zeros(s, b, 1, width)
    grad_k[..., :512] = grad.float().sum(2, keepdim=True)
    assert torch.allclose(key.grad.float(), grad_k, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("heads", [8, 16, 32])
def test_every_batch_size_uses_one_kernel_configuration(installed, stub, heads):
    """TileLang compiles a kernel per (heads, key groups, width): batch 1..4 must share one."""
    for b in (1, 2, 3, 4):
        query, key, indices = _inputs(4, b, heads, 512, 65)
        assert installed.fused_sparse_mla_absorbed(query, key, indices, SCALE, 512) is not None
    seen = {(c["q"].shape[2:], c["kv"].shape[2:], c["indices"].shape[2]) for c in stub.calls}
    assert seen == {((max(heads, 16), 576), (1, 576), 1)}
    assert [c["q"].size(0) for c in stub.calls] == [1, 2, 3, 4]
