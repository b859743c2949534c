"""Job-start activation in real interpreters: ``backports apply`` in a venv, then new processes.

Each test works in a throwaway venv with this repository pip-installed into it (see
tools/training_env.py), the way a user has it after ``pip install megatron-backports``:
fresh ``python -c`` processes, ``multiprocessing`` spawn children and two torchrun ranks
(CPU, gloo) must all come up patched, with no ``PYTHONPATH`` or other help.
"""

import ast
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from backports.megatron.catalog import CATALOG
from tests import standins
from tests.conftest import (
    BACKPORT_ID,
    TILELANG_DSA,
    builtin_rows,
    ids_installed_by_importing,
    skip_environment_plugins,
)
from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import training_env

IDS = [spec.id for spec in CATALOG]


@pytest.fixture(scope="module")
def rank_ids() -> list[str]:
    """What a rank that imports only the #7617 module installs (megatron's import chain
    brings in some other entries' targets too)."""
    return ids_installed_by_importing(TILELANG_DSA)


pytestmark = pytest.mark.slow

PATCHED = (
    f"import {TILELANG_DSA} as target\n"
    "print('patched:', getattr(target.fused_sparse_mla_absorbed, '__backport__', None))\n"
)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> training_env.TrainingEnv:
    """One venv for the tests that leave it as they found it."""
    return training_env.create(
        tmp_path_factory.mktemp("training") / "venv", always=skip_environment_plugins()
    )


@pytest.fixture
def disposable_venv(tmp_path) -> training_env.TrainingEnv:
    """A venv of its own, for a test that tampers with or uninstalls the package."""
    return training_env.create(tmp_path / "venv", always=skip_environment_plugins())


@pytest.fixture
def applied(venv):
    done = venv.run(["backports", "apply"])
    assert done.returncode == 0, done.stdout + done.stderr
    yield done
    venv.run(["backports", "revert"])


def _ok(done) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _patched(done) -> list[str]:
    return re.findall(r"patched: (\S+)", _ok(done))


def _script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_apply_then_revert_reaches_fresh_interpreters(venv):
    done = venv.run(["backports", "apply"])
    out = _ok(done)
    assert f"hook: wrote {venv.hook}" in out and "is not a site-packages" not in out
    assert re.search(rf"{BACKPORT_ID}\s.*\bneeded\s+installed\b", out)

    assert _patched(venv.run(["python", "-c", PATCHED])) == [BACKPORT_ID]
    status = _ok(venv.run(["backports", "status"]))  # not installed in its own process
    assert re.search(rf"{BACKPORT_ID}\s.*\bneeded\s+active-via-hook\b", status)
    disabled = venv.run(["python", "-c", PATCHED], extra_env={"MEGATRON_BACKPORTS": "0"})
    assert _patched(disabled) == ["None"]

    out = _ok(venv.run(["backports", "revert"]))
    assert f"hook: removed {venv.hook}" in out and not venv.hook.exists()
    assert f"hook: none at {venv.hook}" in _ok(venv.run(["backports", "revert"]))
    assert _patched(venv.run(["python", "-c", PATCHED])) == ["None"]


def test_hook_imports_only_the_package_when_megatron_is_never_imported(venv, applied):
    probe = "import sys; print(sorted(m for m in sys.modules if 'backports' in m or m == 'torch'))"
    # The package's __init__ (os and sys only): not the api, not torch.
    expected = "['backports', 'backports.megatron']"
    assert _ok(venv.run(["python", "-c", probe])).strip() == expected
    assert _ok(venv.run(["python", "-c", "pass"])) == ""


# What a job's process must never load: the hook file's writer, the commands and their
# helpers, the authoring and sync tools.
NOT_AT_JOB_START = (
    "backports.megatron.job.hook_file",
    "backports.megatron.job.startup_hook",
    "backports.megatron.cli",
    "backports.megatron.commands",
    "backports.megatron.sync",
    "backports.megatron.authoring",
    "backports.megatron.upstream_tests",
)


def test_megatrons_first_import_loads_neither_the_hook_file_nor_the_commands(venv, applied):
    """The trigger hands megatron's first import a hook named by string: what fires then is
    the api and what it decides with, nothing a command uses."""
    probe = (
        "import sys, megatron.core\n"
        "print(sorted(m for m in sys.modules if m.startswith('backports.')))"
    )
    loaded = ast.literal_eval(_ok(venv.run(["python", "-c", probe])).strip().splitlines()[-1])
    assert "backports.megatron.api" in loaded and "backports.megatron.decision" in loaded
    assert [m for m in loaded if m.startswith(NOT_AT_JOB_START)] == []


def test_status_json_matches_status(venv):
    reports = builtin_rows(json.loads(_ok(venv.run(["backports", "status", "--json"]))))
    in_process = "import json; from backports.megatron import status\n"
    in_process += "print(json.dumps([r.to_dict() for r in status()]))"
    hooks = [r["evidence"].pop("hook") for r in reports]  # the CLI adds the hook's state
    in_its_process = json.loads(_ok(venv.run(["python", "-c", in_process])).splitlines()[-1])
    in_its_process = builtin_rows(in_its_process)
    # Where a verdict came from is each process's own: `python -c` has another sys.path than
    # the CLI, so another verdict-cache key (a miss where the CLI may hit).
    for row in [*reports, *in_its_process]:
        row["evidence"].pop("cache", None)
    assert reports == in_its_process
    assert [(h["path"], h["exists"]) for h in hooks] == [(str(venv.hook), False)] * len(IDS)
    assert [(r["id"], r["verdict"], r["action"]) for r in reports] == [
        (backport_id, "needed", "would-install") for backport_id in IDS
    ]


def test_python_m_backports_megatron_is_the_cli(venv):
    done = venv.run(["python", "-m", "backports.megatron", "status", "--json"])
    assert [r["id"] for r in builtin_rows(json.loads(_ok(done)))] == IDS


_SPAWN = """\
    import multiprocessing as mp
    import sys

    def child(queue):
        import {target} as target
        queue.put(getattr(target.fused_sparse_mla_absorbed, "__backport__", None))

    if __name__ == "__main__":
        from backports.megatron import apply
        apply()  # in the parent: deferred, installs when the parent imports the target
        import {target} as target
        assert target.fused_sparse_mla_absorbed.__backport__ == "{id}"
        queue = mp.get_context("spawn").Queue()
        process = mp.get_context("spawn").Process(target=child, args=(queue,))
        process.start()
        print("patched:", queue.get(timeout=300))
        process.join()
        sys.exit(process.exitcode)
"""


@pytest.mark.parametrize("hook", [True, False], ids=["with-hook", "driver-only"])
def test_spawned_child_is_patched_only_through_the_hook(venv, hook, tmp_path):
    if hook:
        _ok(venv.run(["backports", "apply"]))
    try:
        script = _script(tmp_path, "spawn.py", _SPAWN.format(target=TILELANG_DSA, id=BACKPORT_ID))
        # A patch applied in the driver alone never reaches a new interpreter.
        assert _patched(venv.run(["python", str(script)])) == [BACKPORT_ID if hook else "None"]
    finally:
        venv.run(["backports", "revert"])


_RANK = """\
    import json
    import os
    import torch.distributed as dist

    rank = os.environ["RANK"]
    if rank == os.environ.get("DISABLE_ON_RANK"):
        os.environ["MEGATRON_BACKPORTS"] = "0"  # read when megatron is first imported
    import {target} as target
    from backports.megatron import BackportError, verify_ranks

    dist.init_process_group("gloo")
    result = {{"patched": getattr(target.fused_sparse_mla_absorbed, "__backport__", None)}}
    try:
        result["verified"] = sorted(verify_ranks())
    except BackportError as exc:
        result["raised"] = str(exc)
    dist.destroy_process_group()
    # A file per rank: both ranks share one stdout, where their lines can interleave.
    with open(f"rank-{{rank}}.json", "w") as handle:
        json.dump(result, handle)
"""


def _torchrun(venv, folder: Path, **env: str) -> tuple[list[dict], str]:
    """Each rank's result, and all the job's output (both ranks and the launcher)."""
    script = _script(folder, "rank.py", _RANK.format(target=TILELANG_DSA))
    command = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    extra = {"OMP_NUM_THREADS": "1", **env}
    done = venv.run([*command, str(script)], extra_env=extra, cwd=folder, timeout=600)
    output = _ok(done) + done.stderr
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in (0, 1)], output


def test_torchrun_ranks_are_patched_and_agree(venv, applied, tmp_path, rank_ids):
    ranks, output = _torchrun(venv, tmp_path)
    assert ranks == [{"patched": BACKPORT_ID, "verified": rank_ids}] * 2
    assert "BackportWarning" not in output  # installed: an INFO log line, no warning


def test_torchrun_disabled_on_one_rank_raises_on_every_rank(venv, applied, tmp_path, rank_ids):
    (rank0, rank1), _ = _torchrun(venv, tmp_path, DISABLE_ON_RANK="1")
    assert (rank0["patched"], rank1["patched"]) == (BACKPORT_ID, None)
    assert rank0["raised"] == rank1["raised"]
    message = rank0["raised"]
    assert "differing from rank 0: rank 1." in message
    assert f"rank 0: {rank_ids[0]}" in message and "rank 1: none" in message
    assert all(backport_id in message for backport_id in rank_ids)


def test_torchrun_skip_warns_once_for_the_whole_job(disposable_venv, tmp_path, rank_ids):
    venv = disposable_venv
    _ok(venv.run(["backports", "apply"]))
    # A vendored file edited by hand: every rank finds it incompatible, rank 0 warns.
    vendored = venv.site_packages / "backports/megatron/_vendor/megatron_lm_7617/tilelang_dsa.py"
    vendored.write_text(vendored.read_text() + "# edited\n")
    ranks, output = _torchrun(venv, tmp_path)
    others = sorted(set(rank_ids) - {BACKPORT_ID})  # the other entries are not touched
    assert ranks == [{"patched": None, "verified": others}] * 2
    assert output.count("BackportWarning") == 1
    assert "megatron-lm-7617 not applied (incompatible)" in output


_SPAWN_FOUR = """\
    import multiprocessing as mp

    def child():
        import megatron  # the hook applies here, as in the parent

    if __name__ == "__main__":
        import megatron  # the parent's warning
        context = mp.get_context("spawn")
        children = [context.Process(target=child) for _ in range(4)]
        for process in children:
            process.start()
        for process in children:
            process.join()
        assert [p.exitcode for p in children] == [0] * 4
"""


def test_spawn_children_of_a_process_that_warned_stay_quiet(disposable_venv, tmp_path):
    venv = disposable_venv
    _ok(venv.run(["backports", "apply"]))
    # Every process of the job finds the backport incompatible at megatron's first import.
    vendored = next(venv.site_packages.glob("backports/megatron/_vendor/*/tilelang_dsa.py"))
    vendored.write_text(vendored.read_text() + "# edited\n")
    done = venv.run(["python", str(_script(tmp_path, "spawn4.py", _SPAWN_FOUR))])
    _ok(done)
    # One warning for the job (it was 5: the parent and each of its 4 spawn children).
    assert done.stderr.count("BackportWarning") == 1, done.stderr
    assert done.stderr.count("megatron-lm-7617 not applied (incompatible)") == 1


def _break_activation_module(venv) -> None:
    """A half-upgraded or corrupted install: one of our modules no longer compiles (the
    one the trigger imports at megatron's first lookup)."""
    module = venv.site_packages / "backports" / "megatron" / "job" / "start_up.py"
    module.write_text("def (\n" + module.read_text())


def test_corrupted_install_is_said_in_one_line_and_megatron_imports(disposable_venv):
    venv = disposable_venv
    _ok(venv.run(["backports", "apply"]))
    _break_activation_module(venv)
    done = venv.run(["python", "-c", PATCHED])
    assert _patched(done) == ["None"]  # megatron imported, without the backport
    ours = [line for line in done.stderr.splitlines() if "megatron-backports" in line]
    assert len(ours) == 1 and "SyntaxError" in ours[0], done.stderr
    assert "Traceback" not in done.stderr
    done = venv.run(["python", "-c", "pass"])  # megatron never imported: nothing to say
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_corrupted_install_fails_the_import_under_strict(disposable_venv):
    venv = disposable_venv
    _ok(venv.run(["backports", "apply", "--strict"]))
    _break_activation_module(venv)
    done = venv.run(["python", "-c", PATCHED])
    assert done.returncode != 0 and "SyntaxError" in done.stderr


_CACHE_STATE = f"""\
import json
import {TILELANG_DSA} as target
from backports.megatron.api import last_report

report = last_report("{BACKPORT_ID}")
print("patched:", getattr(target.fused_sparse_mla_absorbed, "__backport__", None))
print("verdict:", report.verdict, "cache:", json.dumps(report.evidence.get("cache")))
"""


def _own_megatron_core(venv) -> Path:
    """A copy of megatron-core 0.19.2 in the venv itself (first on its path), to edit."""
    import importlib.metadata

    import megatron.core

    site = Path(megatron.core.__file__).parents[2]
    shutil.copytree(site / "megatron", venv.site_packages / "megatron")
    dist = importlib.metadata.distribution("megatron-core")
    info = next(site.glob(f"megatron_core-{dist.version}.dist-info"))
    shutil.copytree(info, venv.site_packages / info.name)
    return venv.site_packages / (TILELANG_DSA.replace(".", "/") + ".py")


def test_workers_reuse_the_verdict_until_the_installed_target_changes(disposable_venv):
    venv = disposable_venv
    target = _own_megatron_core(venv)
    _ok(venv.run(["backports", "apply"]))  # probes, and keeps the verdict in the venv
    # One file per backport and environment (the venv's interpreter names it).
    (kept,) = (venv.root / "var" / "cache" / "megatron-backports").glob(f"{BACKPORT_ID}.*.json")
    assert json.loads(kept.read_text())["verdict"] == "needed"
    worker = _ok(venv.run(["python", "-c", _CACHE_STATE]))
    assert f"patched: {BACKPORT_ID}" in worker
    assert f'verdict: needed cache: {{"hit": true, "file": "{kept}"}}' in worker

    # An upgrade in place, or a hand edit: the installed function now has the fix.
    fixed = standins._SOURCE.split("def topk_padding_only")[0]
    fixed = fixed.replace("def fixed_upstream(", "def fused_sparse_mla_absorbed(")
    target.write_text(target.read_text() + "\n\n" + fixed)
    worker = _ok(venv.run(["python", "-c", _CACHE_STATE]))
    assert "patched: None" in worker  # probed again: a stale verdict would have patched it
    # The sniff says fixed, but nothing confirms it (an open pull request's text is not
    # recorded, no git, no release): a hand edit reads "drifted", never "upstream".
    # An incompatible verdict is never kept (it is judged again each time), and the old
    # proof, keyed on the old text, is not served.
    assert 'verdict: incompatible cache: {"hit": false, "file": null}' in worker
    assert json.loads(kept.read_text())["verdict"] == "needed"


def test_leftover_hook_after_uninstall_is_silent(disposable_venv):
    venv = disposable_venv
    _ok(venv.run(["backports", "apply"]))
    # pip removes what it installed; the hook file is not among it.
    _ok(venv.run(["python", "-m", "pip", "uninstall", "-y", "-q", "megatron-backports"]))
    assert venv.hook.exists()
    gone = "import importlib.util as u; print(u.find_spec('backports.megatron'))"
    assert _ok(venv.run(["python", "-c", gone])).strip() == "None"

    done = venv.run(["python", "-c", "pass"])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    done = venv.run(["python", "-c", PATCHED])  # the trigger fires, finds nothing, steps aside
    assert _patched(done) == ["None"]
    assert "backports" not in done.stderr and "Traceback" not in done.stderr
