"""megatron-lm-6507: the optimizer builder releases every parameter's high-precision init
value (FP8 / MXFP8 primary weights).

The vendored code is an epilogue on ``get_megatron_optimizer``, a function that
``megatron.training.training`` imports by name: the alias there is observed before apply,
after it and after revert. megatron-core 0.19.2's own builder runs here with the helpers
that need process groups or CUDA (the process-group set-up, the param-group builder, the
per-group optimizer, the chain) replaced in a private copy of its globals; the parameters
are stand-ins for Transformer Engine's FP8 primary weights (a getter and a clearer). What
should be released is written by hand: every value still held, on the Adam/SGD path only.
"""

import inspect
import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from backports.megatron._vendor.megatron_lm_6507.optimizer import (
    get_megatron_optimizer as vendored,
)

from backports.megatron import Action, Verdict, apply, revert, status
from backports.megatron.catalog import by_id
from backports.megatron.model import SniffFailed
from backports.megatron.private_globals import with_globals
from tests.paths import ROOT
from tests.reports import report_for
from tests.standins import recorded_as_carrying_the_fix

ID = "megatron-lm-6507"
ENTRY = by_id(ID)
NAME = "get_megatron_optimizer"
CHAIN = object()  # what the stubbed ChainedOptimizer returns, seen by identity


@pytest.fixture(scope="module")
def optimizer_module() -> types.ModuleType:
    import megatron.core.optimizer as module

    return module


@pytest.fixture(scope="module")
def training() -> types.ModuleType:
    import megatron.training.training as module  # imports get_megatron_optimizer by name

    return module


@pytest.fixture(scope="module")
def installed(optimizer_module: types.ModuleType) -> Callable[..., Any]:
    return vars(optimizer_module)[NAME]  # type: ignore[no-any-return]


class Fp8Param:
    """Transformer Engine's FP8 primary weight as the builder sees it: a host copy of its
    initial value behind ``get_/clear_high_precision_init_val``."""

    def __init__(self, value: object) -> None:
        self.value = value

    def get_high_precision_init_val(self) -> object:
        return self.value

    def clear_high_precision_init_val(self) -> None:
        self.value = None


def _chunk(params: list[Any], megatron_fsdp: bool = False) -> SimpleNamespace:
    ddp = SimpleNamespace(
        use_megatron_fsdp=megatron_fsdp,
        data_parallel_sharding_strategy="optim_grads_params",
        num_distributed_optimizer_instances=1,
    )
    return SimpleNamespace(parameters=lambda: list(params), ddp_config=ddp)


def _config(optimizer: str = "adam") -> SimpleNamespace:
    return SimpleNamespace(
        optimizer=optimizer,
        overlap_param_gather_with_optimizer_step=False,
        use_precision_aware_optimizer=False,
    )


def _helpers() -> dict[str, object]:
    """What needs process groups or CUDA in the builder, replaced (never the builder)."""

    class Groups(dict):
        def __missing__(self, key):
            return None

    return {
        "ProcessGroupCollection": SimpleNamespace(
            setup_process_groups_for_optimizer=lambda *args, **kwargs: Groups()
        ),
        "_get_param_groups_and_buffers": lambda *args, **kwargs: ([], {}),
        "_get_megatron_optimizer_based_on_param_groups": lambda **kwargs: SimpleNamespace(
            optimizer=SimpleNamespace()
        ),
        "ChainedOptimizer": lambda optimizers: CHAIN,
        "_get_megatron_emerging_optimizer": lambda **kwargs: "emerging",
    }


def _build(function: Callable[..., Any], stock: Callable[..., Any], *args: Any) -> object:
    """``function`` (the builder or a replacement of it) with the helpers replaced; a
    replacement finds ``stock`` with the same helpers where it reads the module."""
    helpers = _helpers()
    run = with_globals(function, {**helpers, NAME: with_globals(stock, helpers)})
    return run(*args)


def _held_values(params: list[Fp8Param]) -> list[object]:
    return [p.value for p in params]


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(installed):
    result = ENTRY.sniff([SimpleNamespace(original=installed, held=installed)])
    assert result.fixed is False
    assert result.detail["standard"] == {"returned": "the chain", "cleared": []}
    assert "keeps every parameter's high-precision init value" in result.summary


def test_sniff_says_fixed_on_vendored_code(installed):
    result = ENTRY.sniff([SimpleNamespace(original=vendored, held=installed)])
    assert result.fixed is True
    assert result.detail["standard"] == {"returned": "the chain", "cleared": ["held"]}
    assert result.detail["megatron_fsdp"]["cleared"] == []


def _clears_on_every_path(config, model_chunks, *rest):
    for chunk in model_chunks:
        for param in chunk.parameters():
            if hasattr(param, "clear_high_precision_init_val"):
                param.clear_high_precision_init_val()
    return "optimizer"


def _builds_nothing(config, model_chunks, *rest):
    """Releases the values as the fix does, but returns no optimizer."""
    if not model_chunks[0].ddp_config.use_megatron_fsdp:
        for param in model_chunks[0].parameters():
            if getattr(param, "get_high_precision_init_val", lambda: None)() is not None:
                param.clear_high_precision_init_val()
    return None


@pytest.mark.parametrize(
    ("function", "why"),
    [
        (_clears_on_every_path, "the Megatron-FSDP path cleared"),
        (_builds_nothing, "the standard path returned NoneType, not the chain"),
    ],
)
def test_sniff_raises_on_a_builder_unlike_any_version(installed, function, why):
    with pytest.raises(SniffFailed, match=why):
        ENTRY.sniff([SimpleNamespace(original=function, held=installed)])


def test_spec_parameters_match_installed_and_vendored(installed):
    expected = list(ENTRY.target.parameters)
    assert list(inspect.signature(installed).parameters) == expected
    assert list(inspect.signature(vendored).parameters) == expected


# --- the epilogue on megatron-core 0.19.2's builder ------------------------------------------


def test_stock_builder_keeps_every_value_and_the_epilogue_releases_them(installed):
    params = [Fp8Param("copy 0"), Fp8Param("copy 1"), Fp8Param(None)]
    chunks = [_chunk(params[:2]), _chunk(params[2:])]
    assert _build(installed, installed, _config(), chunks, {}) is CHAIN
    assert _held_values(params) == ["copy 0", "copy 1", None]
    assert _build(vendored, installed, _config(), chunks, {}) is CHAIN
    assert _held_values(params) == [None, None, None]


@pytest.mark.parametrize(
    ("config", "chunk_fsdp", "returned"),
    [(_config("muon"), False, "emerging"), (_config(), True, None)],
    ids=["emerging-optimizer", "megatron-fsdp"],
)
def test_paths_that_return_before_the_new_lines_keep_the_values(
    installed, config, chunk_fsdp, returned
):
    """As upstream at the merge: the emerging-optimizer and Megatron-FSDP paths return
    before the release lines."""
    params = [Fp8Param("copy")]
    built = _build(vendored, installed, config, [_chunk(params, chunk_fsdp)], {})
    if returned is not None:
        assert built == returned
    assert _held_values(params) == ["copy"]


# --- megatron's own alias: before apply, after it, after revert ------------------------------


def _through_training_alias(training, installed) -> list[object]:
    """The builder as ``megatron.training.training`` holds it (what its
    ``setup_model_and_optimizer`` calls), on one chunk of FP8 primary weights."""
    params = [Fp8Param("copy 0"), Fp8Param("copy 1")]
    assert _build(training.get_megatron_optimizer, installed, _config(), [_chunk(params)], {}) is (
        CHAIN
    )
    return _held_values(params)


def test_training_alias_releases_after_apply_and_keeps_after_revert(training, installed):
    assert training.get_megatron_optimizer is installed
    assert _through_training_alias(training, installed) == ["copy 0", "copy 1"]
    report = report_for(apply(only=ID), ID)
    try:
        assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
        assert training.get_megatron_optimizer.__backport__ == ID
        assert _through_training_alias(training, installed) == [None, None]
    finally:
        report_for(revert(only=ID), ID)
    assert training.get_megatron_optimizer is installed
    assert _through_training_alias(training, installed) == ["copy 0", "copy 1"]


def test_lazy_importers_get_the_replacement_while_applied(optimizer_module, installed):
    """MiMo's optimizer and ``muon`` import the builder when they run, from the module."""
    apply(only=ID)
    try:
        from megatron.core.optimizer import get_megatron_optimizer as lazily

        assert lazily.__backport__ == ID and lazily.__wrapped__ is installed
    finally:
        revert(only=ID)
    assert optimizer_module.get_megatron_optimizer is installed


# --- status ----------------------------------------------------------------------------------


def test_status_on_0_19_2_says_needed_with_its_reason():
    report = report_for(status(only=ID), ID)
    assert report.verdict is Verdict.NEEDED
    assert "high-precision init value" in report.reason


_FIXED_SOURCE = '''
def get_megatron_optimizer(
    config,
    model_chunks,
    config_overrides=None,
    use_gloo_process_groups=True,
    pg_collection=None,
    dump_param_to_param_group_map=None,
):
    """Behaves like megatron after #6507 on the standard path, Megatron-FSDP's included."""
    ProcessGroupCollection.setup_process_groups_for_optimizer(
        pg_collection, model_chunks, use_gloo_process_groups
    )
    if model_chunks[0].ddp_config.use_megatron_fsdp:
        return _get_megatron_optimizer_based_on_param_groups(config=config)
    optimizers = [_get_megatron_optimizer_based_on_param_groups(config=config)]
    for chunk in model_chunks:
        for param in chunk.parameters():
            held = getattr(param, "get_high_precision_init_val", None)
            if held is not None and held() is not None:
                param.clear_high_precision_init_val()
    return ChainedOptimizer(optimizers)
'''


def _fixed_variant(module: types.ModuleType) -> types.FunctionType:
    """A function of ``module`` (compiled under its file name, its globals) with the fix:
    what a megatron-core with #6507 merged holds, reduced to the paths the sniff takes."""
    scratch: dict[str, Any] = {}
    exec(compile(_FIXED_SOURCE, module.__file__, "exec"), scratch)
    code = scratch[NAME].__code__
    function = types.FunctionType(code, vars(module), NAME, scratch[NAME].__defaults__)
    function.__module__ = module.__name__
    return function


def test_status_on_a_release_with_the_fix_says_upstream(optimizer_module, monkeypatch):
    monkeypatch.setattr(optimizer_module, NAME, _fixed_variant(optimizer_module))
    # The sniff alone is not enough: with no recorded text, git or release it is "drifted".
    drifted = report_for(status(only=ID), ID)
    assert drifted.verdict is Verdict.INCOMPATIBLE and "drifted" in drifted.reason
    recorded_as_carrying_the_fix(monkeypatch, ID)
    report = report_for(status(only=ID), ID)
    assert report.verdict is Verdict.UPSTREAM, report.reason
    assert report.action is Action.WOULD_SKIP
    assert "vendor/megatron_lm_6507" in report.reason


# The contract kit runs for every entry in tests/catalog/test_contract.py (its reload check
# in the slow selection); what follows is specific to this fix.


# --- megatron's real builder over its real DDP and DistributedOptimizer --------------------


@pytest.mark.slow  # a child interpreter over gloo (~30 s)
def test_real_builder_rehearsed_on_cpu_keeps_then_releases_then_keeps(tmp_path):
    """tools/gpu_jobs/fp8_init_vals.py (the one-GPU job, CPU memory standing in for the
    GPU's): six parameters with host copies; the builder, called by the name
    ``megatron.training.training`` holds, leaves six stock, none with the backport, six
    after revert."""
    import json
    import subprocess
    import sys

    job = ROOT / "tools" / "gpu_jobs" / "fp8_init_vals.py"
    out = tmp_path / "fp8_init_vals.json"
    command = [sys.executable, "-P", str(job), "--device", "cpu", "--json", str(out)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    held = {name: run["host_copies_held"] for name, run in runs.items()}
    assert held == {"stock": 6, "backport": 0, "reverted": 6}
    assert [runs[n]["builder_backport"] for n in ("stock", "backport", "reverted")] == [
        None,
        ID,
        None,
    ]
