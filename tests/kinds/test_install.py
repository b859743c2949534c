"""The installer's scan for aliases and ``install_all``: every binding of every object in one
pass over ``sys.modules``, each backport installed all or none, on real megatron-core 0.19.2
functions."""

import dataclasses
import functools
import sys
import types

import pytest

from backports.megatron.catalog import MEGATRON_LM_7091, MEGATRON_LM_7617
from backports.megatron.kinds import _bindings
from backports.megatron.kinds import install as patcher
from tests.deciding import resolve_target
from tests.installing import install, request


class _Touchy:
    """A global whose ``==`` and ``hash`` must never run: the scan compares by identity."""

    def __eq__(self, other):
        raise AssertionError("__eq__ ran")

    def __hash__(self):
        raise AssertionError("__hash__ ran")


def _first():
    return 1


def _second():
    return 2


_MORE = [functools.partial(_second, n) for n in range(3)]  # five distinct with the two


_PARTIAL = functools.partial(_first)  # not a plain function: the general branch


@pytest.fixture
def holders(monkeypatch):
    """Two modules holding aliases under other names, beside a touchy global."""
    one, two = types.ModuleType("alias_holder_one"), types.ModuleType("alias_holder_two")
    one.first, one.partial, one.touchy = _first, _PARTIAL, _Touchy()
    two.renamed_first, two.second, two.again = _first, _second, _second
    two.more = _MORE[-1]
    for n, obj in enumerate(_MORE):
        setattr(one, f"more_{n}", obj)
    for module in (one, two):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return one, two


PLANTED = {
    id(_first): {("alias_holder_one", "first"), ("alias_holder_two", "renamed_first")},
    id(_second): {("alias_holder_two", "second"), ("alias_holder_two", "again")},
    id(_PARTIAL): {("alias_holder_one", "partial")},
    **{id(obj): {("alias_holder_one", f"more_{n}")} for n, obj in enumerate(_MORE)},
}
PLANTED[id(_MORE[-1])].add(("alias_holder_two", "more"))


@pytest.mark.parametrize(
    "objs",
    [
        (_first,),
        (_first, _second),
        (_first, _PARTIAL, _second),
        (_PARTIAL,),
        (_first, _second, _first),
        (_second, *_MORE, _first, _PARTIAL),
    ],
    ids=["one", "two", "three", "non-function", "repeated", "six: two passes"],
)
def test_one_scan_finds_every_binding_of_each_object(holders, objs):
    found = _bindings.bindings_of_each(objs)
    assert set(found) == {id(obj) for obj in objs}
    for obj in objs:
        sites = set(found[id(obj)])
        assert PLANTED[id(obj)] <= sites
        # Anything else it found must really hold the object (this test module does).
        assert all(vars(sys.modules[m])[a] is obj for m, a in sites), sites


def test_nothing_to_scan_for_reads_no_module(monkeypatch):
    monkeypatch.setattr(_bindings, "live_namespace", lambda m: pytest.fail("a module was read"))
    assert _bindings.bindings_of_each([]) == {}


def _replacement_of(target):
    """A plain function with the target's signature (the patcher does not check it)."""

    def replacement(*args, **kwargs):
        return "replaced"

    return replacement


def test_install_all_scans_once_and_installs_each_backport_or_none(
    tilelang_dsa, scans, monkeypatch
):
    holder = types.ModuleType("holds_both_targets")
    holder.mla = tilelang_dsa.fused_sparse_mla_absorbed
    holder.indexer = tilelang_dsa._can_use_fused_sparse_indexer_target
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    mla = resolve_target(MEGATRON_LM_7617.target, "test-a")
    indexer = resolve_target(MEGATRON_LM_7091.target, "test-b")
    # A third backport whose "original" is not what the module binds: refused alone.
    stale = dataclasses.replace(indexer, original=_first, held=_first)
    before = (holder.mla, holder.indexer)
    try:
        a, b = MEGATRON_LM_7617.target, MEGATRON_LM_7091.target
        outcomes = patcher.install_all(
            [
                request("test-a", [(a, mla, _replacement_of(mla))]),
                request("test-c", [(b, stale, _replacement_of(stale))]),
                request("test-b", [(b, indexer, _replacement_of(indexer))], {"m": 1}),
            ]
        )
        assert [type(o).__name__ for o in outcomes] == ["tuple", "LookupError", "tuple"]
        assert len(scans) == 1 and {id(o) for o in scans[0]} >= {id(before[0]), id(before[1])}
        assert holder.mla.__backport__ == "test-a" and holder.mla.__wrapped__ is before[0]
        assert holder.indexer.__backport__ == "test-b" and holder.indexer.m == 1
        assert tilelang_dsa.fused_sparse_mla_absorbed is holder.mla
        assert patcher.installed("test-c") is None
        again = patcher.install_all([request("test-a", [(a, mla, _first)])])
        assert again == [(patcher.installed("test-a"), False)]  # already installed
    finally:
        for backport_id in ("test-a", "test-b", "test-c"):
            patcher.uninstall(backport_id)
    assert (holder.mla, holder.indexer) == before
    assert tilelang_dsa.fused_sparse_mla_absorbed is before[0]


def test_a_failed_scan_fails_each_request_and_rebinds_nothing(tilelang_dsa, monkeypatch):
    def broken(objs):
        raise RuntimeError("scan failed")

    monkeypatch.setattr(patcher, "bindings_of_each", broken)
    mla = resolve_target(MEGATRON_LM_7617.target, "test-a")
    indexer = resolve_target(MEGATRON_LM_7091.target, "test-b")
    before = (
        tilelang_dsa.fused_sparse_mla_absorbed,
        tilelang_dsa._can_use_fused_sparse_indexer_target,
    )
    a, b = MEGATRON_LM_7617.target, MEGATRON_LM_7091.target
    outcomes = patcher.install_all(
        [
            request("test-a", [(a, mla, _replacement_of(mla))]),
            request("test-b", [(b, indexer, _replacement_of(indexer))]),
        ]
    )
    assert [str(outcome) for outcome in outcomes] == ["scan failed", "scan failed"]
    assert (
        tilelang_dsa.fused_sparse_mla_absorbed,
        tilelang_dsa._can_use_fused_sparse_indexer_target,
    ) == before
    assert patcher.installed("test-a") is None and patcher.installed("test-b") is None


def test_the_users_own_names_in_main_are_left_alone(tilelang_dsa, monkeypatch):
    """A script's ``from ... import fused_sparse_mla_absorbed`` keeps the original, so that
    it can compare the backport with it; every module of a library is rebound."""
    from backports.megatron import apply, revert

    original = tilelang_dsa.fused_sparse_mla_absorbed
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "fused_sparse_mla_absorbed", original, raising=False)
    library = types.ModuleType("acme_library_holding_the_target")
    library.fused_sparse_mla_absorbed = original
    monkeypatch.setitem(sys.modules, library.__name__, library)
    apply("megatron-lm-7617")
    try:
        assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == "megatron-lm-7617"
        assert library.fused_sparse_mla_absorbed is tilelang_dsa.fused_sparse_mla_absorbed
        assert main.fused_sparse_mla_absorbed is original
    finally:
        revert("megatron-lm-7617")
    assert library.fused_sparse_mla_absorbed is original


def test_a_target_defined_in_main_is_patched_there(monkeypatch):
    """``__main__`` is the defining module: its own binding is the target's."""
    main = types.ModuleType("__main__")
    exec("def double(x):\n    return 2 * x\n", vars(main))
    monkeypatch.setitem(sys.modules, "__main__", main)
    target = dataclasses.replace(
        MEGATRON_LM_7617.target, modules=("__main__",), attribute="double", parameters=("x",)
    )
    resolved = resolve_target(target, "acme-main")
    install("acme-main", [(target, resolved, lambda x: 3 * x)])
    try:
        assert main.double(2) == 6
    finally:
        patcher.uninstall("acme-main")
    assert main.double(2) == 4
