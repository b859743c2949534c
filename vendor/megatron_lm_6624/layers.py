# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:    https://github.com/NVIDIA/Megatron-LM
# pr:      6624 (merged 2026-08-18 as e5542e85f294fc215f2e08b3c7e17213f0ffae93)
# path:    megatron/core/tensor_parallel/layers.py
# symbols: LinearWithGradAccumulationAndAsyncCommunication.backward, and its new helper
#          _wgrad_gemm
# origin:  no upstream text: the backward is megatron-core's installed one, rebuilt at run
#          time by the rule below (see _source_rule.py), whose sha256 pins the installed text;
#          _wgrad_gemm is written here from the pull request's described behaviour.
"""#6624 alone: under GTP the weight gradient is emitted in ``main_grad``'s dtype.

With generalized tensor parallelism (``gtp_remat_size > 1``) gradient-accumulation fusion is
off and megatron-core 0.19.2's backward computes the weight gradient in the compute dtype
(bf16) and reduce-scatters it across the GTP ranks in bf16, so with FP32 ``main_grad``
(``--accumulate-allreduce-grads-in-fp32``) the sum is rounded before the FP32 accumulation
sees it. The pull request makes the weight-gradient GEMM write straight into a tensor of
``main_grad``'s dtype (the sharded weight's ``get_wgrad_tensor()``) whenever that dtype
differs from the input's, so the reduce-scatter runs in FP32; and the Megatron-FSDP branch
uses the same helper, whose fallback without Transformer Engine casts instead of asking
``torch.matmul`` for an ``out=`` of another dtype (which raises).

Only #6624's change: the merged upstream ``backward`` also reads ``ctx.input_dtype``, which
#6252 added to ``forward`` and which 0.19.2's ``forward`` never sets, so a verbatim copy of
it would raise on 0.19.2. The pull request's ``validate_args`` hunk
(``megatron/training/arguments.py``) is not carried.

Rule ``wgrad-in-main-grad-dtype``: in ``backward``, (1) the Megatron-FSDP branch's GEMM is
``_wgrad_gemm(weight.main_grad, grad_output, total_input)``; (2) without fusion, a GTP weight
whose ``main_grad`` dtype differs from the input's gets
``_wgrad_gemm(sharded_weight.get_wgrad_tensor(), grad_output, total_input)`` before the plain
``grad_output.t().matmul(total_input)``. Its decorators (``staticmethod``, ``custom_bwd``)
are left to the installer, as the catalog entry declares them.
"""

import ast
import importlib
from typing import Any

from ._source_rule import SourceRule, installed_function, rebuild

# The module that defines the target; the applier rebinds it where the class lives.
__target_module__ = "megatron.core.tensor_parallel.layers"
_OWNER = "LinearWithGradAccumulationAndAsyncCommunication"

RULE = "wgrad-in-main-grad-dtype"


def _wgrad_gemm(out: Any, grad_output: Any, total_input: Any) -> Any:
    """``grad_output^T @ total_input`` written into ``out``, which may be wider than the
    inputs (bf16 in, fp32 out); returns ``out``.

    Transformer Engine's GEMM writes a wider output directly; without it the product is
    made in the compute dtype and cast into ``out`` (``torch.matmul`` takes no ``out=`` of
    another dtype). TE's GEMM is CUDA-only: CPU tensors (the sniff's stand-ins) take the
    second way where the pull request would hand them to TE and fail; CUDA tensors take
    the pull request's way.
    """
    # Imported at call time, as megatron-core does: transformer_engine imports this module.
    from megatron.core.extensions.transformer_engine import te_general_gemm

    if te_general_gemm is not None and out.is_cuda:
        te_general_gemm(
            total_input, grad_output, out_dtype=out.dtype, layout="NT", out=out, grad=True
        )
    else:
        out.copy_(grad_output.t().matmul(total_input))
    return out


def _name(node: ast.AST) -> str:
    """``a.b.c`` for an attribute chain of names, else ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _call(function: str, *args: str) -> ast.Call:
    return ast.Call(
        func=ast.Name(id=function, ctx=ast.Load()),
        args=[ast.parse(arg, mode="eval").body for arg in args],
        keywords=[],
    )


def _fsdp_gemm_through_the_helper(definition: ast.FunctionDef) -> int:
    """The Megatron-FSDP branch (``if hasattr(weight, "__fsdp_param__")``): after its
    ``main_grad`` is made, one ``_wgrad_gemm`` call instead of the TE / matmul choice."""
    changed = 0
    for node in ast.walk(definition):
        test = node.test if isinstance(node, ast.If) else None
        if not (
            isinstance(test, ast.Call)
            and _name(test.func) == "hasattr"
            and len(test.args) == 2
            and isinstance(test.args[1], ast.Constant)
            and test.args[1].value == "__fsdp_param__"
        ):
            continue
        assert isinstance(node, ast.If)
        gemm = _call("_wgrad_gemm", "weight.main_grad", "grad_output", "total_input")
        node.body = [node.body[0], ast.Expr(value=gemm)]
        changed += 1
    return changed


def _gtp_wgrad_in_main_grad_dtype(definition: ast.FunctionDef) -> int:
    """Before the unfused ``grad_weight = grad_output.t().matmul(total_input)``: a GTP weight
    whose ``main_grad`` dtype is not the input's gets the GEMM into ``get_wgrad_tensor()``."""
    changed = 0
    for node in ast.walk(definition):
        fused = isinstance(node, ast.If) and _name(node.test) == "ctx.gradient_accumulation_fusion"
        if not fused:
            continue
        unfused = node.orelse
        if not (
            len(unfused) == 1
            and isinstance(unfused[0], ast.Assign)
            and [_name(t) for t in unfused[0].targets] == ["grad_weight"]
        ):
            continue
        widen = ast.parse(
            "ctx.gtp_remat_size > 1 and sharded_weight.main_grad.dtype != total_input.dtype",
            mode="eval",
        ).body
        gemm = _call(
            "_wgrad_gemm", "sharded_weight.get_wgrad_tensor()", "grad_output", "total_input"
        )
        assign = ast.Assign(targets=[ast.Name(id="grad_weight", ctx=ast.Store())], value=gemm)
        node.orelse = [ast.If(test=widen, body=[assign], orelse=unfused)]
        changed += 1
    return changed


def _widen_the_wgrad(definition: ast.FunctionDef) -> int:
    return _fsdp_gemm_through_the_helper(definition) + _gtp_wgrad_in_main_grad_dtype(definition)


_BACKWARD = SourceRule(
    name=RULE,
    symbol=f"{_OWNER}.backward",
    # megatron-core 0.19.2's text (the pull request's base differs only by #6252's hunks).
    installed_sha256="0f98c637b768ede6eab6aadef3650e2fa5cde2a4c28a891322868b2540a1da85",
    edit=_widen_the_wgrad,
    places=2,
)

# (the installed backward it was rebuilt from, the rebuilt backward)
_BUILT: list[tuple[Any, Any]] = []


def __getattr__(name: str) -> Any:
    """``backward``: the rebuilt, undecorated backward (made again whenever the installed
    one changed); an ``AttributeError`` for any other name."""
    if name != "backward":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(__target_module__)
    original = installed_function(vars(getattr(module, _OWNER))["backward"], module)
    if not _BUILT or _BUILT[0][0] is not original:
        _BUILT[:] = [(original, rebuild(original, _BACKWARD, {"_wgrad_gemm": _wgrad_gemm}))]
    return _BUILT[0][1]
