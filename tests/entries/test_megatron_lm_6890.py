"""megatron-lm-6890: the fused MLA YaRN RoPE kernels mask on the head index.

The kernels are module attributes that are not functions (Triton ``Autotuner`` objects):
``ModuleAttribute`` targets, rebound in every module that holds them. Here: the
rule's edit (five masks, the decorators kept), the sniff's verdicts from what a child saw,
how it names kernels for the child and keeps what it saw, ``UPSTREAM.toml`` (two open pull
requests, no SHA), and (slow) the real child: ``TRITON_INTERPRET=1``, stock 0.19.2 needed,
the rebuilt kernels fixed, one child for both. The GPU run through
``fused_apply_mla_rope_for_q/kv`` is ``tests/gpu/test_megatron_lm_6890_gpu.py``.
"""

import dataclasses
import inspect
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from backports.megatron import Action, apply, revert
from backports.megatron.catalog import by_id
from backports.megatron.catalog import megatron_lm_6890 as entry_module
from backports.megatron.model import ResolvedTarget, SniffFailed
from backports.megatron.vendored import vendored_module
from backports.megatron.vendored.manifest import manifest_problems
from tests.paths import ROOT
from tests.reports import report_for

ID = "megatron-lm-6890"
ENTRY = by_id(ID)
KERNELS = entry_module.KERNELS
CLEAN = {"exact": True, "guards_intact": True}


@pytest.fixture(scope="module")
def rope() -> Any:
    import megatron.core.fusions.fused_mla_yarn_rope_apply as rope

    return rope


@pytest.fixture
def targets(rope: Any) -> list[ResolvedTarget]:
    """What the module-attribute kind will resolve: each kernel object in its module."""
    return [
        ResolvedTarget(rope.__name__, rope, name, getattr(rope, name), None) for name in KERNELS
    ]


@pytest.fixture
def rebuilt_targets(targets: list[ResolvedTarget]) -> list[ResolvedTarget]:
    module = vendored_module(ENTRY.vendored)
    return [dataclasses.replace(t, original=getattr(module, t.attribute)) for t in targets]


# --- renamed upstream (#5944) ---------------------------------------------------------------


def _as_after_5944(rope: Any, monkeypatch: pytest.MonkeyPatch, renamed: bool) -> None:
    """The module as main has it since #5944: the four kernels gone under their old names,
    and (``renamed``) each defined under its new name (the very kernel: the bug kept)."""
    for old, new in entry_module.RENAMED_IN_5944.items():
        if renamed:
            monkeypatch.setattr(rope, new, getattr(rope, old), raising=False)
        monkeypatch.delattr(rope, old)


def test_kernels_renamed_upstream_are_reported_as_renamed_never_absent(rope, monkeypatch):
    """Before, the verdict was ``absent``, which ``audit`` reads "not needed", while the
    renamed kernels still had the bug."""
    from tests.deciding import probe

    _as_after_5944(rope, monkeypatch, renamed=True)
    decision = probe(ENTRY)
    assert decision.verdict.value == "incompatible", decision.reason
    assert "renamed upstream in #5944 (e4ba3a30f2d8)" in decision.reason
    assert f"{rope.__name__}.rotary_fwd_q_kernel is now _mla_rope_fwd_inplace_kernel" in (
        decision.reason
    )
    assert "check by hand whether the renamed code still has the bug" in decision.reason


def test_kernels_gone_without_their_new_names_stay_absent(rope, monkeypatch):
    from tests.deciding import probe

    _as_after_5944(rope, monkeypatch, renamed=False)
    decision = probe(ENTRY)
    assert decision.verdict.value == "absent", decision.reason
    assert "renamed" not in decision.reason


# --- the rule -------------------------------------------------------------------------------


def _python_source(kernel: Any) -> str:
    return inspect.getsource(kernel.fn.fn)


def test_the_rule_masks_all_five_on_the_head_index_and_keeps_the_autotuning(rope):
    module = vendored_module(ENTRY.vendored)
    head_masks = []
    for name in KERNELS:
        installed, rebuilt = getattr(rope, name), getattr(module, name)
        before, after = _python_source(installed), _python_source(rebuilt)
        assert (
            before.count("< head_num *")
            == after.count("< head_num")
            == (2 if name == "rotary_bwd_kv_kernel" else 1)
        )
        assert "< head_num *" not in after
        head_masks += [line.strip() for line in after.splitlines() if "< head_num" in line]
        # The same autotuning: configs, keys, restored arguments; a new JIT function.
        assert [c.kwargs for c in rebuilt.configs] == [c.kwargs for c in installed.configs]
        assert (rebuilt.keys, rebuilt.restore_value) == (installed.keys, installed.restore_value)
        assert type(rebuilt) is type(installed) and rebuilt.fn is not installed.fn
        assert rebuilt.fn.fn.__globals__ is vars(rope)  # the kernel's globals, read live
    assert head_masks == [
        *["mask = (pid_head * BLOCK_H + tl.arange(0, BLOCK_H))[:, None] < head_num"] * 4,
        "mask = (i * BLOCK_H + tl.arange(0, BLOCK_H))[:, None] < head_num",
    ]


def test_a_rebuilt_kernel_bound_in_the_module_is_asked_for_again_without_a_rebuild(
    rope, monkeypatch
):
    """Once the kind binds a rebuilt kernel in megatron's module, the vendored module hands
    out that same object (it cannot rebuild from it: its source is the rule's, not the file's)."""
    module = vendored_module(ENTRY.vendored)
    rebuilt = module.rotary_fwd_q_kernel
    monkeypatch.setattr(rope, "rotary_fwd_q_kernel", rebuilt)
    assert module.rotary_fwd_q_kernel is rebuilt


# --- the sniff's verdicts --------------------------------------------------------------------


def _seen(fixed: set[str], control: dict[str, Any] | None = None) -> dict[str, Any]:
    broken = {"exact": False, "guards_intact": False}
    return {
        name: {"BLOCK_H=4": CLEAN if name in fixed else broken, "BLOCK_H=2": control or CLEAN}
        for name in KERNELS
    }


def _sniff_on(monkeypatch: pytest.MonkeyPatch, targets: Any, kernels: dict[str, Any]) -> Any:
    def child(sets: dict[str, Any]) -> dict[str, Any]:
        return {"sets": {label: {"kernels": kernels} for label in sets}, "megatron": "here"}

    monkeypatch.setattr(entry_module, "_SEEN", {})
    monkeypatch.setattr(entry_module, "kernels_in_child", child)
    return ENTRY.sniff(targets)


def test_none_fixed_is_needed_all_fixed_is_fixed(monkeypatch, targets):
    assert _sniff_on(monkeypatch, targets, _seen(set())).fixed is False
    assert _sniff_on(monkeypatch, targets, _seen(set(KERNELS))).fixed is True


def test_some_fixed_or_a_failed_control_is_incompatible(monkeypatch, targets):
    with pytest.raises(SniffFailed, match="some kernels mask on the head index"):
        _sniff_on(monkeypatch, targets, _seen({"rotary_fwd_q_kernel"}))
    with pytest.raises(SniffFailed, match="BLOCK_H=2"):
        _sniff_on(monkeypatch, targets, _seen(set(), {"exact": False, "guards_intact": True}))
    missing = {name: runs for name, runs in _seen(set()).items() if name != KERNELS[0]}
    with pytest.raises(SniffFailed, match="the child ran"):
        _sniff_on(monkeypatch, targets, missing)


def test_one_child_judges_the_installed_and_the_rebuilt_kernels(
    monkeypatch, targets, rebuilt_targets
):
    asked: list[dict[str, Any]] = []

    def child(sets: dict[str, Any]) -> dict[str, Any]:
        asked.append(sets)
        runs = {"asked": {"kernels": _seen(set())}, "vendored": {"kernels": _seen(set(KERNELS))}}
        return {"sets": {label: runs[label] for label in sets}, "megatron": "here"}

    monkeypatch.setattr(entry_module, "_SEEN", {})
    monkeypatch.setattr(entry_module, "kernels_in_child", child)
    assert ENTRY.sniff(targets).fixed is False
    assert ENTRY.sniff(rebuilt_targets).fixed is True
    assert ENTRY.sniff(targets).fixed is False
    (sets,) = asked
    assert sets["asked"] == {
        name: ("megatron.core.fusions.fused_mla_yarn_rope_apply", name) for name in KERNELS
    }
    assert sets["vendored"] == {name: (entry_module._VENDORED, name) for name in KERNELS}


def _sniff_into(results: dict[str, bool], name: str, targets: Any) -> None:
    results[name] = ENTRY.sniff(targets).fixed


def test_the_two_sniffs_side_by_side_start_one_child(monkeypatch, targets, rebuilt_targets):
    """``decide`` runs the sniff on the installed and on the vendored kernels in two threads
    at once; whichever asks first, one child judges both sets (issue 43)."""
    import threading

    asked: list[dict[str, Any]] = []

    def child(sets: dict[str, Any]) -> dict[str, Any]:
        asked.append(sets)
        time.sleep(0.2)  # a child takes seconds: the other thread asks meanwhile
        runs = {
            "asked": None,
            "installed": {"kernels": _seen(set())},
            "vendored": {"kernels": _seen(set(KERNELS))},
        }
        first = "vendored" if "installed" in sets else "installed"
        runs["asked"] = runs[first]
        return {"sets": {label: runs[label] for label in sets}, "megatron": "here"}

    monkeypatch.setattr(entry_module, "kernels_in_child", child)
    for first, second in ((targets, rebuilt_targets), (rebuilt_targets, targets)):
        monkeypatch.setattr(entry_module, "_SEEN", {})
        asked.clear()
        results: dict[str, bool] = {}
        threads = [
            threading.Thread(target=_sniff_into, args=(results, "first", first)),
            threading.Thread(target=_sniff_into, args=(results, "second", second)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(asked) == 1, asked
        assert results == {"first": first is rebuilt_targets, "second": second is rebuilt_targets}


def test_a_set_the_child_could_not_run_fails_the_sniff(monkeypatch, targets):
    def child(sets: dict[str, Any]) -> dict[str, Any]:
        return {"sets": {label: {"error": "SourceRuleRefused: x"} for label in sets}}

    monkeypatch.setattr(entry_module, "_SEEN", {})
    monkeypatch.setattr(entry_module, "kernels_in_child", child)
    with pytest.raises(SniffFailed, match="could not run them: SourceRuleRefused"):
        ENTRY.sniff(targets)


def test_a_kernel_no_module_holds_cannot_be_named_for_the_child(targets):
    stray = dataclasses.replace(targets[0], original=object())
    with pytest.raises(SniffFailed, match="held by no module"):
        ENTRY.sniff([stray, *targets[1:]])


# --- the real child (slow) -------------------------------------------------------------------


@pytest.mark.slow  # a child interpreter imports torch and megatron (about 10 s)
def test_the_child_sees_0_19_2_rewrite_rows_and_the_rebuilt_kernels_exact(
    monkeypatch, targets, rebuilt_targets
):
    children: list[float] = []
    real = entry_module.kernels_in_child

    def timed(sets: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return real(sets)
        finally:
            children.append(time.perf_counter() - started)

    monkeypatch.setattr(entry_module, "_SEEN", {})
    monkeypatch.setattr(entry_module, "kernels_in_child", timed)
    stock = ENTRY.sniff(targets)
    fixed = ENTRY.sniff(rebuilt_targets)
    assert stock.fixed is False and fixed.fixed is True, (stock.detail, fixed.detail)
    assert all(runs["BLOCK_H=2"] == CLEAN for runs in stock.detail["kernels"].values())
    assert all(runs["BLOCK_H=4"] != CLEAN for runs in stock.detail["kernels"].values())
    assert stock.detail["megatron"] == str(Path(inspect.getfile(targets[0].module)).parents[2])
    assert len(children) == 1, children
    print(f"\nthe kernel child: {children[0]:.1f} s")


# --- provenance -------------------------------------------------------------------------------


def test_upstream_toml_names_both_open_pull_requests_and_no_sha():
    data = tomllib.loads((ROOT / "vendor" / "megatron_lm_6890" / "UPSTREAM.toml").read_text())
    assert (data["pr"], data["related_prs"]) == (6890, [7104])
    assert not {"head_sha", "merge_sha"} & set(data)
    assert "#7103" in data["origin_note"] and "no head or merge SHA" in data["origin_note"]
    assert manifest_problems(data) == []


@pytest.mark.parametrize("bad", [[], ["7104"], [0], 7104])
def test_the_schema_refuses_related_prs_that_are_not_pull_request_numbers(bad):
    data = tomllib.loads((ROOT / "vendor" / "megatron_lm_6890" / "UPSTREAM.toml").read_text())
    assert manifest_problems({**data, "related_prs": bad}) == [
        f"related_prs must be a list of pull-request numbers, not {bad!r}"
    ]


# --- the install (the contract kit: tests/catalog/test_contract.py, for every entry) -------


def test_apply_rebinds_the_four_kernels_everywhere_and_revert_puts_back_the_very_objects(rope):
    import sys

    before = {name: getattr(rope, name) for name in KERNELS}
    holders = {
        module_name: name
        for module_name, module in list(sys.modules.items())
        for name in KERNELS
        if vars(module).get(name) is before[name]
    }
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        rebuilt = vendored_module(ENTRY.vendored)
        for module_name, name in holders.items():
            assert vars(sys.modules[module_name])[name] is getattr(rebuilt, name)
    finally:
        revert(ID)
    assert {name: getattr(rope, name) for name in KERNELS} == before
    assert all(vars(sys.modules[m])[n] is before[n] for m, n in holders.items())
