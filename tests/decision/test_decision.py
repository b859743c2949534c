"""One decision path: each backport's early evidence read once, each target located once,
each vendored folder hashed once, the replacement built once, the verdict cache asked once,
for a cold and a warm ``apply()`` and ``status()``, on real megatron-core 0.19.2."""

from collections import Counter
from pathlib import Path

import pytest

from backports.megatron import Action, apply, decision, revert, status
from backports.megatron.decision import early, verdict_cache
from backports.megatron.kinds import function
from tests.conftest import BACKPORT_ID

SECOND = "megatron-lm-7091"  # the other backport on tilelang_dsa: two decisions, one module
IDS = (BACKPORT_ID, SECOND)


class Spy:
    """Counts, per backport id, each step of a decision."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.monkeypatch = monkeypatch
        self._wrap(decision, "early_evidence", "early", lambda spec, *a: spec.id)
        self._wrap(early, "hash_folder", "hash", lambda package, *a: _id(package))
        self._wrap(decision, "_replacements", "build", lambda spec, *a: spec.id)
        self._wrap(verdict_cache, "load", "cache lookup", lambda spec, *a, **k: spec.id)
        self._wrap(verdict_cache, "store", "cache store", lambda spec, *a, **k: spec.id)
        self._wrap(decision, "_sniffed", "sniff", lambda spec, *a: spec.id)
        kind = function.FunctionKind
        self._wrap(kind, "find", "locate", lambda self, target, backport_id: backport_id)
        self._wrap(kind, "resolve", "locate", lambda self, target, backport_id: backport_id)

    def _wrap(self, owner: object, name: str, step: str, backport_id) -> None:  # type: ignore[no-untyped-def]
        real = getattr(owner, name)

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.counts[(backport_id(*args, **kwargs), step)] += 1
            return real(*args, **kwargs)

        self.monkeypatch.setattr(owner, name, counting)

    def of(self, backport_id: str) -> dict[str, int]:
        seen = {step: n for (bid, step), n in self.counts.items() if bid == backport_id}
        self.counts = Counter({k: n for k, n in self.counts.items() if k[0] != backport_id})
        return seen


def _id(package: str) -> str:
    return package.rpartition(".")[2].replace("_", "-")


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def spy(monkeypatch, tilelang_dsa) -> Spy:
    return Spy(monkeypatch)


ONCE = {"early": 1, "hash": 1, "locate": 1, "cache lookup": 1}


def test_a_cold_apply_decides_each_backport_once_and_keeps_the_verdict(spy, cache):
    reports = {r.id: r for r in apply(IDS)}
    assert {r.action for r in reports.values()} == {Action.INSTALLED}
    for backport_id in IDS:
        # The replacement is built once: for the sniff on it, then installed as it is.
        assert spy.of(backport_id) == {**ONCE, "sniff": 1, "build": 1, "cache store": 1}


def test_a_warm_apply_reuses_the_verdict_and_builds_the_replacement_once(spy, cache):
    apply(IDS)
    revert(IDS)
    spy.counts.clear()
    reports = {r.id: r for r in apply(IDS)}
    assert all(r.evidence["cache"]["hit"] is True for r in reports.values())
    for backport_id in IDS:
        assert spy.of(backport_id) == {**ONCE, "build": 1}  # no sniff, no store


def test_a_cold_status_decides_each_backport_once(spy, cache):
    reports = {r.id: r for r in status(IDS)}
    assert {r.action for r in reports.values()} == {Action.WOULD_INSTALL}
    for backport_id in IDS:
        assert spy.of(backport_id) == {**ONCE, "sniff": 1, "build": 1, "cache store": 1}


def test_a_warm_status_builds_nothing(spy, cache):
    status(IDS)
    spy.counts.clear()
    reports = {r.id: r for r in status(IDS)}
    assert all(r.evidence["cache"]["hit"] is True for r in reports.values())
    for backport_id in IDS:
        assert spy.of(backport_id) == ONCE  # nothing is installed: nothing is built


def test_without_the_cache_each_step_still_runs_once(spy):
    apply(IDS)
    for backport_id in IDS:
        assert spy.of(backport_id) == {"early": 1, "hash": 1, "locate": 1, "sniff": 1, "build": 1}


def test_the_folder_digest_changes_with_any_file_of_the_folder() -> None:
    """The verdict cache's key over a vendored folder: a file edited, added or renamed gives
    another key (a stale proof would judge code that is no longer there); the same files
    give the same key."""
    files = {"attention.py": "1" * 64, "UPSTREAM.toml": "2" * 64}
    keys = {
        early.FolderHashes("f", files).every_file(),
        early.FolderHashes("f", {**files, "attention.py": "3" * 64}).every_file(),
        early.FolderHashes("f", {**files, "extra.py": "1" * 64}).every_file(),
        early.FolderHashes("f", {"other.py": "1" * 64, "UPSTREAM.toml": "2" * 64}).every_file(),
    }
    assert len(keys) == 4
    assert early.FolderHashes("g", dict(files)).every_file() in keys
