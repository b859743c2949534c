# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:    https://github.com/NVIDIA/Megatron-LM
# pr:      6890 (open; #7104, open, fixes the same masks; issue #7103)
# path:    megatron/core/fusions/fused_mla_yarn_rope_apply.py
# symbols: rotary_fwd_q_kernel, rotary_bwd_q_kernel, rotary_fwd_kv_kernel,
#          rotary_bwd_kv_kernel (autotuned Triton kernels)
# origin:  no upstream text: each kernel is megatron-core's installed one, rebuilt at run time
#          by the rule below (see _source_rule.py), whose sha256 pins the installed text.
"""#6890 / #7104: the fused MLA YaRN RoPE kernels mask on the head index.

Each of the four autotuned kernels advances its base pointer to its block of heads
(``pid_head * BLOCK_H``) and then masks with a block-local offset compared against the global
head count (``x_off < head_num * stride``): that is ``local_head < head_num``, true for every
lane. With ``BLOCK_H`` autotuned over 1..128 and a head count that ``BLOCK_H`` does not divide
(12, 20, 24, 40 heads per rank), the last block's program rotates rows that are the next
token's first heads, or writes past the tensor for the last token: q / k are silently wrong,
differently on each machine (the block size is the autotuner's pick). The fix masks on the
head index, ``(block * BLOCK_H + arange(BLOCK_H)) < head_num``.

Rule ``mask-on-head-index``: every ``mask = <offset> < head_num * <stride>`` of the four
kernels becomes ``mask = (<block> * BLOCK_H + tl.arange(0, BLOCK_H))[:, None] < head_num``,
where ``<block>`` is the program's head block (``pid_head``), or, in the backward KV
kernel's loop over head blocks (``for i in tl.static_range(...)``), the loop's block ``i``:
five masks in all. The kernels keep their decorators (``triton.autotune`` with the same
configs and keys, ``triton.jit``), applied again from the installed source with the live
``triton``.
"""

import ast
import importlib
from typing import Any

from ._source_rule import SourceRule, installed_function, rebuild

# The module that defines the kernels; the applier rebinds it where they live.
__target_module__ = "megatron.core.fusions.fused_mla_yarn_rope_apply"

RULE = "mask-on-head-index"


def _is_head_mask(statement: ast.stmt) -> bool:
    """``mask = <offset> < head_num * <stride>``."""
    if not (
        isinstance(statement, ast.Assign)
        and [getattr(t, "id", None) for t in statement.targets] == ["mask"]
        and isinstance(statement.value, ast.Compare)
        and len(statement.value.ops) == 1
        and isinstance(statement.value.ops[0], ast.Lt)
    ):
        return False
    (bound,) = statement.value.comparators
    return (
        isinstance(bound, ast.BinOp)
        and isinstance(bound.op, ast.Mult)
        and getattr(bound.left, "id", None) == "head_num"
    )


def _head_loop(statement: ast.stmt) -> str | None:
    """The loop variable of ``for <name> in tl.static_range(...)`` (one head block per
    turn), else None."""
    if not (isinstance(statement, ast.For) and isinstance(statement.target, ast.Name)):
        return None
    iterator = statement.iter
    called = iterator.func if isinstance(iterator, ast.Call) else None
    if isinstance(called, ast.Attribute) and called.attr == "static_range":
        return statement.target.id
    return None


def _mask_heads(statements: list[ast.stmt], block: str) -> int:
    changed = 0
    for statement in statements:
        if _is_head_mask(statement):
            assert isinstance(statement, ast.Assign)
            statement.value = ast.parse(
                f"({block} * BLOCK_H + tl.arange(0, BLOCK_H))[:, None] < head_num", mode="eval"
            ).body
            changed += 1
            continue
        inner = _head_loop(statement) or block
        for field in ("body", "orelse", "finalbody"):
            nested = getattr(statement, field, None)
            if isinstance(nested, list):
                changed += _mask_heads(nested, inner)
    return changed


def _mask_on_head_index(definition: ast.FunctionDef) -> int:
    return _mask_heads(definition.body, "pid_head")


def _rule(kernel: str, installed_sha256: str, places: int) -> SourceRule:
    return SourceRule(
        name=RULE,
        symbol=kernel,
        installed_sha256=installed_sha256,
        edit=_mask_on_head_index,
        places=places,
        keep_decorators=True,
    )


# megatron-core 0.19.2's kernels (the same text from 0.16.1 to 0.19.2).
_RULES = {
    "rotary_fwd_q_kernel": _rule(
        "rotary_fwd_q_kernel",
        "9367c63077a269e20a34ebf61e44a9d30c4fe6c0a7b05aa104b724a2eb41ba31",
        places=1,
    ),
    "rotary_bwd_q_kernel": _rule(
        "rotary_bwd_q_kernel",
        "008cec8fd767834a81d89c4f7314251c9689a79695547ee9cb2ee8023f45d841",
        places=1,
    ),
    "rotary_fwd_kv_kernel": _rule(
        "rotary_fwd_kv_kernel",
        "a9ce3b80c7c49c487f39445a444f56bb7682822d75db41baeb435faea84b40eb",
        places=1,
    ),
    "rotary_bwd_kv_kernel": _rule(
        "rotary_bwd_kv_kernel",
        "60f474cf84304ef8b6da318190c3115d0701f5ee11b2f7e295161e6ff3ca13bc",
        places=2,  # the dKV copy, and the dEMB sum over head blocks
    ),
}

# kernel name -> (the installed kernel it was rebuilt from, the rebuilt kernel)
_BUILT: dict[str, tuple[Any, Any]] = {}


def __getattr__(name: str) -> Any:
    """The rebuilt kernel ``name`` (a new ``Autotuner`` around a new ``JITFunction``, or the
    interpreter's function under ``TRITON_INTERPRET=1``), made again whenever the installed
    one changed; an ``AttributeError`` for any other name."""
    if name not in _RULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(__target_module__)
    built = _BUILT.get(name)
    if built is not None and getattr(module, name) is built[1]:
        return built[1]  # installed there: it stands for the original it was rebuilt from
    original = installed_function(getattr(module, name), module)
    if built is None or built[0] is not original:
        built = (original, rebuild(original, _RULES[name]))
        _BUILT[name] = built
    return built[1]
