"""megatron-lm-6114: expert-bias counts drop padded tokens by token, not by expert.

The vendored body and the catalog entry's sniff, on the real megatron-core 0.19.2 method and
on stand-in routers that hold only what the method reads. Counts are checked against
hand-computed values and a plain-Python reference, never against the code under test.
"""

import inspect
import subprocess
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from backports.megatron._vendor.megatron_lm_6114.router import _apply_expert_bias as vendored
from hypothesis import given, settings
from hypothesis import strategies as st

from backports.megatron import Action, Verdict, applied, apply, revert, status
from tests.reports import report_for


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


# --- through the catalog: apply, status, revert ------------------------------------------

ID = "megatron-lm-6114"


def test_apply_installs_a_marked_shim_and_revert_restores_the_same_object(top_k_router):
    from megatron.core.transformer.moe.router import InferenceTopKRouter

    exact = vars(top_k_router)["_apply_expert_bias"]  # torch.compile's wrapper
    report = report_for(apply(only=ID), ID)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
    shim = vars(top_k_router)["_apply_expert_bias"]
    assert top_k_router._apply_expert_bias.__backport__ == ID
    assert shim.__wrapped__ is exact
    # Compiled as the original is: the live jit_fuser (torch.compile) around the vendored code.
    assert shim.__backport_body__._torchdynamo_orig_callable.__code__ is vendored.__code__
    assert InferenceTopKRouter._apply_expert_bias is shim  # inherited, not set there
    report_for(revert(only=ID), ID)
    assert vars(top_k_router)["_apply_expert_bias"] is exact


def test_apply_of_6114_leaves_7617_alone(top_k_router, tilelang_dsa):
    function = tilelang_dsa.fused_sparse_mla_absorbed
    apply(only=ID)
    assert tilelang_dsa.fused_sparse_mla_absorbed is function
    assert not hasattr(function, "__backport__")


def test_status_on_0_19_2_says_needed_with_its_reason():
    report = report_for(status(), ID)
    assert report.verdict == Verdict.NEEDED
    assert "lined up against experts" in report.reason
    assert "6 tokens / 4 experts raises" in report.reason
    behaviour = report.evidence["behaviour"]
    assert behaviour["fixed"] is False and behaviour["square"] == [0, 2, 1, 1]
    assert report.evidence["target"]["attribute"] == "TopKRouter._apply_expert_bias"


def test_status_while_applied_still_sniffs_the_original(top_k_router):
    """Installed or not, the sniff judges megatron-core's own method, never our shim."""
    apply(only=ID)
    report = report_for(status(only=ID), ID)
    assert report.verdict == Verdict.NEEDED
    assert report.evidence["behaviour"]["square"] == [0, 2, 1, 1]
    assert vars(top_k_router)["_apply_expert_bias"].__backport__ == ID


# --- a real TopKRouter on CPU -------------------------------------------------------------

TOKENS_SEQ, TOKENS_BATCH, EXPERTS, TOP_K = 3, 2, 4, 2


def cpu_router() -> Any:
    """A real 0.19.2 TopKRouter with expert bias on, its buffers on CPU.

    The constructor puts the expert-bias buffers on CUDA when the config asks for them,
    so expert bias is switched on by hand, as moe_router_enable_expert_bias would.
    """
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.moe.router import TopKRouter

    config = TransformerConfig(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        num_moe_experts=EXPERTS,
        moe_router_topk=TOP_K,
        moe_router_load_balancing_type="none",
        moe_router_score_function="sigmoid",
        use_cpu_initialization=True,
    )
    groups = SimpleNamespace(tp=None, cp=None, tp_cp=None, tp_dp_cp=None)
    router = TopKRouter(config, pg_collection=groups)
    router.enable_expert_bias = True
    del router.local_tokens_per_expert, router.expert_bias  # plain None attributes
    router.register_buffer("local_tokens_per_expert", torch.zeros(EXPERTS), persistent=False)
    router.register_buffer("expert_bias", torch.zeros(EXPERTS))
    return router


def routing_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(
        TOKENS_SEQ, TOKENS_BATCH, EXPERTS, generator=torch.Generator().manual_seed(6114)
    )
    mask = torch.zeros(TOKENS_SEQ, TOKENS_BATCH, dtype=torch.bool)
    mask[1, 0] = True  # one padded token of six
    return logits, mask


def test_real_router_on_0_19_2_raises_with_a_padding_mask():
    """6 tokens, 4 experts: 0.19.2 cannot broadcast the [6] mask against the [6, 4] map."""
    router = cpu_router()
    logits, mask = routing_inputs()
    with pytest.raises(RuntimeError, match=r"must match the size of tensor b \(6\)"):
        router.routing(logits, padding_mask=mask)


@pytest.mark.slow  # the first call compiles the vendored body with inductor (~20 s on CPU)
def test_real_router_with_the_backport_counts_exactly_the_unpadded_routes():
    router = cpu_router()
    buffer = router.local_tokens_per_expert
    logits, mask = routing_inputs()
    with applied(only=ID):
        _, routing_map = router.routing(logits, padding_mask=mask)
        valid = (~mask).sum().item()
        assert valid == 5
        assert buffer.sum().item() == valid * TOP_K  # each unpadded token, all k routes
        assert buffer.tolist() == routing_map[~mask.reshape(-1)].sum(0).float().tolist()
        assert router.local_tokens_per_expert is buffer  # the registered buffer, in place
        counted = buffer.clone()
        with torch.no_grad():  # an evaluation pass counts nothing
            router.routing(logits, padding_mask=mask)
        assert torch.equal(buffer, counted)
        _, again = router.routing(logits)  # no mask: all six tokens, all k routes
        assert torch.equal(again, routing_map)
        assert buffer.sum().item() == valid * TOP_K + 6 * TOP_K


LAZY = """
import sys
from backports.megatron import apply, revert
from tests.reports import report_for

ROUTER = "megatron.core.transformer.moe.router"
report = report_for(apply(), "megatron-lm-6114")
assert ROUTER not in sys.modules, "apply() imported the router itself"
assert report.action == "deferred", report
from megatron.core.transformer.moe.router import TopKRouter
shim = vars(TopKRouter)["_apply_expert_bias"]
assert shim.__backport__ == "megatron-lm-6114", shim
compiled = shim.__wrapped__
assert compiled._torchdynamo_orig_callable.__module__ == ROUTER
revert()
assert vars(TopKRouter)["_apply_expert_bias"] is compiled
print("lazy ok")
"""


@pytest.mark.slow  # a fresh interpreter imports megatron-core
def test_apply_before_the_router_is_imported_installs_on_import():
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lazy ok" in done.stdout


@pytest.mark.slow  # torch.compile on CPU, twice (~20 s each)
def test_code_compiled_before_apply_is_dropped_and_recompiled_with_the_backport():
    """A caller torch.compile traced before apply() inlined the original method: the class
    attribute swap alone leaves that compiled code counting by expert. apply() drops it,
    names it in the report, and the next call recompiles with the backport."""
    torch._dynamo.reset()
    router = cpu_router()
    buffer = router.local_tokens_per_expert
    # Tokens == experts: 0.19.2 does not raise, it miscounts silently.
    logits = torch.randn(EXPERTS, 1, EXPERTS, generator=torch.Generator().manual_seed(7))
    mask = torch.zeros(EXPERTS, 1, dtype=torch.bool)
    mask[0, 0] = True

    def training_step(logits, mask):
        return router.routing(logits, padding_mask=mask)

    compiled = torch.compile(training_step, backend="eager")
    _, routing_map = compiled(logits, mask)
    expected = routing_map[~mask.reshape(-1)].sum(0).float()  # by token: an independent count
    assert not torch.equal(buffer, expected)  # the original, compiled: wrong counts
    try:
        (report,) = apply(ID)
        assert report.action is Action.INSTALLED
        assert "training_step" in report.reason and "apply() before" in report.reason
        buffer.zero_()
        compiled(logits, mask)
        assert torch.equal(buffer, expected)
    finally:
        revert(ID)
        torch._dynamo.reset()
