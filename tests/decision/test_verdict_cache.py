"""The verdict cache on real megatron-core 0.19.2: reused only for the very same code.

(Processes that reuse a verdict after a real edit of the installed target: test_start_up.)
"""

import importlib.metadata
import json
import os
import shutil
from pathlib import Path

import pytest

from backports.megatron import Action, Verdict, apply, decision, revert
from backports.megatron.catalog import by_id
from backports.megatron.decision import verdict_cache
from backports.megatron.evidence import fingerprints
from tests import standins
from tests.conftest import BACKPORT_ID

pytestmark = pytest.mark.private_proofs  # tests of the proof store: their own store, or none


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """The cache on (conftest turns it off), in a folder of this test's own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def probes(monkeypatch) -> list[str]:
    """The sniffs decide() runs (the cache saves them), by backport id."""
    calls: list[str] = []
    real = decision._sniffed

    def counting(spec, *args, **kwargs):
        calls.append(spec.id)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(decision, "_sniffed", counting)
    return calls


FILE = verdict_cache.file_name(by_id(BACKPORT_ID))  # one file per backport and environment


def _entry(cache: Path) -> dict:
    return json.loads((cache / FILE).read_text())


def test_a_proved_verdict_is_kept_and_reused(tilelang_dsa, cache, probes):
    (first,) = apply(BACKPORT_ID)
    assert first.action is Action.INSTALLED and first.evidence["cache"]["hit"] is False
    stored = _entry(cache)
    assert stored["verdict"] == "needed" and stored["reason"] == first.reason
    revert(BACKPORT_ID)
    (again,) = apply(BACKPORT_ID)  # what a worker process does at the target's import
    assert again.action is Action.INSTALLED and again.verdict is Verdict.NEEDED
    assert again.evidence["cache"] == {"hit": True, "file": str(cache / FILE)}
    assert again.evidence["behaviour"] == first.evidence["behaviour"]
    assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == BACKPORT_ID
    assert probes == [BACKPORT_ID]  # the second apply(BACKPORT_ID) reused the first one's verdict


def test_a_changed_function_is_probed_again(tilelang_dsa, cache, probes, monkeypatch):
    apply(BACKPORT_ID)
    revert(BACKPORT_ID)
    # The same module and file, other code: megatron-core with the fix, say.
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    with pytest.warns(UserWarning, match="already has the fix"):
        (report,) = apply(BACKPORT_ID)
    assert report.verdict is Verdict.UPSTREAM and report.action is Action.SKIPPED
    assert tilelang_dsa.fused_sparse_mla_absorbed is standins.fixed_upstream
    assert probes == [BACKPORT_ID, BACKPORT_ID]
    assert _entry(cache)["verdict"] == "upstream"  # the new verdict, for the new code


def test_the_stored_verdict_decides_for_its_key(tilelang_dsa, cache):
    """The control for the tests below: an entry that matches is believed."""
    apply(BACKPORT_ID)
    revert(BACKPORT_ID)
    path = cache / FILE
    entry = _entry(cache)
    path.write_text(json.dumps({**entry, "verdict": "upstream", "reason": "from the cache"}))
    with pytest.warns(UserWarning, match="from the cache"):
        (report,) = apply(BACKPORT_ID)
    assert report.verdict is Verdict.UPSTREAM and report.evidence["cache"]["hit"] is True


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda entry: "{not json",
        lambda entry: json.dumps(entry)[:-40],  # a torn write
        lambda entry: "\x00\xff garbage",
        lambda entry: json.dumps([entry]),
        lambda entry: json.dumps({**entry, "format": 0, "verdict": "upstream"}),
        lambda entry: json.dumps({**entry, "key": "0" * 64, "verdict": "upstream"}),
        lambda entry: json.dumps({**entry, "verdict": "incompatible"}),
        lambda entry: json.dumps({**entry, "evidence": "upstream", "verdict": "upstream"}),
        # Within MAX_BYTES, nested deeper than the parser recurses (RecursionError).
        lambda entry: "[" * 200_000 + "]" * 200_000,
    ],
    ids=["not-json", "torn", "binary", "a-list", "old-format", "other-key", "bad-verdict",
         "bad-evidence", "nested-too-deep"],
)  # fmt: skip
def test_a_corrupt_or_foreign_entry_is_ignored_and_replaced(tilelang_dsa, cache, probes, corrupt):
    apply(BACKPORT_ID)
    revert(BACKPORT_ID)
    path = cache / FILE
    path.write_text(corrupt(_entry(cache)), encoding="utf-8", errors="surrogateescape")
    (report,) = apply(BACKPORT_ID)
    assert report.action is Action.INSTALLED and report.evidence["cache"]["hit"] is False
    assert probes == [BACKPORT_ID, BACKPORT_ID]
    assert _entry(cache)["verdict"] == "needed"  # a sound entry again


def test_a_needed_verdict_carries_the_sniff_on_the_vendored_code(tilelang_dsa, cache, probes):
    apply(BACKPORT_ID, upstream_only=False)
    shown = _entry(cache)["evidence"]["vendored_behaviour"]
    assert shown["local-changes"]["fixed"] is True and shown["upstream-only"]["fixed"] is True
    revert(BACKPORT_ID)
    (again,) = apply(BACKPORT_ID, upstream_only=True)  # proved for both modes: reused
    assert again.evidence["cache"]["hit"] is True and probes == [BACKPORT_ID]


@pytest.mark.parametrize(
    "unproven",
    [
        lambda evidence: {k: v for k, v in evidence.items() if k != "vendored_behaviour"},
        lambda evidence: {**evidence, "vendored_behaviour": {"upstream-only": {"fixed": True}}},
        lambda evidence: {
            **evidence,
            "vendored_behaviour": {
                "upstream-only": {"fixed": False},
                "local-changes": {"fixed": True},
            },
        },
    ],
    ids=["without-the-sniff", "upstream-only-proved", "upstream-only-unfixed"],
)
def test_a_needed_verdict_not_proved_for_the_mode_is_probed_again(
    tilelang_dsa, cache, probes, unproven
):
    """A file of format 1, or one an upstream-only process wrote, never stands for a
    default-mode install: its vendored code was not sniffed with the local changes."""
    apply(BACKPORT_ID, upstream_only=False)
    revert(BACKPORT_ID)
    path = cache / FILE
    entry = _entry(cache)
    path.write_text(json.dumps({**entry, "evidence": unproven(entry["evidence"])}))
    (report,) = apply(BACKPORT_ID, upstream_only=False)
    assert report.action is Action.INSTALLED and report.evidence["cache"]["hit"] is False
    assert probes == [BACKPORT_ID, BACKPORT_ID]


def test_an_upstream_only_proof_stands_for_upstream_only(tilelang_dsa, cache, probes):
    apply(BACKPORT_ID, upstream_only=True)
    revert(BACKPORT_ID)
    assert list(_entry(cache)["evidence"]["vendored_behaviour"]) == ["upstream-only"]
    (report,) = apply(BACKPORT_ID, upstream_only=True)
    assert report.evidence["cache"]["hit"] is True and probes == [BACKPORT_ID]


def test_off_reads_and_writes_nothing(tilelang_dsa, cache, monkeypatch):
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "0")
    (report,) = apply(BACKPORT_ID)
    assert report.action is Action.INSTALLED and "cache" not in report.evidence
    assert not cache.exists()


def test_the_key_covers_torch_and_our_own_files(tilelang_dsa, monkeypatch, tmp_path):

    spec = by_id(BACKPORT_ID)
    key = decision.cache_key(spec)
    assert key is not None and decision.cache_key(spec) == key
    (target,) = key["targets"]
    assert target["file"] == tilelang_dsa.__file__
    assert target["distribution"]["version"] == "0.19.2"
    assert "plugin" not in key  # a builtin's key: its code is ours, covered below

    # torch's installed version (its distribution's, read without importing torch)
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "9.9.9" if name == "torch" else real_version(name),
    )
    assert decision.cache_key(spec) != key
    monkeypatch.undo()

    ours = shutil.copytree(fingerprints._PACKAGE_DIR, tmp_path / "megatron")
    monkeypatch.setattr(fingerprints, "_PACKAGE_DIR", ours)
    before = decision.cache_key(spec)
    with (ours / "api.py").open("a") as handle:
        handle.write("# an edit\n")
    assert decision.cache_key(spec) != before


def test_no_key_while_the_target_is_not_loaded_or_is_ours(tilelang_dsa, monkeypatch):
    spec = by_id(BACKPORT_ID)
    apply(BACKPORT_ID)  # installed: the loaded function is our replacement
    assert decision.cache_key(spec) is None
    revert(BACKPORT_ID)
    monkeypatch.delitem(__import__("sys").modules, tilelang_dsa.__name__)
    assert decision.cache_key(spec) is None


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The names of the distribution files read (RECORD, METADATA, ...), in order."""
    import importlib.metadata

    seen: list[str] = []
    real = importlib.metadata.PathDistribution.read_text

    def read_text(self, name):
        seen.append(name)
        if name == "RECORD":
            records_read.append(self.metadata["Name"])
        return real(self, name)

    records_read.clear()
    monkeypatch.setattr(importlib.metadata.PathDistribution, "read_text", read_text)
    return seen


# Whose RECORD each read of a ``reads`` test was (a name per read): megatron-core's, and
# megatron-fsdp's once an earlier test of the session imported megatron_fsdp (#5976's copy).
records_read: list[str] = []


def test_one_look_reads_megatron_cores_record_once_for_every_key(tilelang_dsa, reads, monkeypatch):
    """The keys of every entry hash megatron-core's RECORD (and list our own files): at a
    target's import, inside one look, that is read once; outside one, every key reads
    afresh (a reinstall between two calls changes it)."""

    from backports.megatron.catalog import CATALOG
    from backports.megatron.evidence.one_look import one_look

    listed: list[str] = []
    scandir = fingerprints.os.scandir
    monkeypatch.setattr(fingerprints.os, "scandir", lambda p: listed.append(str(p)) or scandir(p))
    loaded = [spec for spec in CATALOG if decision.cache_key(spec) is not None]
    assert len(loaded) >= 2 and reads.count("RECORD") >= len(loaded)  # a read per target
    reads.clear()
    records_read.clear()
    listed.clear()
    with one_look():
        keys = [decision.cache_key(spec) for spec in loaded]
        assert [decision.cache_key(spec) for spec in loaded] == keys
        assert "megatron-core" in records_read
        assert sorted(records_read) == sorted(set(records_read))  # each distribution once
        assert listed.count(str(fingerprints._PACKAGE_DIR)) == 1  # our files: listed once
    assert decision.cache_key(loaded[0]) == keys[0]
    assert reads.count("RECORD") > 1


def test_the_version_evidence_and_the_keys_share_one_read_of_record(tilelang_dsa, reads):
    """At a target's import both read megatron-core's RECORD (its packages; its hash):
    inside one look, once between them."""

    from backports.megatron.catalog import CATALOG
    from backports.megatron.evidence.one_look import one_look
    from backports.megatron.evidence.versions import installed_version

    with one_look():
        for spec in CATALOG:
            installed_version(spec.target.distribution, spec.target.modules)
            decision.cache_key(spec)
    # Once per distribution: megatron-core's, and megatron-fsdp's (#5976's and #6357's copies).
    distributions = {target.distribution for spec in CATALOG for target in spec.targets}
    assert reads.count("RECORD") == len(distributions) == 2


# ---- a cache nobody else may write (issue 24 items 8, 9, 10) ----------------------------------


def _forge_upstream(cache: Path) -> Path:
    """A genuine entry for this key, turned into an ``upstream`` verdict by someone else."""
    apply(BACKPORT_ID)
    revert(BACKPORT_ID)
    path = cache / FILE
    path.write_text(json.dumps({**_entry(cache), "verdict": "upstream", "reason": "forged"}))
    return path


def _apply_quietly() -> tuple[list, list[str]]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reports = apply(BACKPORT_ID)
    return reports, [str(w.message) for w in caught]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda path: os.chown(path, 4242, -1), id="file-of-another-user",
                     marks=needs_root),
        pytest.param(lambda path: os.chown(path.parent, 4242, -1), id="folder-of-another-user",
                     marks=needs_root),
        pytest.param(lambda path: path.chmod(0o666), id="file-writable-by-all"),
        pytest.param(lambda path: path.parent.chmod(0o777), id="folder-writable-by-all"),
    ],
)  # fmt: skip
def test_a_cache_another_user_can_write_is_refused_saying_why_once(tilelang_dsa, cache, spoil):
    spoil(_forge_upstream(cache))
    (report,), said = _apply_quietly()
    assert report.verdict is Verdict.NEEDED and report.action is Action.INSTALLED
    assert report.evidence.get("cache", {}).get("hit") is not True
    refusals = [m for m in said if "verdict cache" in m]
    assert len(refusals) == 1 and ("owned by" in refusals[0] or "writable by" in refusals[0])
    revert(BACKPORT_ID)
    _, said = _apply_quietly()
    assert not [m for m in said if "verdict cache" in m]  # said once


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    monkeypatch.delenv("MEGATRON_BACKPORTS_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    folders = verdict_cache.locations()
    assert all(folder.is_absolute() for folder in folders)
    assert folders[-1].parent.parent == tmp_path / ".cache"


def test_the_fallback_is_not_read_while_the_first_location_works(
    tilelang_dsa, cache, monkeypatch, tmp_path
):
    _forge_upstream(cache)  # a forged verdict in the fallback
    first = tmp_path / "venv-cache"
    monkeypatch.setattr(verdict_cache, "locations", lambda: [first, cache])
    (report,), _ = _apply_quietly()
    assert report.verdict is Verdict.NEEDED and report.evidence["cache"]["hit"] is False
    assert (first / FILE).is_file()  # stored where it is read next


def _in_a_thread(function, seconds: float = 20.0):
    import threading

    result: list = []
    thread = threading.Thread(target=lambda: result.append(function()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the cache read hangs"
    return result[0]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_only_a_regular_file_of_a_bounded_size_is_read(tilelang_dsa, cache, kind):
    path = _forge_upstream(cache)
    if kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.unlink()
        path.symlink_to("/dev/zero")
    else:  # a sound entry, padded past any size a verdict needs
        path.write_text(path.read_text() + " " * (4 << 20))
    (report,), _ = _in_a_thread(_apply_quietly)
    assert report.verdict is Verdict.NEEDED and report.evidence["cache"]["hit"] is False


def test_an_edit_of_one_entrys_vendored_code_leaves_our_code_as_it_was(monkeypatch, tmp_path):
    """An installed wheel keeps vendor/ as backports/megatron/_vendor: each entry's key
    has its own folder's hash, so editing #7617's vendored file must not take #6964's proof
    (kept by `backports apply`) away from a job."""
    package = tmp_path / "megatron"
    (package / "_vendor" / "megatron_lm_7617").mkdir(parents=True)
    (package / "api.py").write_text("a = 1\n")
    vendored = package / "_vendor" / "megatron_lm_7617" / "tilelang_dsa.py"
    vendored.write_text("x = 1\n")
    monkeypatch.setattr(fingerprints, "_PACKAGE_DIR", package)
    monkeypatch.setattr(fingerprints, "_VENDORED_INSIDE", package / "_vendor")
    before = fingerprints._read_our_code()
    vendored.write_text("x = 1\n# edited\n")
    assert fingerprints._read_our_code() == before
    (package / "api.py").write_text("a = 2  # edited\n")
    assert fingerprints._read_our_code() != before
