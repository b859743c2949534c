"""Ray workers: a real local Ray cluster (CPU) whose task and actors import megatron.

The cluster runs in a throwaway venv with this repository pip-installed (tools/training_env.py),
so that its workers are new interpreters of that venv, as in a user's job. Three ways in:
- ``hook``: ``backports apply`` ran in the venv; its start-up hook patches each worker;
- ``setup-hook``: no hook, ``ray.init(runtime_env={"worker_process_setup_hook":
  "backports.megatron.apply"})``: Ray calls ``apply()`` with no arguments in each worker;
- ``neither``: the control; the workers import megatron unpatched.
Two actors have a ``runtime_env`` of their own, merged with the job's: one with
``MEGATRON_BACKPORTS=1`` (it must keep the setup hook), one with ``MEGATRON_BACKPORTS=0``,
which ``verify_actors`` must tell the driver differs. ``verify_sets`` alone: the top tests.
"""

import hashlib
import json
import sys
import textwrap

import pytest

from backports.megatron import BackportError
from backports.megatron.ray_workers import verify_actors, verify_sets
from tests.conftest import BACKPORT_ID, TILELANG_DSA, ids_installed_by_importing
from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import training_env

# Computed here from the file, not taken from the package: what a worker must report.
VENDORED_SHA = hashlib.sha256(
    (training_env.REPO / "vendor" / "megatron_lm_7617" / "tilelang_dsa.py").read_bytes()
).hexdigest()


# ---- verify_sets: comparing what the workers returned ------------------------------------


def test_verify_sets_returns_the_common_set():
    sets = [{BACKPORT_ID: "ab" * 32}, {BACKPORT_ID: "ab" * 32}]
    assert verify_sets(sets) == {BACKPORT_ID: "ab" * 32}
    assert verify_sets([{}, {}, {}]) == {}
    assert verify_sets([]) == {}


def test_verify_sets_names_the_workers_that_differ():
    full = {BACKPORT_ID: "0123456789abcdef" * 4}
    other = {BACKPORT_ID: "fedcba9876543210" * 4}
    with pytest.raises(BackportError) as raised:
        verify_sets([full, full, {}, full, other, {}], noun="actor")
    message = str(raised.value)
    assert message.startswith(
        "megatron-backports differ across Ray actors; differing from actor 0: actors 2,4-5. "
        f"Per actor: actors 0-1,3: {BACKPORT_ID} (0123456789ab); actors 2,5: none; "
        f"actor 4: {BACKPORT_ID} (fedcba987654). "
    )
    assert "worker_process_setup_hook" in message and "\n" not in message


def test_verify_actors_refuses_what_is_not_an_actor():
    pytest.importorskip("ray")
    with pytest.raises(BackportError, match=r"__ray_call__.*verify_sets"):
        verify_actors([object()])


# ---- a real cluster ----------------------------------------------------------------------

_DRIVER = """\
    import json
    import sys

    import ray

    from backports.megatron import BackportError
    from backports.megatron.job.ranks import installed_backports
    from backports.megatron.ray_workers import verify_actors

    TARGET = "{target}"


    def patched():
        import importlib

        target = importlib.import_module(TARGET)
        return getattr(target.fused_sparse_mla_absorbed, "__backport__", None)


    def patched_and_set():
        return patched(), installed_backports()


    @ray.remote(num_cpus=0)  # two CPUs: the actors must not wait for the task
    class Trainer:
        def __init__(self):
            self.patched = patched()  # building the model imports megatron

        def which(self):
            return self.patched


    setup_hook = {{"worker_process_setup_hook": "backports.megatron.apply"}}
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,  # Ray's minimum is 75 MiB
        runtime_env=setup_hook if sys.argv[1] == "setup-hook" else None,
    )
    try:
        task = ray.remote(num_cpus=1)(patched_and_set).remote()
        # An actor's runtime_env is merged with the job's: the second keeps the setup hook.
        on, off = ({{"env_vars": {{"MEGATRON_BACKPORTS": value}}}} for value in ("1", "0"))
        actors = [Trainer.remote(), *(Trainer.options(runtime_env=e).remote() for e in (on, off))]
        task_patched, task_set = ray.get(task, timeout=300)
        result = {{
            "task": task_patched,
            "task_set": task_set,
            "actors": ray.get([actor.which.remote() for actor in actors], timeout=300),
            "agree": verify_actors(actors[:2]),
        }}
        try:
            result["all"] = verify_actors(actors)
        except BackportError as exc:
            result["raised"] = str(exc)
    finally:
        ray.shutdown()
    with open("ray-result.json", "w") as handle:
        json.dump(result, handle)
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> training_env.TrainingEnv:
    pytest.importorskip("ray")
    return training_env.create(tmp_path_factory.mktemp("ray") / "venv")


def _run_cluster(venv, folder, mode: str) -> dict:
    script = folder / "driver.py"
    script.write_text(textwrap.dedent(_DRIVER.format(target=TILELANG_DSA)))
    extra = {"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    done = venv.run(["python", str(script), mode], extra_env=extra, cwd=folder, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads((folder / "ray-result.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hook", "setup-hook", "neither"])
def test_ray_task_and_actors_import_megatron_patched(venv, mode, tmp_path):
    if mode == "hook":
        done = venv.run(["backports", "apply"])
        assert done.returncode == 0, done.stdout + done.stderr
    try:
        result = _run_cluster(venv, tmp_path, mode)
    finally:
        venv.run(["backports", "revert"])
    if mode == "neither":  # without the hook or Ray's setup hook, nothing reaches a worker
        expected = {"task": None, "task_set": {}, "actors": [None] * 3, "agree": {}, "all": {}}
        assert result == expected
        return
    assert result["task"] == BACKPORT_ID
    # The other entries whose targets the worker's megatron import brings in install too.
    assert sorted(result["task_set"]) == ids_installed_by_importing(TILELANG_DSA)
    assert result["task_set"][BACKPORT_ID] == VENDORED_SHA
    assert result["actors"] == [BACKPORT_ID, BACKPORT_ID, None]  # the third: MEGATRON_BACKPORTS=0
    assert result["agree"] == result["task_set"]
    assert "all" not in result
    # Written out here as the message documents it: "id (short sha)", sorted, ", "-joined.
    installed = ", ".join(f"{i} ({sha[:12]})" for i, sha in sorted(result["task_set"].items()))
    assert f"{BACKPORT_ID} ({VENDORED_SHA[:12]})" in installed
    assert result["raised"].startswith(
        "megatron-backports differ across Ray actors; differing from actor 0: actor 2. "
        f"Per actor: actors 0-1: {installed}; actor 2: none. "
    )
