"""The proof store where a job cannot write it: read-only, or written by root in an image.

``backports apply`` keeps a proof; a job's process reads it. A store the job can read but
not write (a read-only image, Apptainer, a shared venv) is read; one ``backports apply``
wrote inside the environment as root (an image) or as the environment's owner (a shared
venv) serves a job run as another user, unless other users could write it. Where no proof
exists, the ranks of a node prove it once, under a lock. (Jobs started in real venvs, every
way users start them: test_proof_key.)
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from backports.megatron import Action, Verdict, apply, revert
from backports.megatron.catalog import by_id
from backports.megatron.decision import verdict_cache
from tests.conftest import BACKPORT_ID

pytestmark = pytest.mark.private_proofs  # tests of the proof store: their own store, or none

SPEC = by_id(BACKPORT_ID)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="files owned by root need root")


@pytest.fixture
def store_on(monkeypatch):
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.delenv("MEGATRON_BACKPORTS_CACHE_DIR", raising=False)


def _prove(folders: list[Path], monkeypatch) -> Path:
    """``backports apply``'s proof for #7617, kept in ``folders[0]``."""
    monkeypatch.setattr(verdict_cache, "locations", lambda: list(folders))
    (report,) = apply(BACKPORT_ID)
    revert(BACKPORT_ID)
    assert report.evidence["cache"]["hit"] is False
    kept = folders[0] / verdict_cache.file_name(SPEC)
    assert report.evidence["cache"]["file"] == str(kept)
    return kept


def _job_reads(kept: Path) -> None:
    (report,) = apply(BACKPORT_ID)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
    assert report.evidence["cache"] == {"hit": True, "file": str(kept)}


def _read_only(monkeypatch, folder: Path) -> None:
    """``folder`` as a job sees a read-only image: readable, never writable (root ignores
    the mode bits, so ``os.access`` says what an unprivileged job would be told)."""
    folder.chmod(0o555)
    real = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == folder and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def test_a_read_only_store_is_read(tilelang_dsa, store_on, monkeypatch, tmp_path):
    image, home = tmp_path / "image-store", tmp_path / "home-cache"
    kept = _prove([image, home], monkeypatch)
    _read_only(monkeypatch, image)
    try:
        _job_reads(kept)
    finally:
        image.chmod(0o755)


def test_a_read_only_store_without_the_proof_lets_the_job_keep_its_own(
    tilelang_dsa, store_on, monkeypatch, tmp_path
):
    """The job's own proof goes to the folder it can write, and is read from there next."""
    image, home = tmp_path / "image-store", tmp_path / "home-cache"
    image.mkdir()
    _read_only(monkeypatch, image)
    monkeypatch.setattr(verdict_cache, "locations", lambda: [image, home])
    try:
        (first,) = apply(BACKPORT_ID)
        revert(BACKPORT_ID)
        assert first.evidence["cache"]["file"] == str(home / verdict_cache.file_name(SPEC))
        _job_reads(home / verdict_cache.file_name(SPEC))
    finally:
        image.chmod(0o755)


@pytest.fixture
def image(monkeypatch, tmp_path) -> Path:
    """An environment (``sys.prefix``) whose store ``backports apply`` filled as root."""
    prefix = tmp_path / "image" / "usr" / "local"
    prefix.mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    return prefix


def _as_another_user(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 4242)


@needs_root
@pytest.mark.parametrize("owner", ["root", "the-venvs-admin"])
def test_a_store_written_inside_the_environment_serves_another_user(
    tilelang_dsa, store_on, monkeypatch, image, tmp_path, owner
):
    """An image built as root, or a shared venv its admin (uid 1000) installed and applied."""
    store = image / "var" / "cache" / "megatron-backports"
    kept = _prove([store, tmp_path / "home-cache"], monkeypatch)
    os.chmod(store, 0o755)  # as `mkdir` leaves it under the usual umask
    assert kept.stat().st_mode & 0o777 == 0o644  # readable by every user, as written
    if owner != "root":
        for path in (image, store, kept):
            os.chown(path, 1000, -1)
    _as_another_user(monkeypatch)
    _job_reads(kept)


@needs_root
@pytest.mark.parametrize("spoil", ["folder-group-writable", "file-group-writable", "outside"])
def test_a_root_store_other_users_could_write_is_refused(
    tilelang_dsa, store_on, monkeypatch, image, tmp_path, spoil
):
    inside = image / "var" / "cache" / "megatron-backports"
    store = tmp_path / "elsewhere" if spoil == "outside" else inside
    kept = _prove([store, tmp_path / "home-cache"], monkeypatch)
    os.chmod(store, 0o775 if spoil == "folder-group-writable" else 0o755)
    os.chmod(kept, 0o664 if spoil == "file-group-writable" else 0o644)
    _as_another_user(monkeypatch)
    with pytest.warns(UserWarning, match="not using the proof store"):
        (report,) = apply(BACKPORT_ID)
    assert report.evidence["cache"]["hit"] is False


def test_the_ranks_of_a_node_prove_one_at_a_time(store_on, monkeypatch, tmp_path):
    """The second process waits while the first proves, then goes on (and reads its proof)."""
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(tmp_path / "store"))
    entered: list[float] = []

    def second() -> None:
        with verdict_cache.proving(SPEC) as held:
            assert held
            entered.append(time.monotonic())

    with verdict_cache.proving(SPEC) as held:
        assert held
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        assert entered == []  # still waiting
        released = time.monotonic()
    thread.join(10)
    assert len(entered) == 1 and entered[0] >= released


_RANK = """
import json
from backports.megatron import api
(report,) = api.apply_in_job(("megatron-lm-6964",))
print("SEEN " + json.dumps({"action": str(report.action), "cache": report.evidence.get("cache")}))
"""


@pytest.mark.slow
def test_two_ranks_started_together_without_a_proof_prove_it_once(tmp_path):
    """Two processes of a job, no proof: one runs #6964's children, the other waits for it
    and installs from its proof."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    environ.update(MEGATRON_BACKPORTS_CACHE="1", MEGATRON_BACKPORTS_CACHE_DIR=str(tmp_path / "s"))
    environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK],
            env=environ,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    seen = []
    for rank in ranks:
        out, err = rank.communicate(timeout=600)
        assert rank.returncode == 0, err[-2000:]
        (line,) = [line for line in out.splitlines() if line.startswith("SEEN ")]
        seen.append(json.loads(line[5:]))
    assert [s["action"] for s in seen] == ["installed", "installed"], seen
    assert sorted(s["cache"]["hit"] for s in seen) == [False, True], seen
