"""apply / revert / applied on real megatron-core 0.19.2: install, skip, warn once, undo."""

import contextlib
import logging
import os
import subprocess
import sys
import threading
import types
import warnings

import pytest

from backports.megatron import (
    Action,
    BackportError,
    BackportWarning,
    Verdict,
    api,
    applied,
    apply,
    revert,
    status,
)
from backports.megatron.catalog import CATALOG
from backports.megatron.decision import early as probe_module
from backports.megatron.job import deferred
from backports.megatron.kinds import install
from backports.megatron.model import WITH_LOCAL_CHANGES
from tests import standins
from tests.conftest import BACKPORT_ID, TILELANG_DSA
from tests.reports import report_for


def test_apply_installs_with_markers_and_logs(tilelang_dsa, caplog):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    with caplog.at_level(logging.INFO, logger="backports.megatron"):
        report = report_for(apply(), BACKPORT_ID)
    assert report.id == BACKPORT_ID
    assert report.verdict is Verdict.NEEDED and report.action is Action.INSTALLED
    installed = tilelang_dsa.fused_sparse_mla_absorbed
    assert installed is not original
    assert installed.__backport__ == BACKPORT_ID
    assert installed.__wrapped__ is original
    assert any("installed megatron-lm-7617" in r.getMessage() for r in caplog.records)


def test_apply_is_idempotent(tilelang_dsa):
    apply()
    installed = tilelang_dsa.fused_sparse_mla_absorbed
    again = report_for(apply(), BACKPORT_ID)
    assert again.action is Action.ALREADY_INSTALLED
    assert tilelang_dsa.fused_sparse_mla_absorbed is installed


def test_revert_restores_the_very_same_object(tilelang_dsa):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    apply()
    report = report_for(revert(), BACKPORT_ID)
    assert report.action is Action.REVERTED
    assert tilelang_dsa.fused_sparse_mla_absorbed is original
    again = report_for(revert(), BACKPORT_ID)
    assert again.action is Action.NOT_INSTALLED


def test_every_alias_is_rebound_and_restored(tilelang_dsa, monkeypatch):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    user = types.ModuleType("user_training_script")
    user.sparse_attention = original  # `from ...tilelang_dsa import ... as sparse_attention`
    monkeypatch.setitem(sys.modules, user.__name__, user)
    apply()
    assert user.sparse_attention is tilelang_dsa.fused_sparse_mla_absorbed
    assert user.sparse_attention.__backport__ == BACKPORT_ID
    revert()
    assert user.sparse_attention is original


def test_an_alias_taken_after_apply_is_restored_by_revert(tilelang_dsa, monkeypatch):
    """A module imported after apply() holds our function: revert puts the original there."""
    original = tilelang_dsa.fused_sparse_mla_absorbed
    apply()
    late = types.ModuleType("user_module_imported_after_apply")
    late.sparse_attention = tilelang_dsa.fused_sparse_mla_absorbed
    monkeypatch.setitem(sys.modules, late.__name__, late)
    revert()
    assert late.sparse_attention is original
    assert tilelang_dsa.fused_sparse_mla_absorbed is original


def test_revert_of_every_backport_scans_the_modules_once(tilelang_dsa, monkeypatch):
    """One scan for the late aliases of every part (16 backports: 33 parts), and a late
    alias of each backport is still put back."""
    from backports.megatron.kinds import _bindings

    original = tilelang_dsa.fused_sparse_mla_absorbed
    reports = apply()
    installed_ids = [r.id for r in reports if r.action is Action.INSTALLED]
    assert len(installed_ids) > 5
    late = types.ModuleType("user_module_imported_after_apply_of_all")
    late.sparse_attention = tilelang_dsa.fused_sparse_mla_absorbed
    monkeypatch.setitem(sys.modules, late.__name__, late)
    modules_read = []
    real = _bindings.live_namespace
    monkeypatch.setattr(_bindings, "live_namespace", lambda m: modules_read.append(m) or real(m))
    reverted = [r.id for r in revert() if r.action is Action.REVERTED]
    assert set(installed_ids) <= set(reverted)  # and the deferred ones: their hooks dropped
    assert late.sparse_attention is original
    # One pass over sys.modules (plus the few sites each restore reads back).
    assert len(modules_read) < 2 * len(sys.modules), len(modules_read)


def test_revert_names_every_site_it_restored(tilelang_dsa, monkeypatch):
    user = types.ModuleType("user_script_with_an_alias")
    user.sparse_attention = tilelang_dsa.fused_sparse_mla_absorbed
    monkeypatch.setitem(sys.modules, user.__name__, user)
    apply()
    (report,) = [r for r in revert() if r.id == BACKPORT_ID]
    assert report.action is Action.REVERTED
    assert f"{TILELANG_DSA}.fused_sparse_mla_absorbed" in report.reason
    assert "user_script_with_an_alias.sparse_attention" in report.reason


def test_concurrent_apply_installs_once(tilelang_dsa):
    results, barrier = [], threading.Barrier(8)
    status()  # imports every entry's target modules: apply installs rather than defers

    def worker():
        barrier.wait()
        results.extend(apply())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {r.id for r in results} == {spec.id for spec in CATALOG}
    for backport_id in {r.id for r in results}:
        actions = sorted(str(r.action) for r in results if r.id == backport_id)
        assert actions == ["already-installed"] * 7 + ["installed"], backport_id


def test_one_warning_per_verdict_over_repeated_apply(tilelang_dsa, monkeypatch):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            report = report_for(apply(BACKPORT_ID), BACKPORT_ID)  # alone: a swap, no proof
            assert report.verdict is Verdict.UPSTREAM and report.action is Action.SKIPPED
    backport_warnings = [w for w in caught if issubclass(w.category, BackportWarning)]
    assert len(backport_warnings) == 1
    assert "delete" in str(backport_warnings[0].message).lower()
    assert tilelang_dsa.fused_sparse_mla_absorbed is standins.fixed_upstream


def test_no_warning_on_other_ranks(tilelang_dsa, monkeypatch, caplog):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    monkeypatch.setenv("RANK", "3")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG):
        warnings.simplefilter("always")
        apply()
    assert not [w for w in caught if issubclass(w.category, BackportWarning)]
    assert any("not applied (upstream)" in r.getMessage() for r in caplog.records)


def test_a_warning_is_recorded_for_child_processes(tilelang_dsa, monkeypatch):
    monkeypatch.delenv("MEGATRON_BACKPORTS_SAID", raising=False)
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    with pytest.warns(BackportWarning, match="not applied"):
        apply()
    # What a spawned child inherits: the key of the warning its parent gave.
    (key,) = os.environ["MEGATRON_BACKPORTS_SAID"].split(",")
    assert key.startswith(f"{BACKPORT_ID}:upstream:")
    revert()  # a new decision in this process may warn again
    assert "MEGATRON_BACKPORTS_SAID" not in os.environ


def test_child_of_a_process_that_warned_stays_quiet(tilelang_dsa, monkeypatch, caplog):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    with pytest.warns(BackportWarning):
        apply(BACKPORT_ID)
    said = os.environ["MEGATRON_BACKPORTS_SAID"]
    revert()
    monkeypatch.setenv("MEGATRON_BACKPORTS_SAID", f"other:absent,{said}")  # the parent said it
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG):
        warnings.simplefilter("always")
        (report,) = apply(BACKPORT_ID)
    assert report.verdict is Verdict.UPSTREAM and report.action is Action.SKIPPED
    assert not [w for w in caught if issubclass(w.category, BackportWarning)]
    assert any("not applied (upstream)" in r.getMessage() for r in caplog.records)


def test_a_parent_warning_about_another_verdict_does_not_silence_this_one(
    tilelang_dsa, monkeypatch
):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    monkeypatch.setenv("MEGATRON_BACKPORTS_SAID", f"{BACKPORT_ID}:upstream")
    with pytest.warns(BackportWarning, match="incompatible"):
        apply()
    said = os.environ["MEGATRON_BACKPORTS_SAID"].split(",")
    assert said[0] == f"{BACKPORT_ID}:upstream"
    assert len(said) == 2 and said[1].startswith(f"{BACKPORT_ID}:incompatible:")


def test_a_warning_the_filter_drops_is_not_recorded_as_said(tilelang_dsa, monkeypatch):
    """A parent whose filter hides the warning must leave its children free to show it."""
    monkeypatch.delenv("MEGATRON_BACKPORTS_SAID", raising=False)
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", BackportWarning)
        apply(BACKPORT_ID)
    assert not caught
    assert "MEGATRON_BACKPORTS_SAID" not in os.environ
    revert()
    with pytest.warns(BackportWarning, match="not applied"):  # shown: now recorded
        apply(BACKPORT_ID)
    assert os.environ["MEGATRON_BACKPORTS_SAID"].startswith(f"{BACKPORT_ID}:upstream:")


def test_a_parent_warning_with_another_reason_does_not_silence_this_one(tilelang_dsa, monkeypatch):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    with pytest.warns(BackportWarning):
        apply(BACKPORT_ID)
    said = os.environ["MEGATRON_BACKPORTS_SAID"]
    revert()
    monkeypatch.setenv("MEGATRON_BACKPORTS_SAID", said)  # a child of the process that warned
    real = api.decide

    def other_reason(spec, *args, **kwargs):
        result = real(spec, *args, **kwargs)
        result.reason += " (and a newer sniff says more)"
        return result

    monkeypatch.setattr(api, "decide", other_reason)
    with pytest.warns(BackportWarning, match="a newer sniff says more"):
        apply(BACKPORT_ID)


def test_strict_raises_on_incompatible(tilelang_dsa, monkeypatch):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    with pytest.raises(BackportError, match="incompatible"), pytest.warns(BackportWarning):
        apply(strict=True)
    assert tilelang_dsa.fused_sparse_mla_absorbed is standins.new_signature


def test_incompatible_is_skipped_with_a_warning(tilelang_dsa, monkeypatch):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    with pytest.warns(BackportWarning, match="incompatible"):
        report = report_for(apply(BACKPORT_ID), BACKPORT_ID)  # alone: a swap, no proof
    assert report.action is Action.SKIPPED
    assert tilelang_dsa.fused_sparse_mla_absorbed is standins.new_signature


def test_drifted_vendored_file_is_never_installed(tilelang_dsa, monkeypatch):
    real = probe_module.read_upstream
    monkeypatch.setattr(probe_module, "read_upstream", lambda ref: {**real(ref), "sha256": "0"})
    original = tilelang_dsa.fused_sparse_mla_absorbed
    with pytest.warns(BackportWarning, match="sha256"):
        report = report_for(apply(BACKPORT_ID), BACKPORT_ID)  # alone: a swap, no proof
    assert report.verdict is Verdict.INCOMPATIBLE
    assert tilelang_dsa.fused_sparse_mla_absorbed is original
    with pytest.raises(BackportError):
        apply(strict=True)


@pytest.mark.parametrize(
    "env", [{"MEGATRON_BACKPORTS": "0"}, {"MEGATRON_BACKPORTS_SKIP": f"other, {BACKPORT_ID}"}]
)
def test_disabled_by_environment(tilelang_dsa, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    original = tilelang_dsa.fused_sparse_mla_absorbed
    report = report_for(apply(), BACKPORT_ID)
    assert report.verdict is Verdict.DISABLED and report.action is Action.SKIPPED
    assert tilelang_dsa.fused_sparse_mla_absorbed is original


def test_unknown_id_is_an_error():
    with pytest.raises(BackportError, match="unknown backport 'nope'"):
        apply(only="nope")


def test_only_selects_by_id(tilelang_dsa):
    report = report_for(apply(only=[BACKPORT_ID]), BACKPORT_ID)
    assert report.action is Action.INSTALLED


def test_applied_context_reverts_on_exit(tilelang_dsa):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    with applied() as reports:
        assert report_for(reports, BACKPORT_ID).action is Action.INSTALLED
        assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == BACKPORT_ID
    assert tilelang_dsa.fused_sparse_mla_absorbed is original


def test_applied_context_leaves_an_earlier_install_alone(tilelang_dsa):
    apply()
    installed = tilelang_dsa.fused_sparse_mla_absorbed
    with applied():
        pass
    assert tilelang_dsa.fused_sparse_mla_absorbed is installed


LAZY = f"""
import sys
import backports.megatron as bm
report = next(r for r in bm.apply() if r.id == "{BACKPORT_ID}")
assert report.action == "deferred", report
assert not any(m == "megatron" or m.startswith("megatron.") for m in sys.modules), "imported"
assert "torch" not in sys.modules
from backports.megatron.kinds import install as patcher
scans, scan = [], patcher.bindings_of_each
patcher.bindings_of_each = lambda objs: scans.append([o.__name__ for o in objs]) or scan(objs)
import {TILELANG_DSA} as m
assert m.fused_sparse_mla_absorbed.__backport__ == "{BACKPORT_ID}"
assert m._can_use_fused_sparse_indexer_target.__backport__ == "megatron-lm-7091"
both = ["fused_sparse_mla_absorbed", "_can_use_fused_sparse_indexer_target"]
assert [names for names in scans if set(names) & set(both)] == [both], scans
from megatron.core.transformer.experimental_attention_variant import dsa_tilelang_kernels
again = next(r for r in bm.apply() if r.id == "{BACKPORT_ID}")
assert again.action == "already-installed", again
assert again.verdict == "needed" and "declined" in again.reason, again
bm.revert()
assert not hasattr(m.fused_sparse_mla_absorbed, "__backport__")
print("lazy ok")
"""


@pytest.mark.slow
def test_apply_before_import_patches_on_first_import():
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "lazy ok" in done.stdout


def test_backports_waiting_for_one_module_install_together(tilelang_dsa, scans):
    """At the import of a module two deferred backports wait for (#7617 and #7091 both
    patch tilelang_dsa), one callback probes both and installs them with one scan for
    aliases: a scan reads every global of every module (~5 ms each with torch loaded)."""
    from backports.megatron import api
    from backports.megatron.catalog import MEGATRON_LM_7091, MEGATRON_LM_7617
    from backports.megatron.interpreter import import_hooks as post_import

    originals = (
        tilelang_dsa.fused_sparse_mla_absorbed,
        tilelang_dsa._can_use_fused_sparse_indexer_target,
    )
    for spec in (MEGATRON_LM_7091, MEGATRON_LM_7617):  # watched out of catalog order
        deferred.watch(deferred.Watch(spec, False, WITH_LOCAL_CHANGES, None))
    with caught_warnings() as said:
        post_import._notify(tilelang_dsa)  # what the import of the module runs
    assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == MEGATRON_LM_7617.id
    assert tilelang_dsa._can_use_fused_sparse_indexer_target.__backport__ == MEGATRON_LM_7091.id
    assert [{id(o) for o in objs} for objs in scans] == [{id(o) for o in originals}]
    reports = [api.last_report(s.id) for s in (MEGATRON_LM_7617, MEGATRON_LM_7091)]
    assert [r.action for r in reports] == [Action.INSTALLED, Action.INSTALLED]
    assert said == []
    revert()
    assert (
        tilelang_dsa.fused_sparse_mla_absorbed,
        tilelang_dsa._can_use_fused_sparse_indexer_target,
    ) == originals
    assert not post_import.registered(f"backports.megatron:{MEGATRON_LM_7617.id}")


def test_a_strict_incompatible_backport_fails_the_import_and_installs_nothing(
    tilelang_dsa, monkeypatch
):
    """importlib drops a module whose import fails: nothing may be patched into it."""
    from backports.megatron import api
    from backports.megatron.catalog import MEGATRON_LM_7091, MEGATRON_LM_7617
    from backports.megatron.interpreter import import_hooks as post_import

    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    indexer = tilelang_dsa._can_use_fused_sparse_indexer_target
    deferred.watch(deferred.Watch(MEGATRON_LM_7617, True, WITH_LOCAL_CHANGES, None))
    deferred.watch(deferred.Watch(MEGATRON_LM_7091, False, WITH_LOCAL_CHANGES, None))
    refused = f"{MEGATRON_LM_7617.id} is incompatible"
    with (
        pytest.raises(BackportError, match=refused) as failed,
        pytest.warns(BackportWarning, match="incompatible"),
    ):
        post_import._notify(tilelang_dsa)
    assert getattr(failed.value, "fatal_on_import", False)  # post_import lets it fail the import
    assert tilelang_dsa.fused_sparse_mla_absorbed is standins.new_signature
    assert tilelang_dsa._can_use_fused_sparse_indexer_target is indexer
    assert api.last_report(MEGATRON_LM_7617.id).verdict is Verdict.INCOMPATIBLE


def test_apply_after_the_import_scans_for_aliases_once(tilelang_dsa, scans):
    installed = [r.id for r in apply() if r.action is Action.INSTALLED]
    assert {"megatron-lm-7617", "megatron-lm-7091"} <= set(installed)
    assert len(scans) == 1 and len(scans[0]) >= 2


def _drifted(backport_id):
    """read_upstream, with a wrong sha256 for one backport: its vendored file 'drifted'."""
    real = probe_module.read_upstream

    def read(ref):
        upstream = real(ref)
        return {**upstream, "sha256": "0"} if ref.package.endswith(backport_id) else upstream

    return read


def test_warnings_name_the_caller_in_catalog_order(tilelang_dsa, monkeypatch):
    """#7617 is refused after its probe (loaded target), #7091 before it (drifted file):
    both warnings point at apply()'s caller, in catalog order."""
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    monkeypatch.setattr(probe_module, "read_upstream", _drifted("megatron_lm_7091"))
    with caught_warnings() as said:
        apply()
    assert [(w.filename, str(w.message).split()[1]) for w in said] == [
        (__file__, "megatron-lm-7617"),
        (__file__, "megatron-lm-7091"),
    ]


def test_a_warning_raised_as_an_error_leaves_every_outcome_recorded(tilelang_dsa, monkeypatch):
    """Under -W error the first BackportWarning raises out of apply(): every backport was
    decided, installed and recorded before it, and the installed ones are watched."""
    from backports.megatron import api
    from backports.megatron.interpreter import import_hooks as post_import

    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackportWarning)
        with pytest.raises(BackportWarning, match="megatron-lm-7617"):
            apply()
    assert api.last_report("megatron-lm-7617").verdict is Verdict.INCOMPATIBLE
    assert api.last_report("megatron-lm-7091").action is Action.INSTALLED
    assert install.installed("megatron-lm-7091") is not None
    assert post_import.registered("backports.megatron:megatron-lm-7091")


@contextlib.contextmanager
def caught_warnings():
    """The BackportWarnings given inside the block, whatever the filters say."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said: list[warnings.WarningMessage] = []
        yield said
        said.extend(w for w in caught if issubclass(w.category, BackportWarning))


def test_warnings_at_an_import_come_in_catalog_order(tilelang_dsa, monkeypatch):
    from backports.megatron.catalog import MEGATRON_LM_7091, MEGATRON_LM_7617
    from backports.megatron.interpreter import import_hooks as post_import

    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    monkeypatch.setattr(probe_module, "read_upstream", _drifted("megatron_lm_7091"))
    for spec in (MEGATRON_LM_7091, MEGATRON_LM_7617):  # watched out of catalog order
        deferred.watch(deferred.Watch(spec, False, WITH_LOCAL_CHANGES, None))
    with caught_warnings() as said:
        post_import._notify(tilelang_dsa)
    assert [str(w.message).split()[1] for w in said] == ["megatron-lm-7617", "megatron-lm-7091"]
