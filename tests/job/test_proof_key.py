"""A job gets the proofs ``backports apply`` kept, however it is started.

``backports apply`` runs as ``<venv>/bin/python3.12`` (its console script) and keeps the
proof of #6964 and #6890, whose sniffs start child interpreters. A job's process computes
the proof key itself (``verdict_cache.key``) and must find the same one started as users
start jobs: ``python``, ``python3``, ``python3.12``, ``-m``, torchrun, through a link to the
venv's folder, from a second venv over the first's packages, and after ``backports apply
--site-dir D`` with a job that adds D. Each job reports, per entry, whether its verdict came
from the stored proof (a hit: the digest of its key matched the file) and what it installed.
One venv, one ``backports apply``, every start shared (slow: the venv and the children).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_environment_plugins
from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import training_env

pytestmark = [pytest.mark.slow, pytest.mark.private_proofs]  # about the proof store

CHILD_SNIFFED = ("megatron-lm-6964", "megatron-lm-6890")

_JOB = """\
import json
import megatron.core.transformer.attention
import megatron.core.fusions.fused_mla_yarn_rope_apply
from backports.megatron.api import last_report

seen = {}
for backport_id in ("megatron-lm-6964", "megatron-lm-6890"):
    report = last_report(backport_id)
    seen[backport_id] = None if report is None else {
        "verdict": str(report.verdict),
        "action": str(report.action),
        "cache": report.evidence.get("cache"),
        "reason": report.reason,
    }
print("SEEN " + json.dumps(seen))
"""


@pytest.fixture(scope="module")
def applied(tmp_path_factory) -> tuple[training_env.TrainingEnv, Path, dict[str, str]]:
    """A venv where ``backports apply`` proved every entry; the store folder, and the key
    digest of each child-sniffed entry's stored proof."""
    root = tmp_path_factory.mktemp("proof-key")
    venv = training_env.create(root / "venv", always=skip_environment_plugins())
    done = venv.run(["backports", "apply"], timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    for backport_id in CHILD_SNIFFED:
        assert re.search(rf"{backport_id}\s.*\bneeded\s+installed\b", done.stdout), done.stdout
    store = venv.root / "var" / "cache" / "megatron-backports"
    return venv, store, _stored(store)


def _stored(store: Path) -> dict[str, str]:
    found = {}
    for backport_id in CHILD_SNIFFED:
        (path,) = store.glob(f"{backport_id}.*.json")
        found[backport_id] = json.loads(path.read_text())["key"]
    return found


def _job(venv, command: list[str], cwd: Path, **env: str) -> dict:
    done = subprocess.run(
        command,
        env=venv.env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("SEEN ")]
    assert lines, done.stdout + done.stderr
    return json.loads(lines[-1][5:])


def _assert_served(seen: dict, store: Path, stored_before: dict[str, str]) -> None:
    """Every child-sniffed entry installed from the proof ``backports apply`` stored (the
    same key: a hit on its file), and that file left as it was (no job proved again)."""
    for backport_id in CHILD_SNIFFED:
        report = seen[backport_id]
        assert report is not None, f"{backport_id}: never decided"
        (path,) = store.glob(f"{backport_id}.*.json")
        assert report["cache"] == {"hit": True, "file": str(path)}, report
        assert (report["verdict"], report["action"]) == ("needed", "installed"), report
    assert _stored(store) == stored_before


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    """A job's own folder: train.py, and jobmod.py for ``-m``."""
    folder = tmp_path_factory.mktemp("job")
    (folder / "train.py").write_text(_JOB)
    (folder / "jobmod.py").write_text(_JOB)
    return folder


@pytest.mark.parametrize("name", ["python", "python3", "python3.12"])
def test_the_interpreter_by_any_name(applied, scripts, name):
    venv, store, stored = applied
    python = venv.root / "bin" / name
    assert python.exists()
    _assert_served(_job(venv, [str(python), "train.py"], scripts), store, stored)


def test_python_dash_m(applied, scripts):
    venv, store, stored = applied
    _assert_served(_job(venv, [str(venv.python), "-m", "jobmod"], scripts), store, stored)


def test_through_a_link_to_the_venv_folder(applied, scripts, tmp_path):
    venv, store, stored = applied
    link = tmp_path / "current"
    link.symlink_to(venv.root, target_is_directory=True)
    seen = _job(venv, [str(link / "bin" / "python"), str(scripts / "train.py")], tmp_path)
    _assert_served(seen, store, stored)


def test_a_second_venv_over_the_first_ones_packages(applied, scripts, tmp_path):
    """A venv of its own whose .pth adds the first venv's site-packages as a site dir (its
    .pth files run: the hook and the path line)."""
    venv, store, stored = applied
    second = tmp_path / "second"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(second)], check=True)
    (site,) = (second / "lib").glob("python*/site-packages")
    line = f"import site; site.addsitedir({str(venv.site_packages)!r})\n"
    (site / "over_first.pth").write_text(line)
    seen = _job(venv, [str(second / "bin" / "python"), str(scripts / "train.py")], tmp_path)
    _assert_served(seen, store, stored)


def test_torchrun(applied, scripts, tmp_path):
    venv, store, stored = applied
    command = [str(venv.python), "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "1", str(scripts / "train.py")]
    seen = _job(venv, command, tmp_path, OMP_NUM_THREADS="1")
    _assert_served(seen, store, stored)


def test_a_hook_in_a_site_dir_the_job_adds(applied, scripts, tmp_path):
    """``backports apply --site-dir D`` (here the only hook), a job that adds D."""
    venv, store, stored = applied
    site_dir = tmp_path / "hook-site"
    site_dir.mkdir()
    assert venv.run(["backports", "revert"]).returncode == 0
    try:
        done = venv.run(["backports", "apply", "--site-dir", str(site_dir)], timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        script = scripts / "with_site_dir.py"
        adds = f"import site; site.addsitedir({str(site_dir)!r})\n"
        script.write_text(adds + _JOB)
        _assert_served(_job(venv, [str(venv.python), str(script)], tmp_path), store, stored)
    finally:
        venv.run(["backports", "revert", "--site-dir", str(site_dir)])
        venv.run(["backports", "apply"], timeout=900)


def test_the_stored_key_names_the_real_interpreter(applied):
    """What the key covers is written beside it: the real binary, not the venv's link."""
    venv, store, _ = applied
    (path,) = store.glob("megatron-lm-6964.*.json")
    real = json.loads(path.read_text())["fingerprint"]["python"][0]
    assert real == os.path.realpath(venv.python) and not Path(real).is_relative_to(venv.root)
