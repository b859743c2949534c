"""tools/upstream_bundle.py: a depth-1 bundle of the recorded commits, and its unpacking.

The clone is built here with gitpython: three commits, the test files at the middle one.
What ``upstream-tests`` reads of the unpacked repository is checked with its own reader
(backports.megatron.upstream_tests.checkout), and the slow test runs #6114's tests from it.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import git
import pytest

from backports.megatron import cli
from backports.megatron.upstream_tests import checkout as upstream_checkout
from tests.paths import ROOT
from tests.sync.upstreams import commit_files
from tests.upstream_tests.test_upstream_tests import HELPER, NODE, TEST, private_tmp  # noqa: F401

sys.path.insert(0, str(ROOT / "tools"))
import upstream_bundle

pytestmark = pytest.mark.usefixtures("private_tmp")  # temporary folders in the test's own
TEST_FILE = NODE.split("::")[0]
# 1.2 MB of history the bundle must leave behind (random: git's compression cannot shrink it
# below half).
BIG = random.Random(0).randbytes(600_000).hex()


def _clone(tmp_path: Path) -> tuple[Path, list[str]]:
    """A clone with three commits: history, the tests, a later change. Returns the SHAs."""
    path = tmp_path / "Megatron-LM"
    repo = git.Repo.init(path)
    first = commit_files(repo, {"megatron/old.py": BIG}, "history", None)
    tests = {
        "megatron/old.py": None,
        "tests/__init__.py": "",
        "tests/unit_tests/__init__.py": "",
        "tests/unit_tests/test_utilities.py": HELPER,
        TEST_FILE: TEST,
    }
    second = commit_files(repo, tests, "tests", first)
    third = commit_files(repo, {"README": "later\n"}, "later", second)
    return path, [first, second, third]


def _bundle_and_unpack(tmp_path: Path, names: list[str]) -> tuple[Path, Path, dict[str, str]]:
    clone, _ = _clone(tmp_path)
    bundle = tmp_path / "carry" / "mlm.bundle"
    upstream_bundle.create(str(clone), names, bundle)
    dest = tmp_path / "device" / "mlm.git"
    return bundle, dest, upstream_bundle.unpack(bundle, dest)


def test_the_unpacked_bundle_holds_the_commit_and_not_its_history(tmp_path: Path) -> None:
    _, shas = _clone(tmp_path)
    bundle, dest, heads = _bundle_and_unpack(tmp_path, [shas[1]])
    assert heads == {f"refs/backports/{shas[1]}": shas[1]}
    assert bundle.stat().st_size < 100_000  # the 1.2 MB file of the first commit stayed behind
    log = subprocess.run(
        ["git", "-C", str(dest), "rev-list", shas[1]], capture_output=True, text=True, check=True
    )
    assert log.stdout.split() == [shas[1]]  # shallow: no parent, and git does not ask for one
    fsck = subprocess.run(["git", "-C", str(dest), "fsck", "--connectivity-only"], check=False)
    assert fsck.returncode == 0


def test_upstream_tests_reads_the_unpacked_repository_as_a_clone(tmp_path: Path) -> None:
    _, shas = _clone(tmp_path)
    _, dest, _ = _bundle_and_unpack(tmp_path, [shas[1]])
    commit = upstream_checkout.resolve_commit(dest, shas[1][:10])
    assert commit == shas[1]
    paths = upstream_checkout.files_for_tests(dest, commit, [NODE])
    helper = "tests/unit_tests/test_utilities.py"
    assert sorted(paths) == sorted(
        ["tests/__init__.py", "tests/unit_tests/__init__.py", TEST_FILE, helper]
    )
    upstream_checkout.check_out(dest, commit, paths, tmp_path / "out")
    assert (tmp_path / "out" / TEST_FILE).read_text() == TEST
    with pytest.raises(upstream_checkout.BackportError, match=f"has no commit {shas[2]}"):
        upstream_checkout.resolve_commit(dest, shas[2])  # only what was bundled travels


def test_ids_bundle_the_commit_upstream_tests_takes_the_tests_from() -> None:
    assert upstream_bundle.recorded_commit("megatron-lm-5077") == (
        "32a03b77c560f5f90115d49b59e4f1809a34726f"  # its merge_sha, not its head_sha
    )
    assert upstream_bundle.recorded_commit("megatron-lm-7617") == (
        "3d07347181ae6d34ab7d381b586a81b39a2e6c23"  # no merge_sha: the head
    )
    with pytest.raises(upstream_bundle.BundleError, match="megatron-lm-1: no "):
        upstream_bundle.recorded_commit("megatron-lm-1")


def test_a_bundle_over_the_limit_is_refused_and_not_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clone, shas = _clone(tmp_path)
    out = tmp_path / "mlm.bundle"
    args = ["create", "--repo", str(clone), "--out", str(out), shas[0], "--max-mb", "0.5"]
    assert upstream_bundle.main(args) == 1
    assert "MB is over --max-mb 0.5; not kept" in capsys.readouterr().err
    assert not out.exists()


def test_unpack_refuses_a_folder_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "file").write_text("mine")
    args = ["unpack", "--bundle", str(tmp_path / "b"), "--dest", str(tmp_path / "dest")]
    assert upstream_bundle.main(args) == 2
    err = capsys.readouterr().err
    assert err == f"upstream_bundle: {tmp_path / 'dest'} exists and is not empty\n"


@pytest.mark.slow
def test_upstream_tests_run_from_an_unpacked_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, shas = _clone(tmp_path)
    _, dest, _ = _bundle_and_unpack(tmp_path, [shas[1]])
    code = cli.main(["upstream-tests", "megatron-lm-6114", "--repo", str(dest), "--sha", shas[1]])
    out = capsys.readouterr().out
    assert f"{NODE}[True]  failed / passed" in out
    assert code == 0, out
