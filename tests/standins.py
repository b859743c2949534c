"""Stand-ins for other versions of ``fused_sparse_mla_absorbed``, for the probe's verdicts.

Each is what another megatron-core release would have in the real module: compiled with the
module's file name and run with the module's own globals, so it reads ``SparseMLA`` and
``torch`` as module globals exactly as upstream's code does (and as the probe's private
globals see them). A function defined in this test file instead would be, rightly, a
foreign replacement to the probe. They are deliberately small: the probe only watches what
reaches the kernel.
"""

import dataclasses
import importlib
import types
from functools import cache

import pytest
from packaging.version import Version

from tests.conftest import TILELANG_DSA

_SOURCE = '''
def fixed_upstream(query, key, topk_indices, softmax_scale, v_channels):
    """Behaves like a megatron-core that merged #7617 (pads 512 -> 576 and top-k)."""
    if SparseMLA is None or query.size(-1) not in (512, 576) or v_channels != 512:
        return None
    pad = torch.nn.functional.pad
    if query.size(-1) == 512:
        query, key = pad(query, (0, 64)), pad(key, (0, 64))
    heads = query.size(2)
    q = query.permute(1, 0, 2, 3)
    if heads < 16:
        q = pad(q, (0, 0, 0, 16 - heads))
    indices = topk_indices.unsqueeze(2).to(torch.int32)
    indices = pad(indices, (0, -indices.size(-1) % 64), value=-1)
    out, _ = SparseMLA.apply(
        q.contiguous(), key.permute(1, 0, 2, 3).contiguous(), indices, softmax_scale
    )
    return out[:, :, :heads].permute(1, 0, 2, 3).contiguous()


def topk_padding_only(query, key, topk_indices, softmax_scale, v_channels):
    """Like upstream after #7522: unaligned top-k is padded, NoPE width 512 still declined."""
    if SparseMLA is None or query.size(-1) != 576 or v_channels != 512:
        return None
    pad = torch.nn.functional.pad
    heads = query.size(2)
    q = query.permute(1, 0, 2, 3)
    if heads < 16:
        q = pad(q, (0, 0, 0, 16 - heads))
    indices = topk_indices.unsqueeze(2).to(torch.int32)
    indices = pad(indices, (0, -indices.size(-1) % 64), value=-1)
    out, _ = SparseMLA.apply(
        q.contiguous(), key.permute(1, 0, 2, 3).contiguous(), indices, softmax_scale
    )
    return out[:, :, :heads].permute(1, 0, 2, 3).contiguous()


def pads_but_returns_kernel_layout(query, key, topk_indices, softmax_scale, v_channels):
    """Pads like #7617 but hands back the kernel's [b, sq, heads, 512], not [sq, b, ...]."""
    if SparseMLA is None or query.size(-1) not in (512, 576) or v_channels != 512:
        return None
    pad = torch.nn.functional.pad
    if query.size(-1) == 512:
        query, key = pad(query, (0, 64)), pad(key, (0, 64))
    indices = topk_indices.unsqueeze(2).to(torch.int32)
    indices = pad(indices, (0, -indices.size(-1) % 64), value=-1)
    out, _ = SparseMLA.apply(
        query.permute(1, 0, 2, 3).contiguous(),
        key.permute(1, 0, 2, 3).contiguous(),
        indices,
        softmax_scale,
    )
    return out


def new_signature(query, key, topk_indices, softmax_scale, v_channels, topk_length=None):
    """A later upstream that changed the contract."""
    return None


def raises(query, key, topk_indices, softmax_scale, v_channels):
    raise RuntimeError("this build is broken")
'''

NAMES = (
    "fixed_upstream",
    "topk_padding_only",
    "pads_but_returns_kernel_layout",
    "new_signature",
    "raises",
)


@cache
def _build() -> dict[str, types.FunctionType]:
    module = importlib.import_module(TILELANG_DSA)
    scratch: dict[str, object] = {}
    exec(compile(_SOURCE, module.__file__, "exec"), scratch)
    built = {}
    for name in NAMES:
        code = scratch[name].__code__
        function = types.FunctionType(code, vars(module), name, scratch[name].__defaults__)
        function.__module__ = module.__name__
        function.__doc__ = scratch[name].__doc__
        built[name] = function
    return built


def __getattr__(name: str) -> types.FunctionType:
    if name in NAMES:
        return _build()[name]
    raise AttributeError(name)


def recorded_as_carrying_the_fix(
    monkeypatch: pytest.MonkeyPatch, backport_id: str = "megatron-lm-7617", release: str = "0.19.2"
) -> None:
    """Record ``release`` (the installed one) as carrying the entry's fix (its ``fixed_in``),
    as the catalog says once a release ships it: a stand-in's fixed behaviour alone is not
    ``upstream`` (the sniff must be confirmed by the text, git ancestry or the release), and
    these stand-ins stand for such a release."""
    from backports.megatron import catalog

    specs = tuple(
        dataclasses.replace(spec, fixed_in=Version(release)) if spec.id == backport_id else spec
        for spec in catalog.CATALOG
    )
    monkeypatch.setattr(catalog, "CATALOG", specs)


def landed(monkeypatch: pytest.MonkeyPatch, name: str = "fixed_upstream") -> None:
    """The stand-in ``name`` in place of the real target, in a release recorded as carrying
    #7617 (``recorded_as_carrying_the_fix``)."""
    module = importlib.import_module(TILELANG_DSA)
    monkeypatch.setattr(module, "fused_sparse_mla_absorbed", _build()[name])
    recorded_as_carrying_the_fix(monkeypatch)
