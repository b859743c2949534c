"""What the tool runs stays its own (issue 33): children take no code from the working
directory, a sniff cannot change the job's process state or hang it, a lookup that finds
nothing does not spend the start-up trigger, a verdict is keyed on what it judged."""

import json
import os
import random
import sys
from pathlib import Path

import pytest

import backports.megatron
from backports.megatron import Action, Verdict, apply, status
from backports.megatron.decision import sniffing, verdict_cache
from backports.megatron.interpreter import children
from backports.megatron.job import start_up
from backports.megatron.model import SniffResult
from tests.reports import report_for

pytestmark = pytest.mark.private_proofs  # the sniffs' children run in each test: no stored proof

# A module that says it ran, where a child could take it from the working directory.
_SPY = "import os, sys\nopen(os.environ['SPY_FILE'], 'a').write(f'{__name__} ran\\n')\n"


@pytest.fixture
def spy_folder(tmp_path, monkeypatch) -> Path:
    """The working directory holds a ``json.py`` and a ``megatron`` package that say so
    when anything imports them."""
    folder = tmp_path / "cwd"
    (folder / "megatron").mkdir(parents=True)
    (folder / "json.py").write_text(_SPY)
    (folder / "megatron" / "__init__.py").write_text(_SPY)
    monkeypatch.setenv("SPY_FILE", str(tmp_path / "ran.txt"))
    monkeypatch.chdir(folder)
    return tmp_path / "ran.txt"


def test_a_child_takes_nothing_from_the_working_directory(spy_folder):
    done = children.run_python(
        "import json, sys; print(json.dumps({'cwd': __import__('os').getcwd()}))", timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cwd"] != str(Path.cwd())  # a private folder
    assert not spy_folder.exists()  # neither json.py nor megatron ran


def test_the_childs_path_leaves_out_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts it first
    monkeypatch.syspath_prepend("")  # as `python -c` does
    monkeypatch.syspath_prepend(".")
    path = children.child_path(["/first"])
    assert path[0] == "/first"
    assert "" not in path and "." not in path and str(tmp_path) not in path


@pytest.mark.slow
def test_status_of_an_import_guard_runs_nothing_from_the_working_directory(spy_folder):
    """#6964's sniff starts two children importing torch and megatron: from a folder with a
    ``json.py`` and a ``megatron/`` (a shared /tmp, a Megatron-LM checkout), neither runs,
    and the installed megatron-core is what they judge."""
    report = report_for(status("megatron-lm-6964"), "megatron-lm-6964")
    assert report.verdict is Verdict.NEEDED, report.reason
    assert not spy_folder.exists(), spy_folder.read_text()
    judged = report.evidence["behaviour"]["megatron"]
    assert judged is not None and str(Path.cwd()) not in judged


# ---- a sniff stays bounded and leaves the process as it found it ----------------------------


def _spec_with(sniff):  # type: ignore[no-untyped-def]
    import dataclasses

    from backports.megatron.catalog import MEGATRON_LM_7091

    return dataclasses.replace(MEGATRON_LM_7091, sniff=sniff)


def test_a_sniff_that_hangs_is_judged_timed_out_and_the_job_goes_on(monkeypatch):
    import threading

    release = threading.Event()
    monkeypatch.setenv(sniffing.TIMEOUT, "0.5")
    spec = _spec_with(lambda targets: release.wait(30) or SniffResult(True, "late"))
    ((outcome,)) = sniffing.run_sniffs(spec, [[]], in_child=False)
    release.set()
    assert type(outcome).__name__ == "SniffFailed" and "timed out after 0.5 s" in str(outcome)


def test_a_slow_first_import_the_sniff_needs_is_not_the_sniffs_time(tmp_path, monkeypatch):
    """``sniff_imports`` are imported before the clock starts: a module whose first import
    outlasts the limit (a fresh host's megatron) leaves the sniff inside it."""
    import dataclasses
    import sys
    import time

    (tmp_path / "slow_to_import_6507.py").write_text("import time\ntime.sleep(1.5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_to_import_6507", raising=False)
    monkeypatch.setenv(sniffing.TIMEOUT, "1")

    def sniff(targets):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        import slow_to_import_6507  # noqa: F401

        return SniffResult(True, f"ran in {time.monotonic() - started:.1f} s")

    spec = dataclasses.replace(_spec_with(sniff), sniff_imports=("slow_to_import_6507",))
    ((outcome,)) = sniffing.run_sniffs(spec, [[]], in_child=False)
    assert isinstance(outcome, SniffResult) and outcome.summary == "ran in 0.0 s"


def test_a_sniff_that_hangs_makes_the_backport_incompatible(tilelang_dsa, monkeypatch):
    import threading

    from tests.deciding import probe

    release = threading.Event()
    monkeypatch.setenv(sniffing.TIMEOUT, "0.5")
    spec = _spec_with(lambda targets: release.wait(30) or SniffResult(True, "late"))
    decision = probe(spec)
    release.set()
    assert decision.verdict is Verdict.INCOMPATIBLE
    assert "sniff timed out after 0.5 s" in decision.reason


def test_a_sniff_cannot_change_the_processes_state(tmp_path, monkeypatch):
    import numpy
    import torch

    before = (
        os.getcwd(),
        list(sys.path),
        list(sys.meta_path),
        dict(os.environ),
        random.getstate(),
        numpy.random.get_state()[1].tolist(),
        torch.get_rng_state().tolist(),
    )

    def meddling(targets):  # type: ignore[no-untyped-def]
        os.chdir(tmp_path)
        sys.path.insert(0, str(tmp_path))
        sys.meta_path.insert(0, object())
        os.environ["MEDDLED"] = "1"
        os.environ.pop("HOME", None)
        random.random(), numpy.random.rand(), torch.rand(1)
        return SniffResult(False, "meddled")

    (outcome,) = sniffing.run_sniffs(_spec_with(meddling), [[]], in_child=False)
    assert outcome.summary == "meddled"
    after = (
        os.getcwd(),
        list(sys.path),
        list(sys.meta_path),
        dict(os.environ),
        random.getstate(),
        numpy.random.get_state()[1].tolist(),
        torch.get_rng_state().tolist(),
    )
    assert after == before


# ---- the start-up trigger ------------------------------------------------------------------


@pytest.fixture
def trigger(monkeypatch):  # type: ignore[no-untyped-def]
    calls: list[dict] = []
    monkeypatch.setattr(backports.megatron, "_job_start", lambda module, **c: calls.append(c))
    start_up.deactivate()
    monkeypatch.delitem(sys.modules, "megatron", raising=False)
    found = backports.megatron._start_up(("megatron",), {"strict": False, "only": None})
    yield found, calls
    start_up.deactivate()


def test_a_lookup_that_finds_nothing_leaves_the_trigger_waiting(trigger):
    """``try: import megatron.core / except ImportError: sys.path.insert(0, checkout)``, or a
    library's ``find_spec("megatron")`` before the path is set: the real import later
    still fires (issue 33 item 3)."""
    found, calls = trigger
    with pytest.MonkeyPatch.context() as unset:  # the path as it was before it was set
        unset.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
        unset.setattr(sys, "meta_path", [f for f in sys.meta_path if "editable" not in repr(f)])
        assert found.find_spec("megatron", None, None) is None  # nothing to be found yet
        assert not found.fired and start_up.active()
    # The path is set: megatron can be found now.
    spec = found.find_spec("megatron", None, None)
    assert spec is not None and found.fired
    module = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert calls == [{"strict": False, "only": None}]


# ---- verdicts per environment, and on what they judged -------------------------------------


def test_two_environments_sharing_a_cache_folder_keep_both_verdicts(
    tilelang_dsa, monkeypatch, tmp_path
):
    folder = tmp_path / "shared"
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(folder))
    from backports.megatron.catalog import MEGATRON_LM_7617

    mine = verdict_cache.file_name(MEGATRON_LM_7617)
    monkeypatch.setattr(sys, "prefix", "/opt/another/venv")
    theirs = verdict_cache.file_name(MEGATRON_LM_7617)
    monkeypatch.undo()
    assert mine != theirs and mine.startswith("megatron-lm-7617.")


def test_apply_consults_the_verdict_status_kept_for_an_import_guard(monkeypatch, tmp_path):
    """``status`` sniffs #6964 in children and keeps the verdict; a job's ``apply()`` then
    decides from it (here: a forged ``upstream`` for the same key skips the guard) instead
    of installing on the version alone (issue 33 item 10)."""
    from backports.megatron import decision
    from backports.megatron.catalog import MEGATRON_LM_6964

    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(tmp_path / "cache"))
    key = decision.cache_key(MEGATRON_LM_6964)
    assert key is not None
    verdict_cache.store(MEGATRON_LM_6964, key, "upstream", "already has the fix (kept)", {})
    with pytest.warns(UserWarning, match="already has the fix"):
        (report,) = apply(MEGATRON_LM_6964.id)
    assert (report.verdict, report.action) == (Verdict.UPSTREAM, Action.SKIPPED)


def test_a_folder_of_job_scripts_on_the_path_keeps_the_childs_proof(tmp_path, monkeypatch):
    """`backports apply` (the console script: its bin/ first on the path) proves a child
    sniff; a job started as `torchrun train.py` has train.py's folder first. That folder
    offers nothing the child imports: the same key, the proof holds there. A folder that
    offers `megatron` (a checkout) changes what the child imports: another key."""
    from backports.megatron import decision
    from backports.megatron.catalog import by_id

    scripts = tmp_path / "job"
    scripts.mkdir()
    (scripts / "train.py").write_text("")
    (scripts / "data_utils.py").write_text("")
    checkout = tmp_path / "Megatron-LM"
    (checkout / "megatron").mkdir(parents=True)
    (checkout / "megatron" / "__init__.py").write_text("")
    spec = by_id("megatron-lm-6890")
    site = [p for p in sys.path if p.endswith("site-packages")]

    def key_with(first: list[str]) -> list[str]:
        monkeypatch.setattr(children, "child_path", lambda: [*first, *site])
        return decision._child_path_key(spec)

    assert key_with([str(scripts)]) == key_with([]) == site
    assert key_with([str(checkout)]) == [str(checkout), *site]


def test_a_job_without_the_proof_proves_a_child_sniff_entry_itself_once(tmp_path, monkeypatch):
    """No proof, no silence: with the proof store on and no proof in it, a job's process runs
    #6964's child sniff itself (under the store's lock), keeps the proof, and the next
    process of the node reads it and starts no child."""
    from backports.megatron import api, decision

    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(tmp_path / "cache"))
    sniffed, locked = [], []
    real_sniffed, real_proving = decision._sniffed, verdict_cache.proving

    def counting(spec, *args, **kwargs):
        sniffed.append(spec.id)
        return real_sniffed(spec, *args, **kwargs)

    def proving(spec):
        locked.append(spec.id)
        return real_proving(spec)

    monkeypatch.setattr(decision, "_sniffed", counting)
    monkeypatch.setattr(verdict_cache, "proving", proving)
    (report,) = api.apply_in_job(("megatron-lm-6964",))
    assert report.verdict is Verdict.NEEDED and report.action is not Action.SKIPPED
    assert report.evidence["cache"] == {"hit": False, "file": report.evidence["cache"]["file"]}
    assert sniffed == locked == ["megatron-lm-6964"]
    api.revert("megatron-lm-6964")
    (again,) = api.apply_in_job(("megatron-lm-6964",))
    assert again.evidence["cache"]["hit"] is True and sniffed == ["megatron-lm-6964"]
    api.revert("megatron-lm-6964")


def test_a_folder_a_package_put_on_the_path_keeps_the_childs_proof(tmp_path, monkeypatch):
    """Importing setuptools appends its ``_vendor`` folder to ``sys.path``: `backports apply`
    (megatron imported) has it, a job deciding #6964's guard before megatron's import does
    not. It is inside a package of another folder of the path: no part of the key."""
    from backports.megatron import decision
    from backports.megatron.catalog import by_id

    site = tmp_path / "site-packages"
    (site / "setuptools" / "_vendor" / "packaging").mkdir(parents=True)
    (site / "setuptools" / "__init__.py").write_text("")
    (site / "packaging").mkdir()
    (site / "megatron").mkdir()
    vendor = site / "setuptools" / "_vendor"
    spec = by_id("megatron-lm-6964")

    def key_with(path: list[str]) -> list[str]:
        monkeypatch.setattr(children, "child_path", lambda: path)
        return decision._child_path_key(spec)

    assert key_with([str(site), str(vendor)]) == key_with([str(site)]) == [str(site)]


def test_ctrl_c_during_a_sniff_in_the_calling_thread_is_the_users_not_a_failed_sniff():
    """Inside an import the sniff runs in the calling (main) thread: a Ctrl-C that lands
    in it ends the command (exit 130), it is not a sniff that failed ("incompatible")."""

    def pressed(targets):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), sniffing.sniffs_in_this_thread():
        sniffing.run_sniffs(_spec_with(pressed), [[]], in_child=False)
