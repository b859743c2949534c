"""megatron-lm-6099: the layer-wise optimizer gives count_zeros_fp32 and its children the
TP and expert-TP groups.

Two targets of two kinds: the constructor (a ``Constructor``: objects built before the
install are counted, and the one warning and ``status`` say how many) and ``count_zeros``
behind ``torch.no_grad()``'s wrapper (a declared decorator). The sniff, the vendored code,
the contract kit and the construction-time behaviour run here. A real
``LayerWiseDistributedOptimizer`` is built on CPU (data-parallel size 1: no process group is
needed) with the installed constructor and with the rebuilt one.
"""

import dataclasses
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from backports.megatron import Action, BackportWarning, Verdict, apply, revert, status
from backports.megatron.catalog import by_id
from backports.megatron.model import SniffFailed
from backports.megatron.private_globals import with_globals
from backports.megatron.vendored import vendored_module
from tests.deciding import resolve_target, sniff_replacement
from tests.reports import report_for

ID = "megatron-lm-6099"
ENTRY = by_id(ID)
TP, EXPERT_TP = object(), object()  # process groups, seen by identity


@pytest.fixture
def targets() -> list[Any]:
    return [resolve_target(target, ID) for target in ENTRY.targets]


@pytest.fixture(scope="module")
def layer_wise() -> type:
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

    return LayerWiseDistributedOptimizer


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(targets):
    result = ENTRY.sniff(targets)
    assert result.fixed is False
    assert result.detail["count_zeros"] == {"count_zeros_fp32_groups": [None, None]}
    assert result.detail["constructor"]["with_expt_tp"] == {"optimizer": None, "child": None}


@pytest.mark.parametrize("upstream_only", [True, False])
def test_sniff_says_fixed_on_the_rebuilt_methods(targets, upstream_only):
    module = vendored_module(ENTRY.vendored)
    result = sniff_replacement(ENTRY, module, upstream_only=upstream_only, targets=targets)
    assert result.fixed is True, result.summary
    groups = result.detail["constructor"]
    assert groups["with_expt_tp"]["child"] == ["tp group", "expert tp group"]
    assert groups["without_expt_tp"]["child"] == ["tp group", "tp group"]  # expt_tp, else tp


@pytest.mark.parametrize("half", [0, 1])
def test_one_half_fixed_is_incompatible(targets, half):
    module = vendored_module(ENTRY.vendored)
    rebuilt = [module.layer_wise_optimizer_init, module.count_zeros][half]
    mixed = list(targets)
    mixed[half] = dataclasses.replace(targets[half], original=rebuilt)
    with pytest.raises(SniffFailed, match="only one half is fixed"):
        ENTRY.sniff(mixed)


# --- a real LayerWiseDistributedOptimizer on CPU -----------------------------------------


def _optimizer(cls: type) -> tuple[Any, Any]:
    """A real optimizer of ``cls`` over one parameter (fp32, data-parallel size 1), and its
    child torch optimizer (given the ``config`` and ``get_parameters`` megatron's wrappers
    have: they need CUDA to be built)."""
    import torch
    from megatron.core.optimizer.optimizer_config import OptimizerConfig

    parameter = torch.nn.Parameter(torch.zeros(3))
    child = torch.optim.Adam([parameter])
    child.get_parameters = lambda: [parameter]  # type: ignore[attr-defined]
    groups = SimpleNamespace(tp=TP, expt_tp=EXPERT_TP, dp_cp=None, expt_dp=None)
    config = OptimizerConfig(optimizer="adam", lr=1e-3, bf16=False)
    child.config = config  # type: ignore[attr-defined]
    return cls([child], config, groups), child


def _groups_counted_with(count_zeros: Any, optimizer: Any) -> list[Any]:
    """The groups ``count_zeros`` hands ``count_zeros_fp32`` (recorded in a private copy of
    its globals: the real one allocates on CUDA)."""
    import inspect

    seen: list[dict[str, Any]] = []
    # An installed backport's shim wraps the original by name (``__wrapped__``): the body it
    # calls is its ``__backport_body__``.
    body = inspect.unwrap(getattr(count_zeros, "__backport_body__", count_zeros))
    recording = with_globals(body, {"count_zeros_fp32": lambda *a, **kw: seen.append(kw) or 0})
    recording(optimizer)
    return [seen[0].get("tp_group"), seen[0].get("expert_tp_group")]


def test_a_real_optimizer_gets_the_groups_from_the_rebuilt_constructor_only(layer_wise):
    module = vendored_module(ENTRY.vendored)
    fixed_class = type("Fixed", (layer_wise,), {"__init__": module.layer_wise_optimizer_init})

    stock, stock_child = _optimizer(layer_wise)
    assert not hasattr(stock, "tp_group") and not hasattr(stock_child, "tp_group")
    assert _groups_counted_with(vars(layer_wise)["count_zeros"], stock) == [None, None]

    fixed, fixed_child = _optimizer(fixed_class)
    assert (fixed.tp_group, fixed.expert_tp_group) == (TP, EXPERT_TP)
    assert (fixed_child.tp_group, fixed_child.expert_tp_group) == (TP, EXPERT_TP)
    assert fixed.chained_optimizers == [fixed_child]
    assert _groups_counted_with(module.count_zeros, fixed) == [TP, EXPERT_TP]


# The contract kit runs for every entry in tests/catalog/test_contract.py (its reload check
# in the slow selection); what follows is specific to this fix.


# --- installed: construction time ------------------------------------------------------------


def test_apply_warns_how_many_optimizers_were_built_before_it(layer_wise):
    """A constructor fix cannot reach an optimizer that exists: the one warning for this
    backport says so and how many, and ``status`` says the same."""
    built = [_optimizer(layer_wise)[0] for _ in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        said = [str(w.message) for w in caught if issubclass(w.category, BackportWarning)]
        mine = [text for text in said if ID in text]
        assert len(mine) == 1 and "2 LayerWiseDistributedOptimizer" in mine[0], said
        assert "built before" in mine[0]
        again = report_for(status(ID), ID)
        assert "2 LayerWiseDistributedOptimizer" in again.reason
    finally:
        revert(ID)
    assert len(built) == 2


def test_no_optimizer_before_apply_no_word_of_it(layer_wise):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        assert not [w for w in caught if "built before" in str(w.message)]
    finally:
        revert(ID)


def test_an_optimizer_built_after_apply_has_the_groups_and_one_after_revert_has_not(layer_wise):
    report = report_for(apply(ID), ID)
    try:
        assert report.verdict is Verdict.NEEDED and report.action is Action.INSTALLED
        fixed, child = _optimizer(layer_wise)
        assert (child.tp_group, child.expert_tp_group) == (TP, EXPERT_TP)
        assert _groups_counted_with(vars(layer_wise)["count_zeros"], fixed) == [TP, EXPERT_TP]
    finally:
        revert(ID)
    _, child = _optimizer(layer_wise)
    assert not hasattr(child, "tp_group")


def test_an_optimizer_built_before_apply_keeps_stock_count_zeros(layer_wise, monkeypatch):
    """The fixed ``count_zeros`` reads ``tp_group``, which only the fixed constructor sets:
    on an optimizer built before ``apply()`` the live method runs 0.19.2's, as the README
    promises (it raised AttributeError), while one built after gets the groups."""
    import megatron.core.optimizer.layer_wise_optimizer as home

    calls: list[dict[str, Any]] = []
    # The real one allocates on CUDA: a recorder in the module both versions read it from.
    monkeypatch.setattr(home, "count_zeros_fp32", lambda *a, **kw: calls.append(kw) or 0)
    old, _ = _optimizer(layer_wise)
    old.count_zeros()  # stock, before apply: the reference
    stock = calls.pop()
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        assert getattr(vars(layer_wise)["count_zeros"], "__backport__", None) == ID
        assert old.count_zeros() == 0 and calls.pop() == stock
        new, _ = _optimizer(layer_wise)
        new.count_zeros()
        counted = calls.pop()
        assert (counted.get("tp_group"), counted.get("expert_tp_group")) == (TP, EXPERT_TP)
    finally:
        revert(ID)
    old.count_zeros()
    assert calls.pop() == stock
