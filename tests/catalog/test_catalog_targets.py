"""Catalog targets beyond one plain function: a decorated class method, several targets
installed together (all or none), on real megatron-core 0.19.2 objects."""

import dataclasses
import inspect

import pytest

from backports.megatron import status
from backports.megatron.catalog import CATALOG, Target
from backports.megatron.kinds import install as patcher
from backports.megatron.kinds import kind_of
from tests.conftest import TILELANG_DSA
from tests.deciding import resolve_target
from tests.installing import install

ROUTER = "megatron.core.transformer.moe.router"
METHOD = Target(
    distribution="megatron-core",
    modules=(ROUTER,),
    attribute="TopKRouter._apply_expert_bias",
    parameters=("self", "routing_map", "padding_mask"),
    decorator="megatron.core.jit:jit_fuser",
)
FUNCTION = Target(
    distribution="megatron-core",
    modules=(TILELANG_DSA,),
    attribute="_can_use_fused_sparse_indexer_target",
    parameters=("query", "key", "topk_indices"),
)
ID = "test-catalog-targets"


def _apply_expert_bias(self, routing_map, padding_mask):
    """A stand-in body: records that it ran."""
    return ("vendored", routing_map, padding_mask)


def _declines_everything(query, key, topk_indices):
    return False


@pytest.fixture
def router_class():
    from megatron.core.transformer.moe.router import TopKRouter

    return TopKRouter


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    patcher.uninstall(ID)


def test_a_compiled_method_resolves_to_its_class_and_body(router_class):
    resolved = resolve_target(METHOD, ID)
    exact = vars(router_class)["_apply_expert_bias"]
    assert resolved.owner is router_class and resolved.is_method
    assert resolved.original is exact  # torch.compile's wrapper, as the class holds it
    assert resolved.decorated and resolved.foreign is None
    assert resolved.body is exact._torchdynamo_orig_callable
    assert tuple(inspect.signature(resolved.body).parameters) == METHOD.parameters


def test_a_compiled_method_without_a_declared_decorator_is_refused():
    resolved = resolve_target(dataclasses.replace(METHOD, decorator=None), ID)
    assert resolved.foreign is not None and "declares no decorator" in resolved.foreign


def test_a_decorated_method_is_a_marked_shim_and_revert_puts_back_the_same_object(
    router_class,
):
    from megatron.core.transformer.moe.router import InferenceTopKRouter

    exact = vars(router_class)["_apply_expert_bias"]
    resolved = resolve_target(METHOD, ID)
    install(ID, [(METHOD, resolved, _apply_expert_bias)])
    shim = vars(router_class)["_apply_expert_bias"]
    assert shim.__backport__ == ID and shim.__wrapped__ is exact
    # A plain function, not the compile wrapper: torch.compile's own __wrapped__ untouched.
    assert not hasattr(shim, "_torchdynamo_orig_callable")
    body = shim.__backport_body__
    assert body._torchdynamo_orig_callable.__code__ is _apply_expert_bias.__code__
    assert not hasattr(_apply_expert_bias, "__backport__")  # the vendored function unmarked
    assert InferenceTopKRouter._apply_expert_bias is shim  # inherited, never set there
    assert "_apply_expert_bias" not in vars(InferenceTopKRouter)
    patcher.uninstall(ID)
    assert vars(router_class)["_apply_expert_bias"] is exact


def test_several_targets_install_and_revert_together(router_class, tilelang_dsa):
    method, function = (
        vars(router_class)["_apply_expert_bias"],
        tilelang_dsa.__dict__[FUNCTION.attribute],
    )
    installation, fresh = install(
        ID,
        [
            (METHOD, resolve_target(METHOD, ID), _apply_expert_bias),
            (FUNCTION, resolve_target(FUNCTION, ID), _declines_everything),
        ],
    )
    assert fresh and len(installation.parts) == 2
    assert vars(router_class)["_apply_expert_bias"].__backport__ == ID
    assert getattr(tilelang_dsa, FUNCTION.attribute).__backport__ == ID
    assert patcher.installed(ID) is installation
    patcher.uninstall(ID)
    assert vars(router_class)["_apply_expert_bias"] is method
    assert getattr(tilelang_dsa, FUNCTION.attribute) is function


def test_a_failing_target_leaves_every_other_target_as_it_was(router_class, tilelang_dsa):
    method = vars(router_class)["_apply_expert_bias"]
    function = getattr(tilelang_dsa, FUNCTION.attribute)
    # The second target's "original" is not what its module binds: it must be refused,
    # and the first target, already set, put back.
    stale = dataclasses.replace(
        resolve_target(FUNCTION, ID), original=_declines_everything, held=_declines_everything
    )
    with pytest.raises(LookupError, match="not the original"):
        install(
            ID,
            [
                (METHOD, resolve_target(METHOD, ID), _apply_expert_bias),
                (FUNCTION, stale, _declines_everything),
            ],
        )
    assert vars(router_class)["_apply_expert_bias"] is method
    assert getattr(tilelang_dsa, FUNCTION.attribute) is function
    assert patcher.installed(ID) is None


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_every_entry_names_its_replacements_in_its_vendored_module(spec):
    import importlib

    module = importlib.import_module(f"{spec.vendored.package}.{spec.vendored.module}")
    assert spec.vendored.attribute == spec.target.replacement_name
    for target in spec.targets:
        # What the target's kind takes from the module (a function must be callable; a
        # module attribute, a Triton kernel say, need not be).
        assert kind_of(target).replacement(target, module) is not None, target
        assert target.distribution, target


def test_status_lists_every_entry_once_in_catalog_order(tilelang_dsa):
    # Each entry's apply/revert, sniff and hashes: tests/catalog/test_contract.py (the kit).
    assert [report.id for report in status()] == [spec.id for spec in CATALOG]
