"""megatron-lm-6890's sniff, run by path in a child interpreter (``python -I FILE JSON``).

The parent sets ``TRITON_INTERPRET=1`` in the child's environment, so Triton runs the
kernels in NumPy on the CPU; it must be set before anything imports triton, hence a child.
This file imports nothing of megatron-backports: the argument names the ``sys.path`` to use
and one or more sets of the four rotary kernels, each kernel by the module and attribute to
take it from (the installed megatron-core's, a vendored replacement's): one child judges the
installed kernels and the vendored ones, for one import of torch and megatron.

Each kernel runs on 2 tokens x 6 heads with ``BLOCK_H=4`` (its second head block reaches 2
heads past the last one) and with ``BLOCK_H=2`` (the control: every block full), its inputs
and outputs in buffers with a guard region behind them, and is compared with a float32 torch
reference written here. Prints one line, ``SNIFF <json>``: per kernel and block size,
whether the result matched and whether every guard kept its value.
"""

import importlib
import json
import sys
from typing import Any

_TOKENS, _HEADS = 2, 6
_NOPE, _EMB, _K, _V = 4, 4, 4, 4  # q's unrotated width, the rotary width, key and value
_HALF = _EMB // 2
# What a guard region holds: never a value of the computation. Behind an input another value
# than behind an output, so that a guard read past an input and copied past an output shows.
_GUARD, _INPUT_GUARD = 1234.5, -777.25
_BLOCKS = (4, 2)  # BLOCK_H under test, then the control

# torch and triton are imported inside the functions, after the path is set, and are
# untyped to mypy: these names say what a value is.
Tensor = Any  # a torch.Tensor
Kernel = Any  # a triton JIT kernel (``kernel[grid](...)``)


def _guarded(
    shape: tuple[int, ...], values: Tensor | None = None, guard: float = _GUARD
) -> tuple[Tensor, Tensor]:
    """A tensor of ``shape`` at the front of a buffer, then a guard as long as the tensor."""
    import torch

    numel = 1
    for size in shape:
        numel *= size
    buffer = torch.full((2 * numel,), guard)
    tensor = buffer[:numel].view(shape)
    if values is not None:
        tensor.copy_(values)
    return tensor, buffer[numel:]


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Forward rotation: interleaved pairs in, rotated halves out."""
    import torch

    x1, x2 = x[..., 0::2], x[..., 1::2]
    left = x1 * cos[..., :_HALF] - x2 * sin[..., :_HALF]
    right = x2 * cos[..., _HALF:] + x1 * sin[..., _HALF:]
    return torch.cat([left, right], dim=-1)


def _rope_grad(g: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Its transpose: rotated halves in, interleaved pairs out."""
    import torch

    left, right = g[..., :_HALF], g[..., _HALF:]
    out = torch.empty_like(g)
    out[..., 0::2] = left * cos[..., :_HALF] + right * sin[..., _HALF:]
    out[..., 1::2] = -left * sin[..., :_HALF] + right * cos[..., _HALF:]
    return out


def _outcome(pairs: list[tuple[Tensor, Tensor]], guards: list[Tensor]) -> dict[str, bool]:
    import torch

    exact = all(torch.allclose(a, e, rtol=1e-5, atol=1e-5) for a, e in pairs)
    intact = all(bool((guard == _GUARD).all()) for guard in guards)
    return {"exact": exact, "guards_intact": intact}


def _q(kernel: Kernel, block: int, data: dict[str, Tensor], backward: bool) -> dict[str, bool]:
    """``rotary_fwd_q_kernel`` / ``rotary_bwd_q_kernel``: in place on [tokens, heads, 8]."""
    q0, cos, sin = data["q"], data["cos"], data["sin"]
    q, guard = _guarded(tuple(q0.shape), q0)
    grid = (_TOKENS, -(-_HEADS // block))
    kernel.fn[grid](
        q, cos, sin, _NOPE, _EMB, _HEADS, 1, None, None, q.stride(0), q.stride(1), 0, 1,
        BLOCK_H=block,
    )  # fmt: skip
    expected = q0.clone()
    turn = _rope_grad if backward else _rope
    expected[..., _NOPE:] = turn(q0[..., _NOPE:], cos[:, None], sin[:, None])
    return _outcome([(q, expected)], [guard])


def _fwd_kv(kernel: Kernel, block: int, data: dict[str, Tensor]) -> dict[str, bool]:
    """``rotary_fwd_kv_kernel``: KV [tokens, heads, K+V] and the rotary input -> key, value."""
    kv, emb, cos, sin = data["kv"], data["emb"], data["cos"], data["sin"]
    kv_in, _ = _guarded(tuple(kv.shape), kv, _INPUT_GUARD)
    key, key_guard = _guarded((_TOKENS, _HEADS, _K + _EMB))
    value, value_guard = _guarded((_TOKENS, _HEADS, _V))
    grid = (_TOKENS, -(-_HEADS // block))
    kernel.fn[grid](
        kv_in, emb, key, value, cos, sin, _EMB, _K, _V, _HEADS, 1, None, None,
        kv_in.stride(0), kv_in.stride(1), emb.stride(0), key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), 0, 1, BLOCK_H=block,
    )  # fmt: skip
    expected_key = key.new_empty(key.shape)
    expected_key[..., :_K] = kv[..., :_K]
    expected_key[..., _K:] = _rope(emb, cos, sin)[:, None, :]
    pairs = [(key, expected_key), (value, kv[..., _K:])]
    return _outcome(pairs, [key_guard, value_guard])


def _bwd_kv(kernel: Kernel, block: int, data: dict[str, Tensor]) -> dict[str, bool]:
    """``rotary_bwd_kv_kernel``: dK, dV -> dKV, and dEMB summed over every head."""
    import torch

    dk0, dv0, cos, sin = data["dk"], data["dv"], data["cos"], data["sin"]
    dk, _ = _guarded(tuple(dk0.shape), dk0, _INPUT_GUARD)
    dv, _ = _guarded(tuple(dv0.shape), dv0, _INPUT_GUARD)
    dkv, dkv_guard = _guarded((_TOKENS, _HEADS, _K + _V))
    demb, demb_guard = _guarded((_TOKENS, _EMB))
    grid = (_TOKENS, -(-_HEADS // block))
    kernel.fn[grid](
        dk, dv, dkv, demb, cos, sin, _EMB, _K, _V, _HEADS, 1, None, None,
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), dkv.stride(0), dkv.stride(1),
        demb.stride(0), 0, 1, BLOCK_H=block,
    )  # fmt: skip
    expected_dkv = torch.cat([dk0[..., :_K], dv0], dim=-1)
    expected_demb = _rope_grad(dk0[..., _K:].sum(dim=1), cos, sin)
    return _outcome([(dkv, expected_dkv), (demb, expected_demb)], [dkv_guard, demb_guard])


def _data() -> dict[str, Tensor]:
    import torch

    generator = torch.Generator().manual_seed(6890)

    def draw(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator)

    return {
        "q": draw(_TOKENS, _HEADS, _NOPE + _EMB),
        "kv": draw(_TOKENS, _HEADS, _K + _V),
        "emb": draw(_TOKENS, _EMB),
        "dk": draw(_TOKENS, _HEADS, _K + _EMB),
        "dv": draw(_TOKENS, _HEADS, _V),
        "cos": draw(_TOKENS, _EMB),
        "sin": draw(_TOKENS, _EMB),
    }


def _run(addresses: dict[str, list[str]], data: dict[str, Tensor]) -> dict[str, object]:
    """Every kernel of one set (kernel name -> [module, attribute]) at both block sizes."""
    runs = {
        "rotary_fwd_q_kernel": lambda k, b: _q(k, b, data, backward=False),
        "rotary_bwd_q_kernel": lambda k, b: _q(k, b, data, backward=True),
        "rotary_fwd_kv_kernel": lambda k, b: _fwd_kv(k, b, data),
        "rotary_bwd_kv_kernel": lambda k, b: _bwd_kv(k, b, data),
    }
    kernels = {
        name: getattr(importlib.import_module(module), attribute)
        for name, (module, attribute) in addresses.items()
    }
    seen = {
        name: {f"BLOCK_H={block}": runs[name](kernel, block) for block in _BLOCKS}
        for name, kernel in kernels.items()
    }
    return {"kernels": seen}


def main(argument: str) -> None:
    """``argument``: ``{"sys_path": [...], "sets": {label: {kernel: [module, attribute]}}}``;
    each set is judged on its own (one that fails to import says why, the others still run)."""
    request = json.loads(argument)
    sys.path[:] = request["sys_path"]
    data = _data()
    sets: dict[str, object] = {}
    for label, addresses in request["sets"].items():
        try:
            sets[label] = _run(addresses, data)
        except Exception as exc:
            sets[label] = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
    # Which copy of megatron-core the child judged (audit puts a candidate first on the path):
    # the kernels' modules imported it.
    judged = sys.modules.get("megatron")
    where = next(iter(judged.__path__)) if judged is not None else None
    print("SNIFF " + json.dumps({"sets": sets, "megatron": where}))


if __name__ == "__main__":
    main(sys.argv[1])
