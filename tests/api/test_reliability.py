"""Reliability of the machinery around the vendored code (issue 12, items 1-4 and 9).

Each test reproduces what a hostile tester did on megatron-core 0.19.2 and failed before:
a probe racing a training thread, a reload behind the patcher's back, a third party's patch
already in place, odd entries in ``sys.modules``, overlapping ``applied()`` blocks.
"""

import functools
import importlib
import subprocess
import sys
import textwrap
import threading
import types
from types import ModuleType

import pytest
import torch

from backports.megatron import Action, Verdict, applied, apply, catalog, manifest, status
from backports.megatron.job.ranks import installed_backports
from backports.megatron.testing.fake_kernel import FakeSparseMLA
from tests.conftest import BACKPORT_ID, TILELANG_DSA
from tests.reports import report_for


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(3, 1, 16, 512, generator=gen).to(torch.bfloat16)
    key = torch.randn(5, 1, 1, 512, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, 5, (1, 3, 65), generator=gen)
    return query, key, indices


# ---- 1. the probe never swaps live globals ------------------------------------------------


class _QuietKernel(FakeSparseMLA):
    """The fake kernel without the per-call record (the loop makes thousands of calls)."""

    def apply(self, q, kv, indices, scale):
        result = super().apply(q, kv, indices, scale)
        self.calls.clear()
        return result


# The backports whose sniffs stand a recorder in for the attention's kernel: the probes a
# training thread calling that attention could meet (the others never touch its module).
_ON_THE_ATTENTION = tuple(
    spec.id for spec in catalog.CATALOG if any(TILELANG_DSA in t.modules for t in spec.targets)
)


def test_status_while_a_training_thread_calls_the_attention(
    tilelang_dsa: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tilelang_dsa, "SparseMLA", _QuietKernel())
    report = report_for(apply(), BACKPORT_ID)
    assert report.action is Action.INSTALLED
    query, key, indices = _inputs(1)
    reference = tilelang_dsa.fused_sparse_mla_absorbed(query, key, indices, 0.125, 512)
    assert reference.abs().sum() > 0

    wrong: list[str] = []
    stop = threading.Event()

    def train() -> None:
        while not stop.is_set():
            try:
                out = tilelang_dsa.fused_sparse_mla_absorbed(query, key, indices, 0.125, 512)
            except Exception as exc:  # e.g. AttributeError when SparseMLA is None
                wrong.append(repr(exc))
                continue
            if out is None or not torch.equal(out, reference):
                wrong.append("zeros" if out is not None and not out.any() else "different")

    # Switch threads often, so that any window in which the probe exposes a stand-in
    # kernel on the live module is hit (it was, in 38 of 81 calls, before the fix).
    sys.setswitchinterval(1e-5)
    worker = threading.Thread(target=train)
    worker.start()
    try:
        for _ in range(50):
            seen = report_for(status(_ON_THE_ATTENTION), BACKPORT_ID)
            assert seen.verdict is Verdict.NEEDED
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(0.005)
    assert wrong == []


# ---- 2. reports stay true after a reload or a fresh import ---------------------------------

_RELOAD_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys
    from backports.megatron import apply, manifest, status
    from backports.megatron.job import start_up
    start_up.deactivate()  # this environment's own hook, if it has one: apply() decides here
    from backports.megatron.job.ranks import installed_backports
    from backports.megatron.testing.fake_kernel import FakeSparseMLA
    from tests.reports import report_for
    BACKPORT_ID = "megatron-lm-7617"
    NAME = sys.argv[1]
    module = importlib.import_module(NAME)
    module.SparseMLA = FakeSparseMLA()
    first = report_for(apply(BACKPORT_ID), BACKPORT_ID)  # alone: the others are not this test's
    importlib.reload(module)  # runs the module again: the original is bound once more
    bound = getattr(module.fused_sparse_mla_absorbed, "__backport__", None)
    after = report_for(status(BACKPORT_ID), BACKPORT_ID)  # alone: #6964's sniff starts two children
    print(json.dumps({
        "first": first.action.value,
        "bound_after_reload": bound,
        "status_after_reload": after.action.value,
        "manifest_action": manifest()["backports"]["megatron-lm-7617"]["action"],
        "ranks": installed_backports(),
    }))
    """
)


def test_a_reload_is_patched_again_and_reported_truly() -> None:
    """The import hook patches the re-executed module; every report agrees with it."""
    done = subprocess.run(
        [sys.executable, "-c", _RELOAD_SCRIPT, TILELANG_DSA],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["first"] == "installed"
    assert seen["bound_after_reload"] == BACKPORT_ID
    assert seen["status_after_reload"] == Action.ALREADY_INSTALLED.value
    assert seen["manifest_action"] == "installed"
    assert BACKPORT_ID in seen["ranks"]


def test_a_fresh_import_is_never_reported_as_patched(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second module object from a fresh import: patched again by the hook, and the
    old module object's patch is still undone by revert."""
    report = report_for(apply(), BACKPORT_ID)
    assert report.action is Action.INSTALLED
    # The fresh import also rebinds the parent package's attribute: put it back afterwards too
    # (megatron's dsa_kernels reaches the module through it, and later tests patch the one in
    # sys.modules).
    package, _, name = TILELANG_DSA.rpartition(".")
    monkeypatch.setattr(sys.modules[package], name, tilelang_dsa)
    monkeypatch.delitem(sys.modules, TILELANG_DSA)
    fresh = importlib.import_module(TILELANG_DSA)
    assert fresh is not tilelang_dsa
    fresh.SparseMLA = fake_kernel
    assert getattr(fresh.fused_sparse_mla_absorbed, "__backport__", None) == BACKPORT_ID
    seen = report_for(status(), BACKPORT_ID)
    assert seen.action is Action.ALREADY_INSTALLED
    assert BACKPORT_ID in installed_backports()
    from backports.megatron import revert

    revert()
    assert not hasattr(fresh.fused_sparse_mla_absorbed, "__backport__")
    assert not hasattr(tilelang_dsa.fused_sparse_mla_absorbed, "__backport__")


def test_an_original_put_back_by_someone_else_is_not_reported_installed(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = tilelang_dsa.fused_sparse_mla_absorbed
    apply(only=BACKPORT_ID)
    # Not monkeypatch: its undo would bind our replacement again after the test.
    tilelang_dsa.fused_sparse_mla_absorbed = original
    seen = report_for(status(), BACKPORT_ID)
    assert seen.action is Action.WOULD_INSTALL
    assert BACKPORT_ID not in installed_backports()
    assert manifest()["backports"][BACKPORT_ID]["action"] != "installed"
    again = report_for(apply(), BACKPORT_ID)
    assert again.action is Action.INSTALLED


# ---- 3. another patch already in place -----------------------------------------------------


def test_a_third_party_wrapper_is_refused_not_overwritten(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = tilelang_dsa.fused_sparse_mla_absorbed
    calls = []

    @functools.wraps(original)
    def team_patch(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", team_patch)
    report = report_for(apply(), BACKPORT_ID)
    assert report.verdict is Verdict.INCOMPATIBLE
    assert "wrapped by another patch" in report.reason and "team_patch" in report.reason
    assert tilelang_dsa.fused_sparse_mla_absorbed is team_patch
    assert calls == []  # the probe did not run the team's wrapper


def test_a_replacement_from_another_file_is_refused(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hand_written(query, key, topk_indices, softmax_scale, v_channels):
        return None

    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", hand_written)
    report = report_for(status(), BACKPORT_ID)
    assert report.verdict is Verdict.INCOMPATIBLE
    assert __file__ in report.reason


# ---- 4. odd modules in sys.modules ----------------------------------------------------------


class _DictRaises(types.ModuleType):
    def __getattribute__(self, name):
        if name == "__dict__":
            raise RuntimeError("this module refuses to be looked at")
        return super().__getattribute__(name)


class _LazyFails(types.ModuleType):
    def __getattr__(self, name):
        raise ImportError(f"lazy import of {name} failed")


def test_odd_modules_are_skipped(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "odd_dict_raises", _DictRaises("odd_dict_raises"))
    monkeypatch.setitem(sys.modules, "odd_lazy_fails", _LazyFails("odd_lazy_fails"))
    monkeypatch.setitem(sys.modules, "odd_none", None)
    report = report_for(apply(), BACKPORT_ID)
    assert report.action is Action.INSTALLED
    from backports.megatron import revert

    undone = report_for(revert(), BACKPORT_ID)
    assert undone.action is Action.REVERTED


def test_an_alias_in_a_module_that_refuses_setattr_is_skipped(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Frozen(types.ModuleType):
        def __setattr__(self, name, value):
            raise AttributeError("read-only module")

    frozen = Frozen("frozen_alias")
    vars(frozen)["fused_sparse_mla_absorbed"] = tilelang_dsa.fused_sparse_mla_absorbed
    monkeypatch.setitem(sys.modules, "frozen_alias", frozen)
    report = report_for(apply(), BACKPORT_ID)
    assert report.action is Action.INSTALLED
    assert getattr(tilelang_dsa.fused_sparse_mla_absorbed, "__backport__", None) == BACKPORT_ID


# ---- 9. nested applied() across threads -----------------------------------------------------


def test_overlapping_applied_blocks_in_two_threads(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA
) -> None:
    """The first block to exit must not revert under the other."""
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen_by_second: list[object] = []

    def first() -> None:
        with applied():
            first_in.set()
            second_in.wait(30)
        first_out.set()

    def second() -> None:
        first_in.wait(30)
        with applied():
            second_in.set()
            first_out.wait(30)
            seen_by_second.append(
                getattr(tilelang_dsa.fused_sparse_mla_absorbed, "__backport__", None)
            )

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen_by_second == [BACKPORT_ID]
    assert not hasattr(tilelang_dsa.fused_sparse_mla_absorbed, "__backport__")
