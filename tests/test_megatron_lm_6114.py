"""megatron-lm-6114: expert-bias counts drop padded tokens by token, not by expert.

The vendored body and the catalog entry's sniff, on the real megatron-core 0.19.2 method and
on stand-in routers that hold only what the method reads. Counts are checked against
hand-computed values and a plain-Python reference, never against the code under test.
"""

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from backports.megatron._vendor.megatron_lm_6114.router import _apply_expert_bias as vendored
from hypothesis import given, settings
from hypothesis import strategies as st

ROUTER = "megatron.core.transformer.moe.router"


@pytest.fixture(scope="module")
def top_k_router() -> type:
    from megatron.core.transformer.moe.router import TopKRouter

    return TopKRouter


@pytest.fixture(scope="module")
def installed(top_k_router: type) -> Callable[..., Any]:
    """0.19.2's method as the class holds it: the torch.compile wrapper."""
    return top_k_router.__dict__["_apply_expert_bias"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def spec() -> Any:
    from backports.megatron.catalog.megatron_lm_6114 import SPEC

    return SPEC


def stand_in(buffer: torch.Tensor | None, *, enabled: bool = True) -> SimpleNamespace:
    return SimpleNamespace(enable_expert_bias=enabled, local_tokens_per_expert=buffer)


def as_map(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def as_mask(flags: list[int]) -> torch.Tensor:
    return torch.tensor(flags, dtype=torch.bool)


def reference_counts(rows: list[list[bool]], padded: list[bool] | None, experts: int) -> list[int]:
    """Per-expert routes of the unpadded tokens, counted by hand."""
    counts = [0] * experts
    for token, row in enumerate(rows):
        if padded is not None and padded[token]:
            continue
        for expert, routed in enumerate(row):
            counts[expert] += int(routed)
    return counts


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(spec, installed):
    result = spec.sniff([SimpleNamespace(original=installed)])
    assert result.fixed is False
    assert result.detail["square"] == [0, 2, 1, 1]
    assert "must match the size of tensor b (6)" in result.detail["tall"]["raised"]
    assert result.detail["controls"] == {"unmasked": [1, 2, 1, 1], "no_grad": [0, 0, 0, 0]}
    assert "lined up against experts" in result.summary


def test_sniff_says_fixed_on_vendored_body(spec):
    result = spec.sniff([SimpleNamespace(original=vendored)])
    assert result.fixed is True
    assert result.detail["square"] == [0, 1, 1, 1]
    assert result.detail["tall"] == {"counts": [1, 1, 1, 1]}


class _RefusingWrapper:
    """Stands for the torch.compile wrapper: calling it would compile (~20 s on CPU)."""

    def __init__(self, wrapped: Callable[..., Any]) -> None:
        self.__wrapped__ = wrapped

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the sniff called the decorated method instead of its body")


def test_sniff_calls_the_undecorated_body_only(spec, installed):
    """The class attribute is a torch.compile wrapper; the sniff runs what it wraps."""
    assert inspect.unwrap(torch.compile(vendored)) is vendored
    assert spec.sniff([SimpleNamespace(original=_RefusingWrapper(vendored))]).fixed is True
    body = inspect.unwrap(installed)
    assert spec.sniff([SimpleNamespace(original=_RefusingWrapper(body))]).fixed is False


def _counts_always(self, routing_map, padding_mask=None):
    self.local_tokens_per_expert += routing_map.sum(dim=0)


def _counts_nothing(self, routing_map, padding_mask=None):
    pass


def _rebinds_buffer(self, routing_map, padding_mask=None):
    if torch.is_grad_enabled():
        keep = routing_map if padding_mask is None else routing_map[~padding_mask]
        self.local_tokens_per_expert = self.local_tokens_per_expert + keep.sum(dim=0)


def _writes_callers_map(self, routing_map, padding_mask=None):
    if torch.is_grad_enabled():
        if padding_mask is not None:
            routing_map[padding_mask] = False
        self.local_tokens_per_expert += routing_map.sum(dim=0)


def _fixed_square_only(self, routing_map, padding_mask=None):
    """Counts by token when tokens == experts but raises otherwise: no version does that."""
    if torch.is_grad_enabled():
        if padding_mask is not None:
            if routing_map.size(0) != routing_map.size(1):
                raise RuntimeError("The size of tensor a (4) must match the size of tensor b (6)")
            routing_map = routing_map & (~padding_mask).unsqueeze(-1)
        self.local_tokens_per_expert += routing_map.sum(dim=0)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_counts_always, "with grad disabled it still counted"),
        (_counts_nothing, "with no padding mask it counted [0, 0, 0, 0]"),
        (_rebinds_buffer, "rebound local_tokens_per_expert"),
        (_writes_callers_map, "wrote the caller's routing_map"),
        (_fixed_square_only, "the probes disagree"),
    ],
)
def test_sniff_raises_on_a_method_unlike_any_version(spec, body, why):
    """Raising is what the probe turns into "incompatible": such code is never patched."""
    with pytest.raises(RuntimeError, match=why.replace("[", r"\[").replace("]", r"\]")):
        spec.sniff([SimpleNamespace(original=body)])


def test_spec_parameters_match_installed_and_vendored(spec, installed):
    """The probe compares the unwrapped signature; both sides must give the same names."""
    assert tuple(inspect.signature(installed).parameters) == spec.target.parameters
    assert tuple(inspect.signature(vendored).parameters) == spec.target.parameters


# --- the vendored body -------------------------------------------------------------------


def test_square_counts_by_token_not_by_expert():
    """4 tokens, 4 experts, token 0 routed to experts 0 and 1 and padded."""
    buffer = torch.zeros(4)
    routing_map = as_map([[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    vendored(stand_in(buffer), routing_map, as_mask([1, 0, 0, 0]))
    assert buffer.tolist() == [0, 1, 1, 1]


def test_more_tokens_than_experts_does_not_raise():
    buffer = torch.zeros(4)
    routing_map = as_map([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]] * 2)
    vendored(stand_in(buffer), routing_map, as_mask([0, 0, 0, 1, 1, 0]))
    # Tokens 0, 1, 2 and 5 stay: experts 0, 1, 2 and 2.
    assert buffer.tolist() == [1, 1, 2, 0]


def test_padded_token_loses_all_its_top_k_routes():
    """Top-2: token 1 (padded) had two routes; both go, the others' two each stay."""
    buffer = torch.zeros(3)
    routing_map = as_map([[1, 1, 0], [0, 1, 1], [1, 0, 1]])
    vendored(stand_in(buffer), routing_map, as_mask([0, 1, 0]))
    assert buffer.tolist() == [2, 1, 1]
    assert buffer.sum().item() == 2 * 2  # two valid tokens x top-k 2


def test_all_false_mask_counts_as_no_mask():
    routing_map = as_map([[1, 0], [1, 1], [0, 1]])
    with_mask, without = torch.zeros(2), torch.zeros(2)
    vendored(stand_in(with_mask), routing_map, as_mask([0, 0, 0]))
    vendored(stand_in(without), routing_map, None)
    assert with_mask.tolist() == without.tolist() == [2, 2]


def test_counts_add_to_what_the_buffer_holds():
    """Micro-batches accumulate until the optimizer step reads and zeroes the buffer."""
    buffer = torch.tensor([5.0, 0.0, 2.0])
    routing_map = as_map([[1, 0, 0], [0, 0, 1]])
    vendored(stand_in(buffer), routing_map, as_mask([0, 0]))
    vendored(stand_in(buffer), routing_map, as_mask([1, 0]))
    assert buffer.tolist() == [6, 0, 4]


def test_buffer_is_updated_in_place_never_rebound():
    """CUDA graphs capture the registered buffer's storage: it must stay the same tensor."""
    buffer = torch.zeros(4)
    storage = buffer.data_ptr()
    router = stand_in(buffer)
    routing_map = as_map([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]])
    vendored(router, routing_map, as_mask([0, 1, 0]))
    assert router.local_tokens_per_expert is buffer
    assert buffer.data_ptr() == storage
    assert buffer.tolist() == [1, 0, 1, 1]


def test_callers_map_and_mask_are_untouched():
    routing_map = as_map([[1, 0], [0, 1], [1, 1]])
    mask = as_mask([1, 0, 1])
    map_before, mask_before = routing_map.clone(), mask.clone()
    vendored(stand_in(torch.zeros(2)), routing_map, mask)
    assert torch.equal(routing_map, map_before)
    assert torch.equal(mask, mask_before)


def test_grad_off_adds_nothing():
    """Evaluation and the no-grad pass of activation recompute must not count twice."""
    buffer = torch.tensor([1.0, 2.0])
    with torch.no_grad():
        vendored(stand_in(buffer), as_map([[1, 0], [1, 1]]), as_mask([0, 0]))
        vendored(stand_in(buffer), as_map([[1, 0], [1, 1]]), None)
    assert buffer.tolist() == [1, 2]


def test_expert_bias_off_touches_nothing():
    """A router without expert bias has local_tokens_per_expert = None; it is not read."""
    router = stand_in(None, enabled=False)
    vendored(router, as_map([[1, 0], [0, 1]]), as_mask([1, 0]))
    assert router.local_tokens_per_expert is None


def test_installed_0_19_2_really_miscounts(installed):
    """The bug the backport exists for, on the installed body: wrong when square, raises else."""
    body = inspect.unwrap(installed)
    buffer = torch.zeros(4)
    routing_map = as_map([[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    body(stand_in(buffer), routing_map, as_mask([1, 0, 0, 0]))
    assert buffer.tolist() == [0, 2, 1, 1]
    with pytest.raises(RuntimeError, match="must match"):
        body(stand_in(torch.zeros(4)), routing_map[:3], as_mask([1, 0, 0]))


@st.composite
def routings(draw: st.DrawFn) -> tuple[list[list[bool]], list[bool] | None, list[float]]:
    tokens = draw(st.integers(0, 12))
    experts = draw(st.integers(1, 8))
    row = st.lists(st.booleans(), min_size=experts, max_size=experts)
    rows = draw(st.lists(row, min_size=tokens, max_size=tokens))
    padded = draw(st.none() | st.lists(st.booleans(), min_size=tokens, max_size=tokens))
    start = draw(st.lists(st.integers(0, 50).map(float), min_size=experts, max_size=experts))
    return rows, padded, start


@settings(max_examples=200, deadline=None)
@given(routings())
def test_property_counts_equal_the_unpadded_routes(case):
    rows, padded, start = case
    experts = len(start)
    buffer = torch.tensor(start, dtype=torch.float32)
    routing_map = torch.tensor(rows, dtype=torch.bool).reshape(len(rows), experts)
    map_before = routing_map.clone()
    mask = None if padded is None else torch.tensor(padded, dtype=torch.bool).reshape(len(rows))
    router = stand_in(buffer)

    vendored(router, routing_map, mask)

    expected = [s + c for s, c in zip(start, reference_counts(rows, padded, experts), strict=True)]
    assert buffer.tolist() == expected
    if mask is not None:  # the row-selection reference the notes give
        kept = map_before[~mask].sum(0)
        assert (buffer - torch.tensor(start)).tolist() == kept.tolist()
    assert router.local_tokens_per_expert is buffer
    assert torch.equal(routing_map, map_before)
