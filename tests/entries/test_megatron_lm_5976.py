"""megatron-lm-5976: Megatron-FSDP's ``fully_shard_optimizer`` pre-initialises the optimizer
state with an inert step (Adam's step stays 0, weight decay is not applied).

One fix, two distributions: megatron-core's vendored copy
(``megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard``) and the megatron-fsdp
wheel's (``megatron_fsdp.fully_shard``), each judged and installed on its own (``copies``).
The real function of each copy runs on CPU with a torch AdamW over a parameter that carries a
stand-in MegatronFSDP model (what the function reads of it: ``model_auto_sync`` and the
methods the wrapped step calls); the reference is a plain AdamW on the same parameter.
"""

import dataclasses
import importlib.metadata
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.version import Version

from backports.megatron import Action, Verdict, apply, revert, status
from backports.megatron.catalog import by_id
from backports.megatron.model import Copy, SniffFailed, Target
from backports.megatron.vendored import vendored_module
from tests.deciding import probe, resolve_target, sniff_replacement
from tests.reports import report_for

ID = "megatron-lm-5976"
ENTRY = by_id(ID)
CORE = "megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard"
WHEEL = "megatron_fsdp.fully_shard"
LR, WEIGHT_DECAY = 1e-2, 0.1


def _module(name: str) -> Any:
    import importlib

    importlib.import_module(name)
    return sys.modules[name]  # megatron_fsdp.fully_shard the attribute is the function


def _pre_initialised(fully_shard_optimizer: Any) -> dict[str, float]:
    """A real AdamW over a parameter of ones given to ``fully_shard_optimizer``, then one
    real step with a gradient of ones: Adam's step after the pre-initialisation, how far it
    moved the parameter, and the first real update; beside a plain AdamW's first update."""
    import torch

    fsdp = SimpleNamespace(
        model_auto_sync=True,
        install_optimized_model_weights=lambda: None,
        zero_grad_buffer=lambda: None,
    )
    parameter = torch.nn.Parameter(torch.ones(3))
    parameter._megatron_fsdp_model = fsdp
    optimizer = torch.optim.AdamW([parameter], lr=LR, weight_decay=WEIGHT_DECAY)
    fully_shard_optimizer(optimizer, preproc_state_dict_for_dcp_ckpt=False)
    step = float(optimizer.state[parameter]["step"])
    moved = float((parameter.detach() - 1).abs().max())
    before = parameter.detach().clone()
    parameter.grad = torch.ones(3)
    optimizer.step()
    update = float((parameter.detach() - before)[0])
    # The reference: torch's AdamW alone, first step from the same parameter.
    plain = torch.nn.Parameter(torch.ones(3))
    reference = torch.optim.AdamW([plain], lr=LR, weight_decay=WEIGHT_DECAY)
    plain.grad = torch.ones(3)
    reference.step()
    expected = float(plain.detach()[0] - 1)
    return {"step": step, "moved": moved, "update": update, "expected": expected}


def _buggy(seen: dict[str, float]) -> bool:
    return seen["step"] == 1 and seen["moved"] > 0 and seen["update"] / seen["expected"] < 0.8


def _fixed(seen: dict[str, float]) -> bool:
    return seen == {**seen, "step": 0.0, "moved": 0.0, "update": seen["expected"]}


@pytest.fixture(scope="module")
def parts() -> dict[str, Any]:
    return {part.target.distribution: part for part in ENTRY.parts()}


# --- the entry's shape ---------------------------------------------------------------------


def test_one_entry_two_parts_each_dated_by_its_own_distribution(parts):
    assert list(parts) == ["megatron-core", "megatron-fsdp"]
    core, wheel = parts["megatron-core"], parts["megatron-fsdp"]
    assert (core.target.modules, core.bug_since) == ((CORE,), Version("0.17"))
    assert (wheel.target.modules, wheel.bug_since) == ((WHEEL,), Version("0.4"))
    assert wheel.target_since == Version("0.3") and not core.copies and not wheel.copies
    assert core.id == wheel.id == ID and core.vendored == wheel.vendored == ENTRY.vendored


def test_copies_must_name_a_distribution_of_its_targets():
    with pytest.raises(ValueError, match="which no target is in"):
        dataclasses.replace(ENTRY, copies=(Copy("megatron-nothing", Version("1")),))
    with pytest.raises(ValueError, match="the first target's"):
        dataclasses.replace(ENTRY, copies=(Copy("megatron-core", Version("1")),))


# --- the sniff, per copy ---------------------------------------------------------------------


@pytest.mark.parametrize("distribution", ["megatron-core", "megatron-fsdp"])
def test_sniff_says_needed_on_each_installed_copy(parts, distribution):
    part = parts[distribution]
    result = part.sniff([resolve_target(part.target, ID)])
    assert result.fixed is False, result.summary
    assert result.detail["step_after_pre_init"] == 1.0
    assert result.detail["parameter_moved_by"] > 0


@pytest.mark.parametrize("upstream_only", [True, False])
@pytest.mark.parametrize("distribution", ["megatron-core", "megatron-fsdp"])
def test_sniff_says_fixed_on_each_rebuilt_copy(parts, distribution, upstream_only):
    part = parts[distribution]
    targets = [resolve_target(part.target, ID)]
    module = vendored_module(ENTRY.vendored)
    result = sniff_replacement(part, module, upstream_only=upstream_only, targets=targets)
    assert result.fixed is True, result.summary
    assert result.detail["first_update"] == pytest.approx(result.detail["adamw_first_update"])


def test_each_copy_is_rebuilt_from_its_own_module():
    module = vendored_module(ENTRY.vendored)
    core, wheel = module.fully_shard_optimizer, module.megatron_fsdp_fully_shard_optimizer
    assert core.__globals__ is vars(_module(CORE))
    assert wheel.__globals__ is vars(_module(WHEEL))
    assert core._experimental_api is wheel._experimental_api is True  # as the installed


def test_sniff_refuses_a_function_unlike_any_version(parts):
    part = parts["megatron-core"]
    resolved = resolve_target(part.target, ID)
    with pytest.raises(SniffFailed):
        part.sniff([dataclasses.replace(resolved, original=lambda optimizer, **kw: optimizer)])


# --- the real functions on CPU: before apply, after apply, after revert ---------------------


@pytest.mark.parametrize("module_name", [CORE, WHEEL])
def test_real_fully_shard_optimizer_before_apply_after_and_after_revert(module_name):
    import megatron.core.distributed.fsdp.src.megatron_fsdp as core_package
    import megatron_fsdp

    package = megatron_fsdp if module_name == WHEEL else core_package
    module = _module(module_name)
    stock = module.fully_shard_optimizer
    assert _buggy(_pre_initialised(stock))
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        # The defining module and the package that imported it by name: both fixed.
        for holder in (module, package):
            assert getattr(holder.fully_shard_optimizer, "__backport__", None) == ID
            assert _fixed(_pre_initialised(holder.fully_shard_optimizer))
    finally:
        revert(ID)
    assert module.fully_shard_optimizer is stock and package.fully_shard_optimizer is stock
    assert _buggy(_pre_initialised(stock))


def test_a_capturable_tensor_lr_stays_a_tensor_and_group_steps_rewind():
    """The rebuilt function on optimizers whose lr is a tensor and whose step is kept per
    group (a stand-in: torch's capturable optimizers need CUDA)."""
    import torch

    module = vendored_module(ENTRY.vendored)
    lr = torch.tensor(LR)

    class GroupStepOptimizer(torch.optim.SGD):
        def step(self, closure=None):  # counts per group, moves nothing when lr is 0
            for group in self.param_groups:
                group["step"] = group.get("step", 0) + 1
                seen.append((group["lr"], group["weight_decay"]))

    seen: list[Any] = []
    parameter = torch.nn.Parameter(torch.ones(2))
    parameter._megatron_fsdp_model = SimpleNamespace(model_auto_sync=True)
    optimizer = GroupStepOptimizer([parameter], lr=lr, weight_decay=WEIGHT_DECAY)
    module.fully_shard_optimizer(optimizer, preproc_state_dict_for_dcp_ckpt=False)
    ((inert_lr, inert_decay),) = seen
    assert isinstance(inert_lr, torch.Tensor) and float(inert_lr) == 0 and inert_decay == 0
    group = optimizer.param_groups[0]
    assert group["lr"] is lr and group["weight_decay"] == WEIGHT_DECAY and group["step"] == 0


# --- each copy on its own evidence ----------------------------------------------------------


def test_status_shows_both_copies_needed():
    report = report_for(status(ID), ID)
    assert report.verdict is Verdict.NEEDED and report.action is Action.WOULD_INSTALL
    assert report.reason.startswith("megatron-core 0.19.2 lacks the fix: ")
    assert "; megatron-fsdp 0.6.1 lacks the fix: " in report.reason
    copies = {c["distribution"]: c for c in report.evidence["copies"]}
    assert [copies[d]["verdict"] for d in ("megatron-core", "megatron-fsdp")] == ["needed"] * 2
    assert copies["megatron-fsdp"]["evidence"]["distribution"]["version"] == "0.6.1"
    assert copies["megatron-core"]["evidence"]["distribution"]["version"] == "0.19.2"


def test_a_copy_whose_release_predates_it_is_left_and_the_other_installed():
    """megatron-fsdp dated after 0.6.1: its copy is absent on its own version, and only
    megatron-core's is installed."""
    later = dataclasses.replace(ENTRY, copies=(Copy("megatron-fsdp", Version("0.7")),))
    decision = probe(later)
    assert decision.verdict is Verdict.NEEDED and decision.installable
    assert [t.modules for t in decision.spec.targets] == [(CORE,)]
    copies = {c["distribution"]: c for c in decision.evidence["copies"]}
    assert copies["megatron-fsdp"]["verdict"] == "absent"
    assert "megatron-fsdp 0.6.1 predates 0.7" in copies["megatron-fsdp"]["reason"]


_MADE_UP_FIXED = '''
"""A made-up release of fully_shard.py whose fully_shard_optimizer has the fix: it builds
the optimizer state with a step that moves nothing and counts nothing."""

import types

import torch


def fully_shard_optimizer(optimizer, preproc_state_dict_for_dcp_ckpt=True):
    model = optimizer.param_groups[0]["params"][0]._megatron_fsdp_model
    kept = [dict(lr=g["lr"], weight_decay=g["weight_decay"]) for g in optimizer.param_groups]
    for group in optimizer.param_groups:
        group.update(lr=0.0, weight_decay=0.0)
        for parameter in group["params"]:
            parameter.grad = torch.zeros_like(parameter)
    type(optimizer).step(optimizer)
    for group, settings in zip(optimizer.param_groups, kept):
        group.update(settings)
    for state in optimizer.state.values():
        state["step"].zero_()
    type(optimizer).zero_grad(optimizer)

    def step(self, *args, **kwargs):
        type(self).step(self, *args, **kwargs)
        model.install_optimized_model_weights()

    optimizer.step = types.MethodType(step, optimizer)
    return optimizer
'''


def test_a_fixed_copy_is_upstream_and_only_the_other_is_installed(tmp_path, monkeypatch):
    """megatron-fsdp's copy stood for by a made-up fixed release (a module written here):
    that copy is ``upstream``, megatron-core's still ``needed``, installed alone."""
    (tmp_path / "made_up_fixed_fully_shard.py").write_text(textwrap.dedent(_MADE_UP_FIXED))
    monkeypatch.syspath_prepend(str(tmp_path))
    made_up = dataclasses.replace(ENTRY.targets[1], modules=("made_up_fixed_fully_shard",))
    assert isinstance(made_up, Target)
    entry = dataclasses.replace(ENTRY, targets=(ENTRY.targets[0], made_up))
    # A fixed sniff alone is not enough: with no recorded text, git or release it is drifted.
    unrecorded = {c["distribution"]: c for c in probe(entry).evidence["copies"]}
    assert unrecorded["megatron-fsdp"]["verdict"] == "incompatible"
    assert "drifted" in unrecorded["megatron-fsdp"]["reason"]
    # Recorded as landed in the installed megatron-fsdp release (its copy's fixed_in).
    fsdp = importlib.metadata.version("megatron-fsdp")
    copies_fixed = tuple(
        dataclasses.replace(c, fixed_in=Version(fsdp)) if c.distribution == "megatron-fsdp" else c
        for c in ENTRY.copies
    )
    entry = dataclasses.replace(entry, copies=copies_fixed)
    decision = probe(entry)
    copies = {c["distribution"]: c for c in decision.evidence["copies"]}
    assert copies["megatron-fsdp"]["verdict"] == "upstream", copies["megatron-fsdp"]["reason"]
    assert copies["megatron-core"]["verdict"] == "needed"
    assert decision.verdict is Verdict.NEEDED
    assert [t.modules for t in decision.spec.targets] == [(CORE,)]
    monkeypatch.delitem(sys.modules, "made_up_fixed_fully_shard", raising=False)


# The contract kit runs for every entry in tests/catalog/test_contract.py (its reload check
# in the slow selection); what follows is specific to this fix.


@pytest.mark.slow  # a child interpreter that imports megatron (seconds)
def test_a_job_importing_one_copy_gets_both_installed(tmp_path):
    """``apply()`` before megatron is imported defers the entry; importing megatron-core's
    copy judges both copies (megatron-fsdp's module brought in, as for an entry that is not
    coupled) and installs both."""
    import json
    import os
    import subprocess

    script = textwrap.dedent(
        f"""
        import json, sys
        from backports.megatron import apply
        (report,) = apply("{ID}")
        deferred = str(report.action)
        wheel_before = "{WHEEL}" in sys.modules
        import {CORE}
        marks = [getattr(sys.modules[name].fully_shard_optimizer, "__backport__", None)
                 for name in ("{CORE}", "{WHEEL}")]
        print(json.dumps([deferred, wheel_before, marks]))
        """
    )
    env = {**os.environ, "MEGATRON_BACKPORTS_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    deferred, wheel_before, marks = json.loads(done.stdout.splitlines()[-1])
    assert (deferred, wheel_before, marks) == ("deferred", False, [ID, ID])
