"""Every builtin entry passes the contract kit (``backports.megatron.testing``), the one a
plugin's generated tests run too. Per-backport test files hold what is specific to a fix."""

import pytest

from backports.megatron.catalog import CATALOG
from backports.megatron.testing import CONTRACT
from backports.megatron.testing.contract import reload_is_patched_again

FAST = [check for check in CONTRACT if check is not reload_is_patched_again]
# The checks that never run a sniff: fast for every entry, also one whose sniff starts two
# ranks in child interpreters on demand (#7466: tens of seconds).
_SNIFFLESS = {"status_lists_it_once", "strict_refuses_a_target_unlike_any_version"}
_SNIFFLESS |= {"vendored_code_matches_its_hashes"}


def _cases() -> list[object]:
    return [
        pytest.param(
            spec,
            check,
            id=f"{spec.id}-{check.__name__}",
            marks=pytest.mark.slow
            if spec.sniff_on_demand and check.__name__ not in _SNIFFLESS
            else (),
        )
        for spec in CATALOG
        for check in FAST
    ]


@pytest.mark.parametrize(("spec", "check"), _cases())
def test_every_entry_passes_the_contract(spec, check):
    check(spec)


@pytest.mark.slow  # a fresh interpreter imports megatron-core
@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_every_entry_is_patched_again_after_a_reload(spec):
    reload_is_patched_again(spec)


def test_the_contract_fails_an_entry_that_breaks_it(tilelang_dsa, monkeypatch):
    """The kit can fail: a sniff that always says fixed, one that never does, and a
    vendored replacement that is not the fix."""
    import dataclasses

    from backports.megatron.catalog import MEGATRON_LM_7091
    from backports.megatron.model import SniffResult
    from backports.megatron.testing import contract

    always_fixed = dataclasses.replace(MEGATRON_LM_7091, sniff=lambda t: SniffResult(True, "x"))
    with pytest.raises(AssertionError, match="says fixed"):
        contract.sniff_says_needed_on_the_installed_code(always_fixed)
    never_fixed = dataclasses.replace(MEGATRON_LM_7091, sniff=lambda t: SniffResult(False, "x"))
    with pytest.raises(AssertionError, match="says needed"):
        contract.sniff_says_fixed_on_the_vendored_code(never_fixed)
    # A vendored module that holds 0.19.2's predicate, not #7091's fix.
    stock = type(tilelang_dsa)("stock_predicate")
    stock._can_use_fused_sparse_indexer_target = tilelang_dsa._can_use_fused_sparse_indexer_target
    monkeypatch.setattr(contract, "vendored_module", lambda ref: stock)
    with pytest.raises(AssertionError, match="megatron-lm-7091: upstream-only, the sniff"):
        contract.sniff_says_fixed_on_the_vendored_code_upstream_only(MEGATRON_LM_7091)
