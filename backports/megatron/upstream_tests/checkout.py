"""Upstream's test files at one commit of a Megatron-LM clone, written into a folder.

Reads the clone with the ``git`` program alone (no gitpython): the GPU hosts that run
``backports upstream-tests`` have git but no package index, and a shallow clone unpacked
from a bundle (``tools/upstream_bundle.py``) is all they hold. Every failure is one
``BackportError`` line that says what to do; git's own words appear only where they are
the news (an unreadable repository), never a Python repr.
"""

import os
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from ..errors import BackportError


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise BackportError("upstream-tests needs the git program on PATH")
    # Never a repository above --repo: a plain folder inside some other checkout is not a
    # Megatron-LM clone, whatever git would find by walking up.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(repo.parent)}
    return subprocess.run(
        [git, "-C", str(repo), *args], input=stdin, capture_output=True, env=env, check=False
    )


def _first_line(raw: bytes) -> str:
    lines = [line.strip() for line in raw.decode("utf-8", "replace").splitlines()]
    return next((line for line in lines if line), "")


def resolve_commit(repo: Path, sha: str) -> str:
    """The full SHA of ``sha`` in the clone at ``repo``."""
    if not repo.is_dir():
        raise BackportError(f"--repo {repo}: no such folder (point it at a Megatron-LM clone)")
    found = _git(repo, "rev-parse", "--git-dir")
    if found.returncode != 0:
        why = _first_line(found.stderr)
        if "not a git repository" in why:
            raise BackportError(
                f"--repo {repo} is not a git repository (point it at a Megatron-LM clone)"
            )
        raise BackportError(f"--repo {repo}: git cannot read it: {why}")
    if sha.startswith("-"):
        raise BackportError(f"--sha {sha}: not a commit")
    done = _git(repo, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}")
    if done.returncode != 0:
        raise BackportError(
            f"{repo} has no commit {sha} (fetch it into that clone first: "
            f"git -C {repo} fetch origin {sha})"
        )
    return done.stdout.decode().strip()


def files_for_tests(repo: Path, commit: str, tests: list[str]) -> list[str]:
    """The test files, and every .py file of the test trees they sit in (helpers such as
    ``tests/unit_tests/test_utilities.py``, conftests, packages' ``__init__``)."""
    roots = sorted({PurePosixPath(test.split("::")[0]).parts[0] for test in tests})
    done = _git(repo, "ls-tree", "-r", "-z", "--name-only", commit, "--", *roots)
    if done.returncode != 0:
        raise BackportError(
            f"cannot list {', '.join(roots)} at {commit}: {_first_line(done.stderr)}"
        )
    paths = [p for p in done.stdout.decode("utf-8", "replace").split("\0") if p]
    for path in paths:
        _refuse_odd(path, commit)
    wanted = [p for p in paths if p.endswith(".py")]
    for test in tests:
        if test.split("::")[0] not in wanted:
            raise BackportError(f"{test.split('::')[0]} does not exist at {commit}")
    return wanted


def _refuse_odd(path: str, commit: str) -> None:
    """A tree entry git itself never writes (``..``, ``.``, an empty or absolute name): a
    crafted clone, whose checkout would write outside its folder. Refused before anything
    is written."""
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise BackportError(
            f"the tree at {commit[:12]} holds the path {path!r}, which would write outside the "
            "test folder: a crafted clone, refused (nothing written)"
        )


def _blobs(repo: Path, commit: str, paths: list[str]) -> list[bytes]:
    """Each path's content at ``commit``, in order: one ``git cat-file --batch`` for all."""
    request = "".join(f"{commit}:{path}\n" for path in paths).encode()
    done = _git(repo, "cat-file", "--batch", stdin=request)
    if done.returncode != 0:
        raise BackportError(f"cannot read the test files at {commit}: {_first_line(done.stderr)}")
    out, at, contents = done.stdout, 0, []
    for path in paths:
        header_end = out.index(b"\n", at)
        fields = out[at:header_end].split()
        if len(fields) != 3 or fields[1] != b"blob":
            raise BackportError(f"cannot read {path} at {commit}")
        size = int(fields[2])
        contents.append(out[header_end + 1 : header_end + 1 + size])
        at = header_end + 1 + size + 1  # the content, then one newline
    return contents


def check_out(repo: Path, commit: str, paths: list[str], folder: Path) -> None:
    """Write ``paths`` as they are at ``commit`` under ``folder``."""
    root = folder.resolve()
    for path, content in zip(paths, _blobs(repo, commit, paths), strict=True):
        _refuse_odd(path, commit)
        target = folder / path
        if not target.resolve().is_relative_to(root):  # a folder above made a link
            raise BackportError(f"{path} would be written outside {folder}: refused")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
