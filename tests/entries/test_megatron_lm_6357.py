"""megatron-lm-6357 (two halves of #6357): MFSDP v1 makes transformer, MoE and Mamba layers
FSDP units under every sharding strategy but ``no_shard`` (ZeRO-2 no longer holds every
gradient at once), and marks gathered parameters ``overwrite_main_grad`` only where the
gradient is sharded (ZeRO-1 accumulates micro-batches under TE's wgrad fusion).

The constructor is construction-time (a ``Constructor``: models wrapped before the install
are counted); ``all_gather_and_wait_parameters_ready`` ships in megatron-core and in the
megatron-fsdp wheel, each copy judged and installed on its own. The real constructor runs on
CPU on a bare instance of a subclass whose process-group set-up does nothing, up to the
MegatronFSDP it builds (a recorder in the real module's globals); the real method runs on a
stand-in MegatronFSDP whose all-gather does nothing.
"""

import dataclasses
import gc
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from backports.megatron import Action, BackportWarning, Verdict, apply, revert, status
from backports.megatron.catalog import by_id
from backports.megatron.model import SniffFailed
from backports.megatron.vendored import read_upstream, vendored_module
from tests.deciding import resolve_target, sniff_replacement
from tests.reports import report_for

ID = "megatron-lm-6357"
ENTRY = by_id(ID)
ADAPTER = "megatron.core.distributed.fsdp.mcore_fsdp_adapter"
CORE = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp"
WHEEL = "megatron_fsdp.megatron_fsdp"
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


@pytest.fixture(scope="module")
def parts() -> dict[str, Any]:
    return {part.target.distribution: part for part in ENTRY.parts()}


@pytest.fixture
def adapter(monkeypatch) -> Any:
    """The real adapter module, its MegatronFSDP a recorder that stops the constructor with
    the unit modules it chose (and nothing that needs process groups or a logger)."""
    import importlib

    module = importlib.import_module(ADAPTER)

    class Chosen(Exception):
        pass

    def megatron_fsdp(**kwargs: Any) -> None:
        raise Chosen(kwargs["fsdp_unit_modules"])

    monkeypatch.setattr(module, "MegatronFSDP", megatron_fsdp)
    monkeypatch.setattr(module, "MixedPrecisionPolicy", lambda **kwargs: None)
    monkeypatch.setattr(module, "log_single_rank", lambda *args, **kwargs: None)
    monkeypatch.setattr(module, "has_config_logger_enabled", lambda config: False)
    module.Chosen = Chosen  # type: ignore[attr-defined]  (undone below)
    yield module
    del module.Chosen


class _Off(SimpleNamespace):
    def __getattr__(self, name: str) -> None:
        return None


def _wrapped_class(adapter: Any) -> type:
    """A subclass of the live FullyShardedDataParallel without process groups."""
    return type(
        "CpuFSDP",
        (adapter.FullyShardedDataParallel,),
        {
            "__setattr__": object.__setattr__,
            "_init_dist_index": lambda self, pg_collection: None,
            "_annotate_tensor_parallelism": lambda self, module: None,
            "_fine_grained_recurse_module_types": lambda self, *args: None,
        },
    )


def _units(adapter: Any, strategy: str, cls: type | None = None) -> tuple[list[type], Any]:
    """The unit modules the live constructor (through ``cls``) chooses under ``strategy``,
    and the half-built model."""
    cls = cls or _wrapped_class(adapter)
    model = object.__new__(cls)
    config = _Off(data_parallel_sharding_strategy=strategy, bucket_size=None)
    with pytest.raises(adapter.Chosen) as chosen:
        cls.__init__(model, _Off(), config, None, device="cpu")
    return list(chosen.value.args[0]), model


def _layers() -> list[type]:
    from megatron.core.ssm.mamba_layer import MambaLayer
    from megatron.core.transformer.transformer_layer import (
        MoETransformerLayer,
        TransformerLayer,
    )

    return [TransformerLayer, MoETransformerLayer, MambaLayer]


def _overwrites(method: Any, strategy: str) -> Any:
    fsdp = _Off(
        data_parallel_sharding_strategy=strategy,
        all_gather_pipeline=SimpleNamespace(all_gather_params=lambda **kwargs: None),
        dist_index=SimpleNamespace(use_hybrid_fsdp=False),
        ddp_config=_Off(),
        microbatch_count=0,
    )
    parameter = SimpleNamespace()
    method(fsdp, [parameter], wait_bucket_ready=False)
    return getattr(parameter, "overwrite_main_grad", None)


def _gather_method(module_name: str) -> Any:
    import importlib
    import sys

    importlib.import_module(module_name)
    return vars(sys.modules[module_name].MegatronFSDP)["all_gather_and_wait_parameters_ready"]


# The reference: the pull request's rule, stated here.
def _units_expected(strategy: str, fixed: bool) -> list[type]:
    sharded = strategy != "no_shard" if fixed else strategy == "optim_grads_params"
    return _layers() if sharded else []


def _overwrite_expected(strategy: str, fixed: bool) -> Any:
    if strategy == "no_shard":
        return None  # nothing is gathered: the attribute is never set
    return strategy in ("optim_grads", "optim_grads_params") if fixed else True


# --- the entry's shape ---------------------------------------------------------------------


def test_megatron_core_part_has_every_half_megatron_fsdp_part_the_methods(parts):
    core, wheel = parts["megatron-core"], parts["megatron-fsdp"]
    methods = [
        "MegatronFSDP.all_gather_and_wait_parameters_ready",
        "MegatronFSDP._register_fsdp_hooks",
        "MegatronFSDP.synchronize_gradient_reduce",
    ]
    assert [t.attribute for t in core.targets] == ["FullyShardedDataParallel.__init__", *methods]
    assert [t.attribute for t in wheel.targets] == methods
    assert {t.modules for t in wheel.targets} == {(WHEEL,)}
    # The hooks are registered when a model is wrapped: construction-time, counted.
    hooks = [t for t in ENTRY.targets if t.name == "_register_fsdp_hooks"]
    assert [(type(t).__name__, t.called_from) for t in hooks] == [("Constructor", "__init__")] * 2


def test_upstream_toml_records_upstreams_name_of_the_class():
    upstream = read_upstream(ENTRY.vendored)
    names = upstream["upstream_names"]
    assert names == {"FullyShardedDataParallel.__init__": "FullyShardedDataParallelV1.__init__"}
    assert set(names) <= {t.attribute for t in ENTRY.targets}


# --- the sniff ------------------------------------------------------------------------------


@pytest.mark.parametrize("distribution", ["megatron-core", "megatron-fsdp"])
def test_sniff_says_needed_on_each_installed_copy(parts, distribution):
    part = parts[distribution]
    result = part.sniff([resolve_target(t, ID) for t in part.targets])
    assert result.fixed is False and "ZeRO-1" in result.summary
    assert ("ZeRO-2" in result.summary) is (distribution == "megatron-core")


@pytest.mark.parametrize("upstream_only", [True, False])
@pytest.mark.parametrize("distribution", ["megatron-core", "megatron-fsdp"])
def test_sniff_says_fixed_on_each_rebuilt_copy(parts, distribution, upstream_only):
    part = parts[distribution]
    targets = [resolve_target(t, ID) for t in part.targets]
    module = vendored_module(ENTRY.vendored)
    result = sniff_replacement(part, module, upstream_only=upstream_only, targets=targets)
    assert result.fixed is True, result.summary


@pytest.mark.parametrize("half", [0, 1])
def test_one_half_fixed_is_incompatible(parts, half):
    part = parts["megatron-core"]
    targets = [resolve_target(t, ID) for t in part.targets]
    module = vendored_module(ENTRY.vendored)
    rebuilt = [module.fully_sharded_data_parallel_init, module.all_gather_and_wait_parameters_ready]
    targets[half] = dataclasses.replace(targets[half], original=rebuilt[half])
    with pytest.raises(SniffFailed, match="only part of the fix"):
        part.sniff(targets)


# --- the real code on CPU: before apply, after apply, after revert --------------------------


def test_real_constructor_units_before_apply_after_and_after_revert(adapter):
    stock = vars(adapter.FullyShardedDataParallel)["__init__"]
    for strategy in STRATEGIES:
        assert _units(adapter, strategy)[0] == _units_expected(strategy, fixed=False), strategy
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        for strategy in STRATEGIES:
            assert _units(adapter, strategy)[0] == _units_expected(strategy, fixed=True)
    finally:
        revert(ID)
    assert vars(adapter.FullyShardedDataParallel)["__init__"] is stock
    assert _units(adapter, "optim_grads")[0] == []


@pytest.mark.parametrize("module_name", [CORE, WHEEL])
def test_real_overwrite_main_grad_before_apply_after_and_after_revert(module_name):
    stock = _gather_method(module_name)
    assert {s: _overwrites(stock, s) for s in STRATEGIES} == {
        s: _overwrite_expected(s, fixed=False) for s in STRATEGIES
    }
    report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        live = _gather_method(module_name)
        assert getattr(live, "__backport__", None) == ID
        assert {s: _overwrites(live, s) for s in STRATEGIES} == {
            s: _overwrite_expected(s, fixed=True) for s in STRATEGIES
        }
    finally:
        revert(ID)
    assert _gather_method(module_name) is stock


def test_status_and_apply_count_the_models_wrapped_before_it(adapter):
    """A model wrapped before the install keeps its units: the one warning and ``status``
    say how many there are."""
    gc.collect()  # models half-built by other tests are gone
    cls = _wrapped_class(adapter)
    wrapped = [_units(adapter, "optim_grads", cls)[1] for _ in range(2)]
    said = report_for(status(ID), ID)
    assert said.verdict is Verdict.NEEDED
    assert "2 FullyShardedDataParallel built before the install" in said.reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = report_for(apply(ID), ID)
    try:
        assert report.action is Action.INSTALLED, report.reason
        mine = [str(w.message) for w in caught if issubclass(w.category, BackportWarning)]
        assert [m for m in mine if ID in m and "2 FullyShardedDataParallel" in m], mine
        # One wrapped now chooses the fixed units; those wrapped before are left as they were.
        assert _units(adapter, "optim_grads", cls)[0] == _layers()
    finally:
        revert(ID)
    assert len(wrapped) == 2


# The contract kit runs for every entry in tests/catalog/test_contract.py (its reload check
# in the slow selection); what follows is specific to this fix.


# --- a renamed class (upstream's main calls it FullyShardedDataParallelV1) ------------------

_RENAMED_RELEASE = """
class FullyShardedDataParallelV1:
    def __init__(self, config, ddp_config, module, fsdp_unit_modules=None,
                 disable_bucketing=False, device=None, pg_collection=None):
        pass


def FullyShardedDataParallel(*args, **kwargs):
    return FullyShardedDataParallelV1(*args, **kwargs)
"""


def test_the_constructor_is_found_under_its_renamed_class(tmp_path, monkeypatch):
    """A made-up release laid out as upstream's main: ``FullyShardedDataParallel`` a
    function, the class renamed. The target is found on the renamed class, and only with
    ``owner_renamed``."""
    import importlib

    from backports.megatron.kinds.function import find_in

    (tmp_path / "renamed_fsdp_adapter.py").write_text(_RENAMED_RELEASE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("renamed_fsdp_adapter")
    try:
        target = ENTRY.targets[0]
        found = find_in(module, target, ID)
        assert found is not None and found.owner is module.FullyShardedDataParallelV1
        assert found.original is vars(module.FullyShardedDataParallelV1)["__init__"]
        assert find_in(module, dataclasses.replace(target, owner_renamed=()), ID) is None
    finally:
        monkeypatch.delitem(__import__("sys").modules, "renamed_fsdp_adapter")
