"""NVIDIA/Megatron-LM#6114: padded tokens leave the expert-bias counts by token (issue #6111).

In megatron-core 0.16 to 0.19.2, ``TopKRouter._apply_expert_bias`` lines the flattened padding
mask ``[num_tokens]`` up against the expert axis of ``routing_map [num_tokens, num_experts]``.
With tokens != experts every grad-enabled forward with expert bias and a padding mask raises a
broadcast ``RuntimeError``; with tokens == experts the per-expert counts are silently wrong.
"""

import inspect
from collections.abc import Sequence
from types import SimpleNamespace

from packaging.version import Version

from ..model import BackportSpec, Resolved, SniffFailed, SniffResult, Target
from ._untyped import MegatronFunction, Tensor

_EXPERTS = 4
# Probe 1: tokens == experts == 4, token t routed to expert t % 4 and token 0 to expert 1
# too; token 0 is padding. By token: [0, 1, 1, 1]. Lined up against experts (0.19.2): the
# mask zeroes expert 0's column instead, [0, 2, 1, 1].
_SQUARE_ROUTES = ((0, 0), (0, 1), (1, 1), (2, 2), (3, 3))
_SQUARE_PADDED = (0,)
_SQUARE_FIXED = [0, 1, 1, 1]
_SQUARE_UNFIXED = [0, 2, 1, 1]
_SQUARE_UNMASKED = [1, 2, 1, 1]
# Probe 2: 6 tokens, token t to expert t % 4, tokens 4 and 5 padding. 0.19.2 cannot even
# broadcast a [6] mask against [6, 4].
_TALL_ROUTES = tuple((t, t % _EXPERTS) for t in range(6))
_TALL_PADDED = (4, 5)
_TALL_FIXED = [1, 1, 1, 1]


def _routing_map(tokens: int, routes: tuple[tuple[int, int], ...]) -> Tensor:
    import torch

    routing_map = torch.zeros(tokens, _EXPERTS, dtype=torch.bool)
    for token, expert in routes:
        routing_map[token, expert] = True
    return routing_map


def _padding_mask(tokens: int, padded: tuple[int, ...]) -> Tensor:
    import torch

    mask = torch.zeros(tokens, dtype=torch.bool)
    mask[list(padded)] = True
    return mask


def _count(
    body: MegatronFunction,
    tokens: int,
    routes: tuple[tuple[int, int], ...],
    padded: tuple[int, ...] | None,
    *,
    grad: bool = True,
) -> list[int]:
    """Run ``body`` on a stand-in router; the per-expert counts it added to the buffer.

    The stand-in holds only what the method reads, so nothing is compiled and no live
    router's buffer is touched.
    """
    import torch

    buffer = torch.zeros(_EXPERTS, dtype=torch.float32)
    router = SimpleNamespace(enable_expert_bias=True, local_tokens_per_expert=buffer)
    routing_map = _routing_map(tokens, routes)
    before = routing_map.clone()
    mask = None if padded is None else _padding_mask(tokens, padded)
    with torch.set_grad_enabled(grad):
        body(router, routing_map, mask)
    # Every version counts in place (CUDA graphs capture the buffer) and leaves the
    # caller's map alone; one that does not is not the method this backport replaces.
    if router.local_tokens_per_expert is not buffer:
        raise SniffFailed("the method rebound local_tokens_per_expert instead of adding in place")
    if not torch.equal(routing_map, before):
        raise SniffFailed("the method wrote the caller's routing_map")
    return [int(n) for n in buffer.tolist()]


def _check_controls(body: MegatronFunction) -> dict[str, object]:
    """Calls every version answers alike: no mask counts every route, no grad counts nothing."""
    unmasked = _count(body, _EXPERTS, _SQUARE_ROUTES, None)
    if unmasked != _SQUARE_UNMASKED:
        raise SniffFailed(f"with no padding mask it counted {unmasked}, not {_SQUARE_UNMASKED}")
    no_grad = _count(body, _EXPERTS, _SQUARE_ROUTES, _SQUARE_PADDED, grad=False)
    if any(no_grad):
        raise SniffFailed(f"with grad disabled it still counted {no_grad}")
    return {"unmasked": unmasked, "no_grad": no_grad}


def _tall_probe(body: MegatronFunction) -> tuple[bool, dict[str, object]]:
    """6 tokens / 4 experts: fixed counts [1, 1, 1, 1]; 0.19.2 raises (that is "needed")."""
    try:
        counts = _count(body, len(_TALL_ROUTES), _TALL_ROUTES, _TALL_PADDED)
    except SniffFailed:
        raise
    except RuntimeError as exc:
        # The padding mask broadcast along the expert axis: the bug itself, not a sniff error.
        return False, {"raised": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    if counts != _TALL_FIXED:
        raise SniffFailed(f"6 tokens / 4 experts with 2 padded counted {counts}")
    return True, {"counts": counts}


def _sniff_body(body: MegatronFunction) -> SniffResult:
    """Fixed iff a padded token loses its routes, with tokens == experts and tokens != experts.

    ``body`` is the undecorated method (``inspect.unwrap`` of the class attribute): calling
    it compiles nothing. Controls that fail, counts of neither version, or two probes that
    disagree raise, which the probe reports as incompatible.
    """
    controls = _check_controls(body)
    square = _count(body, _EXPERTS, _SQUARE_ROUTES, _SQUARE_PADDED)
    if square not in (_SQUARE_FIXED, _SQUARE_UNFIXED):
        raise SniffFailed(f"4 tokens / 4 experts with token 0 padded counted {square}")
    square_fixed = square == _SQUARE_FIXED
    tall_fixed, tall = _tall_probe(body)
    if square_fixed != tall_fixed:
        raise SniffFailed(f"the probes disagree: 4x4 counted {square}, 6x4 gave {tall}")
    if square_fixed:
        summary = "a padded token drops all its routes from the expert-bias counts (by token)"
    else:
        summary = (
            "the padding mask is lined up against experts: 6 tokens / 4 experts raises "
            f"({tall['raised']}), 4 / 4 counts {square} instead of {_SQUARE_FIXED}"
        )
    detail = {"controls": controls, "square": square, "tall": tall}
    return SniffResult(square_fixed, summary, detail)


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Sniff the method's undecorated body; the compiled wrapper is never called."""
    return _sniff_body(inspect.unwrap(targets[0].original))


SPEC = BackportSpec(
    id="megatron-lm-6114",
    title="MoE expert bias: a padding mask drops token rows from the expert counts",
    targets=(
        Target(
            distribution="megatron-core",
            modules=("megatron.core.transformer.moe.router",),
            attribute="TopKRouter._apply_expert_bias",
            parameters=("self", "routing_map", "padding_mask"),
            decorator="megatron.core.jit:jit_fuser",
        ),
    ),
    # 0.15 counts inline in routing(); the method with its padding_mask arrives in 0.16.
    target_since=Version("0.16"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
)
