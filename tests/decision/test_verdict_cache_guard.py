"""An import guard's verdict in the verdict cache: reused only while nothing its sniff's
child interpreters depend on has changed.

megatron-lm-6964's sniff imports the attention module in two child interpreters (seconds
each); ``status`` and ``check`` reuse a verdict whose key covers the interpreter, the path,
the module's file and distribution, the vendored guard, our code and what every folder of
the path offers an import. Each part is changed alone here, as pip or an edit would, in a
site folder of the test's own put first on ``sys.path`` (a stand-in guarded module, so
that megatron's own packages are never shadowed); the children themselves run in
test_megatron_lm_6964 (slow).
"""

import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from backports.megatron import Verdict, decision
from backports.megatron.catalog.megatron_lm_6964 import SPEC
from backports.megatron.decision import verdict_cache
from backports.megatron.evidence import fingerprints
from backports.megatron.kinds.import_guard import ImportGuard
from backports.megatron.model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES
from tests.deciding import probe

pytestmark = pytest.mark.private_proofs  # tests of the proof store: their own store, or none

MODULE = "guarded_by_test.attention"
RECORD = "guarded_by_test/attention.py,sha256=AAAA,17\nguarded_by_test-1.0.dist-info/RECORD,,\n"


@pytest.fixture
def site(monkeypatch, tmp_path) -> Path:
    """A folder first on sys.path where pip installed ``guarded-by-test`` 1.0 (the guarded
    module's distribution), flash-attn 2.8.3 and nothing else."""
    site = tmp_path / "site"
    module = site / "guarded_by_test" / "attention.py"
    module.parent.mkdir(parents=True)
    module.write_text("HAVE_FA4 = False\n")
    _dist(site, "guarded_by_test", "1.0", RECORD)
    _dist(site, "flash_attn", "2.8.3", "flash_attn/__init__.py,,\n")
    (site / "flash_attn").mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


def _dist(site: Path, name: str, version: str, record: str) -> Path:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
    )
    (info / "RECORD").write_text(record)
    return info


def _spec() -> Any:
    """megatron-lm-6964 (its vendored guard, its sniff) guarding the stand-in module."""
    guard = ImportGuard(
        distribution="guarded-by-test",
        modules=(MODULE,),
        attribute="HAVE_FA4",
        replacement="fa4_import_guard",
    )
    return dataclasses.replace(SPEC, targets=(guard,))


def _digest() -> str:
    key = decision.cache_key(_spec())
    assert key is not None
    return verdict_cache._digest(key)


def test_the_real_entry_is_keyed_on_the_installed_attention_module():
    key = decision.cache_key(SPEC)
    (guard,) = key["targets"]
    assert key is not None and guard["kind"] == "import-guard"
    assert guard["module"]["file"].endswith("megatron/core/transformer/attention.py")
    assert guard["distribution"]["name"] == "megatron-core"
    assert guard["distribution"]["version"] == "0.19.2"
    assert decision.cache_key(SPEC) == key


def test_the_stand_in_is_keyed_and_the_key_is_stable(site):
    key = decision.cache_key(_spec())
    assert key is not None
    (guard,) = key["targets"]
    assert guard["module"]["file"] == str(site / "guarded_by_test" / "attention.py")
    assert guard["distribution"]["version"] == "1.0"
    assert _digest() == verdict_cache._digest(key)


def test_the_same_interpreter_by_another_name_keeps_the_key(site, monkeypatch, tmp_path):
    """`python`, `python3`, a venv's link: one binary, one key (the name is no part of it)."""
    before = _digest()
    alias = tmp_path / "bin" / "python"
    alias.parent.mkdir()
    alias.symlink_to(os.path.realpath(sys._base_executable))
    monkeypatch.setattr(sys, "executable", str(alias))
    monkeypatch.setattr(sys, "_base_executable", str(alias))
    assert _digest() == before


def test_another_interpreter_is_probed_again(site, monkeypatch, tmp_path):
    before = _digest()
    other = tmp_path / "python3.12"
    shutil.copy(os.path.realpath(sys._base_executable), other)  # another binary
    monkeypatch.setattr(sys, "executable", str(other))
    monkeypatch.setattr(sys, "_base_executable", str(other))
    assert _digest() != before


def test_the_key_is_the_same_before_and_after_torch_is_imported(site, monkeypatch):
    """A job decides #6964's guard at megatron's first import, before torch is imported;
    `backports apply`, which proved it, had imported torch: one key for both."""
    import torch

    after = _digest()
    monkeypatch.delitem(sys.modules, "torch")
    assert _digest() == after
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_another_path_order_is_probed_again(site, monkeypatch, tmp_path):
    """Two folders offering the same module: which comes first decides what is imported."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "flashattn_hopper.py").write_text(f"# {name}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    before = _digest()
    sys.path[:2] = sys.path[1::-1]
    assert _digest() != before


def test_a_folder_that_offers_nothing_changes_no_key(site, monkeypatch, tmp_path):
    """A console script's ``bin/`` first on its path, an empty folder: the same imports,
    so the same key (``backports apply`` proves what a job's ``python`` reuses)."""
    before = _digest()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "backports").write_text("#!/usr/bin/env python\n")
    monkeypatch.syspath_prepend(str(tmp_path / "bin"))
    assert _digest() == before


def test_the_folder_of_a_jobs_script_changes_no_key(site, monkeypatch, tmp_path):
    """`python train.py` puts train.py's folder first on the path; it offers nothing another
    folder offers: the job finds the proof `backports apply` kept."""
    before = _digest()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text("")
    (tmp_path / "job" / "data_utils.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "job"))
    assert _digest() == before


def test_an_edit_of_the_guarded_module_is_probed_again(site):
    before = _digest()
    (site / "guarded_by_test" / "attention.py").write_text("HAVE_FA4 = True\n")
    assert _digest() != before


def test_a_reinstall_of_the_guarded_distribution_is_probed_again(site):
    """RECORD's content, even rewritten at the same size and mtime (which the listing of
    the path folders cannot tell apart)."""
    record = site / "guarded_by_test-1.0.dist-info" / "RECORD"
    before = _digest()
    status = record.stat()
    record.write_text(RECORD.replace("AAAA", "BBBB"))
    os.utime(record, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert record.stat().st_size == status.st_size
    assert _digest() != before


def test_an_edit_of_the_vendored_guard_is_probed_again(site, monkeypatch, tmp_path):
    package = sys.modules[SPEC.vendored.package]
    copy = shutil.copytree(package.__path__[0], tmp_path / "vendored")
    monkeypatch.setattr(package, "__path__", [str(copy)])
    before = _digest()
    with (copy / "attention.py").open("a") as handle:
        handle.write("# an edit\n")
    assert _digest() != before


def test_an_edit_of_our_own_code_is_probed_again(site, monkeypatch, tmp_path):
    ours = shutil.copytree(fingerprints._PACKAGE_DIR, tmp_path / "ours")
    monkeypatch.setattr(fingerprints, "_PACKAGE_DIR", ours)
    before = _digest()
    with (ours / "catalog" / "megatron_lm_6964.py").open("a") as handle:
        handle.write("# an edit of the sniff\n")
    assert _digest() != before


def test_installing_flash_attn_4_is_probed_again(site):
    """The vendored guard decides FA4 by this distribution's metadata."""
    before = _digest()
    _dist(site, "flash_attn_4", "4.0.0", "flash_attn/cute/__init__.py,,\n")
    assert _digest() != before


def test_a_flash_attn_upgrade_is_probed_again(site):
    before = _digest()
    (site / "flash_attn-2.8.3.dist-info").rename(site / "flash_attn-2.8.4.dist-info")
    assert _digest() != before


def test_a_flash_attn_reinstall_is_probed_again(site):
    before = _digest()
    (site / "flash_attn-2.8.3.dist-info" / "RECORD").write_text("flash_attn/cute/x.py,,\n")
    assert _digest() != before


def test_a_package_put_on_the_path_by_hand_is_probed_again(site):
    """No distribution: flash_attn_3, which the attention module tries first, say."""
    before = _digest()
    (site / "flash_attn_3").mkdir()
    assert _digest() != before


@pytest.mark.parametrize("name", ["flashattn_hopper.py", "flash_attn_3.cpython-312-x86_64.so"])
def test_a_module_put_on_the_path_by_hand_is_probed_again(site, name):
    before = _digest()
    (site / name).write_text("")
    assert _digest() != before


def test_the_start_up_hook_and_bytecode_change_nothing(site):
    """The children run with the backports off: the hook's .pth file (written by `backports
    apply`, removed by `revert`) does not decide their answer; nor does a __pycache__."""
    before = _digest()
    (site / "megatron_backports_hook.pth").write_text("import sys\n")
    (site / "__pycache__").mkdir()
    (site / "README.txt").write_text("not importable\n")
    (site / "megatron-lm-6964-k2x9").mkdir()  # a temporary folder: no import reaches it
    assert _digest() == before


def test_no_key_when_the_module_is_not_a_file_of_its_distribution(site, monkeypatch, tmp_path):
    """A source checkout first on the path (RECORD does not follow its files), or no
    module at all: probe every time."""
    checkout = tmp_path / "checkout" / "guarded_by_test"
    checkout.mkdir(parents=True)
    (checkout / "attention.py").write_text("HAVE_FA4 = False\n")
    monkeypatch.syspath_prepend(str(checkout.parent))
    assert decision.cache_key(_spec()) is None
    monkeypatch.undo()
    assert decision.cache_key(_spec()) is None  # the site folder went with the undo


# ---- stored and reused, per mode -----------------------------------------------------------


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(folder))
    return folder


def _needed(*modes: str) -> dict[str, Any]:
    shown = {"fixed": True, "summary": "imports with FA4 off"}
    return {"vendored_behaviour": {mode: shown for mode in modes}, "target": {"stale": True}}


def test_a_stored_guard_verdict_is_reused_for_its_key_only(site, cache):
    spec = _spec()
    key = decision.cache_key(spec)
    assert key is not None
    verdict_cache.store(spec, key, "needed", "lacks the fix", _needed(UPSTREAM_ONLY))
    assert verdict_cache.load(spec, key, upstream_only=True) is not None
    _dist(site, "flash_attn_4", "4.0.0", "")
    again = decision.cache_key(spec)
    assert again is not None and verdict_cache.load(spec, again, upstream_only=True) is None


def test_a_verdict_proved_upstream_only_is_probed_again_in_the_default_mode(site, cache):
    spec = _spec()
    key = decision.cache_key(spec)
    assert key is not None
    verdict_cache.store(spec, key, "needed", "lacks the fix", _needed(UPSTREAM_ONLY))
    assert verdict_cache.load(spec, key, upstream_only=False) is None
    verdict_cache.store(
        spec, key, "needed", "lacks the fix", _needed(UPSTREAM_ONLY, WITH_LOCAL_CHANGES)
    )
    assert verdict_cache.load(spec, key, upstream_only=False) is not None
    assert verdict_cache.load(spec, key, upstream_only=True) is not None


def test_status_reuses_it_and_describes_this_process_afresh(site, cache, monkeypatch):
    """A hit runs no probe (no child); whether the guard is installed and the module
    executed is read in this process, never taken from the file."""
    spec = _spec()
    key = decision.cache_key(spec)
    assert key is not None
    evidence = _needed(UPSTREAM_ONLY, WITH_LOCAL_CHANGES)
    path = verdict_cache.store(spec, key, "needed", "lacks the fix", evidence)
    probed: list[str] = []
    monkeypatch.setattr(decision, "_sniffed", lambda spec, *args: probed.append(spec.id))
    result = probe(spec, upstream_only=False)
    assert probed == [] and result.verdict is Verdict.NEEDED
    assert result.reason == "lacks the fix"
    assert result.evidence["cache"] == {"hit": True, "file": str(path)}
    target = result.evidence["target"]
    assert target["module"] == MODULE and target["installed"] is False
    assert target["executed"] is False and "stale" not in target


def test_off_the_guard_is_probed(site, cache, monkeypatch):
    spec = _spec()
    key = decision.cache_key(spec)
    assert key is not None
    verdict_cache.store(spec, key, "needed", "lacks the fix", _needed(UPSTREAM_ONLY))
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "0")
    probed: list[str] = []

    def sniffed(spec, mode, early, targets, in_child):
        probed.append(spec.id)
        return decision.Decision(spec, mode, Verdict.NEEDED, "probed", early.evidence, targets)

    monkeypatch.setattr(decision, "_sniffed", sniffed)
    assert probe(spec, upstream_only=True).reason == "probed"
    assert probed == [spec.id]


def test_audit_never_keeps_a_candidates_verdict(monkeypatch, tmp_path):
    """The candidate's verdict would displace this environment's (one file per id)."""
    from backports.megatron.commands import _candidate as audit

    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")  # on here: off in the child
    seen: dict[str, str] = {}

    def run(command, env, **kwargs):
        seen.update(env)
        raise RuntimeError("stop here")

    monkeypatch.setattr(audit.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="stop here"):
        audit._run_child(tmp_path, (), 10, False)
    assert seen["MEGATRON_BACKPORTS_CACHE"] == "0"


def test_a_bare_folder_beside_a_jobs_script_changes_no_key(site, monkeypatch, tmp_path):
    """`python spawn4.py` in a folder that also holds ``venv/`` (no ``__init__.py``): the
    standard library's ``venv`` package wins over a namespace portion, so no import changes."""
    before = _digest()
    (tmp_path / "job" / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "job" / "spawn4.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "job"))
    assert _digest() == before
