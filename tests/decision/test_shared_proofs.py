"""tests/conftest.py's proof store for the session: a proof one test stored answers another
test only where that test changed nothing the proof depends on (issue 43, item 2).

#6682's sniff runs in this process (milliseconds): its module-level helper ``_sniff_method``
is what a test would swap in memory; the store's key covers files and the target's code,
never that helper.
"""

import dataclasses

import pytest

from backports.megatron import Verdict, catalog, decision, status
from backports.megatron.catalog import megatron_lm_6682, megatron_lm_6964
from backports.megatron.model import SniffResult
from tests import standins
from tests.deciding import probe

ID = "megatron-lm-6682"
IN_CHILD = "megatron-lm-6964"  # its sniff imports megatron in child interpreters


def _fixed(*_: object) -> SniffResult:
    return SniffResult(True, "swapped in memory: fixed")


def _said_fixed(decided) -> bool:  # type: ignore[no-untyped-def]
    """The swapped sniff's answer reached the verdict: fixed by the sniff alone, with the
    installed text not the fix's, is "drifted" (the upstream rule), never the stored NEEDED."""
    return decided.verdict is Verdict.INCOMPATIBLE and "drifted" in decided.reason


def _status():  # type: ignore[no-untyped-def]
    (report,) = status(ID)
    return report


def test_a_test_that_changed_nothing_is_served_from_the_session_store() -> None:
    first = _status()  # proved here, or served: an earlier test proved it
    again = _status()
    assert first.verdict is Verdict.NEEDED and again.verdict is Verdict.NEEDED
    assert again.evidence["cache"]["hit"] is True


def test_a_helper_swapped_through_monkeypatch_is_probed_not_served() -> None:
    assert _status().verdict is Verdict.NEEDED  # the real proof is in the store now
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(megatron_lm_6682, "_sniff_method", _fixed)
        swapped = _status()
    assert _said_fixed(swapped) and "cache" not in swapped.evidence
    assert _status().evidence["cache"]["hit"] is True  # the swap undone: served again


def test_an_entry_built_with_another_sniff_is_probed_not_served() -> None:
    assert _status().verdict is Verdict.NEEDED
    built = dataclasses.replace(catalog.by_id(ID), sniff=_fixed)
    decided = probe(built)
    assert _said_fixed(decided) and "cache" not in decided.evidence


def test_a_made_up_id_is_never_stored_or_served() -> None:
    made_up = dataclasses.replace(catalog.by_id(ID), id="acme-made-up", sniff=_fixed)
    for _ in range(2):
        decided = probe(made_up)
        assert _said_fixed(decided) and "cache" not in decided.evidence


def test_a_swap_in_megatron_keeps_a_child_sniffs_proof_but_not_a_swap_of_ours(
    tilelang_dsa: object,
) -> None:
    """A child imports megatron afresh: what this process swapped in megatron's modules
    never reaches it, so the proof of a sniff run in children still serves; a swap of this
    package's code (what runs the children) does not. Keys only: no sniff runs here."""
    in_child, in_process = catalog.by_id(IN_CHILD), catalog.by_id(ID)
    _status()  # imports #6682's target module: its key can be computed
    assert decision.cache_key(in_child) is not None
    assert decision.cache_key(in_process) is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.fixed_upstream)
        assert decision.cache_key(in_child) is not None
        assert decision.cache_key(in_process) is None  # sniffed here: it could see it
        patch.setattr(megatron_lm_6964, "import_in_child", lambda *args: {})
        assert decision.cache_key(in_child) is None


@pytest.mark.private_proofs
def test_a_private_proofs_test_has_the_store_off() -> None:
    for _ in range(2):
        assert "cache" not in _status().evidence
