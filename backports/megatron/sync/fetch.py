"""Step one of a sync: bring the commit into a bare cache clone of the upstream repository.

The clone lives under the user's cache directory (``$XDG_CACHE_HOME/megatron-backports/
upstream/``); git runs through gitpython, never a shell, and never with an argument git
could take for an option.

The one SHA rule of ``backports sync --sha`` and ``backports new --sha`` (``SHA_RULE``): 4 to
40 hex digits; a short one stands for the one commit whose id starts with it in the
repository (with ``--pr N``, fetched with the pull request's head), and is written out in
full wherever it is recorded. Two commits that share the prefix are refused, never guessed.
"""

import contextlib
import hashlib
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import FetchError, RevisionError, UsageError

SHA_RULE = "4 to 40 hex digits; a unique prefix is written out in full"
_SHA = re.compile(r"[0-9a-fA-F]{4,40}")

CACHE_SUBDIR = Path("megatron-backports") / "upstream"
# Variables that would point git at some other repository than the cache clone.
_GIT_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


def checked_sha(sha: str) -> str:
    """``sha`` as the rule takes it (lowercase); a ``UsageError`` naming ``--sha`` if not."""
    if not _SHA.fullmatch(sha):
        raise UsageError(f"--sha must be 4 to 40 hex digits, not {sha!r}")
    return sha.lower()


def cache_dir() -> Path:
    """The user's cache directory: ``$XDG_CACHE_HOME``, else the platform's usual place."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"])
    return Path.home() / ".cache"


def repo_location(repo: str) -> str:
    """A URL as given, or a local path made absolute (git runs inside the cache clone)."""
    if repo.startswith("-") or re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*::", repo):
        raise UsageError(f"--repo {repo!r} is neither a URL nor a path git should fetch from")
    if "://" in repo or re.match(r"[\w.-]+@[\w.-]+:", repo):
        return repo
    return str(Path(repo).expanduser().resolve())


def _cache_path(url: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").rsplit("/", 1)[-1])
    stem = stem.removesuffix(".git") or "repo"
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:12]
    return cache_dir() / CACHE_SUBDIR / f"{stem}-{digest}.git"


def _git() -> Any:
    try:
        import git
    except ImportError as exc:
        raise UsageError("syncing needs gitpython: pip install 'megatron-backports[git]'") from exc
    return git


@contextlib.contextmanager
def cache_clone(url: str) -> Iterator[Any]:
    """The bare cache clone for ``url`` (a ``git.Repo``). One this run created is removed
    again if the run fails before anything was fetched into it: no empty clones."""
    git = _git()
    for var in _GIT_LOCATION_VARS:
        os.environ.pop(var, None)
    path = _cache_path(url)
    created = not (path / "HEAD").is_file()
    try:
        if created:
            path.mkdir(parents=True, exist_ok=True)
            repo = git.Repo.init(path, bare=True)
        else:
            repo = git.Repo(path)
        repo.git.update_environment(GIT_TERMINAL_PROMPT="0")
        repo.git.config("remote.origin.url", url)
    except (git.GitError, OSError) as exc:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise FetchError(f"cannot set up the cache clone {path}: {exc}") from exc
    try:
        yield repo
    except BaseException:
        if created and not _has_objects(path):
            shutil.rmtree(path, ignore_errors=True)
        raise


def _has_objects(path: Path) -> bool:
    objects = path / "objects"
    return any(
        entry.name not in ("info", "pack") or any(entry.iterdir())
        for entry in objects.iterdir()
        if entry.is_dir()
    )


def _git_fetch(repo: Any, *refspecs: str) -> None:
    # The repository is the configured remote, never an argument git could take for an
    # option; the refspecs are built here from hex and integers only.
    repo.git.fetch("--quiet", "--no-tags", "--", "origin", *refspecs)


def _fetch_failure(exc: Exception) -> str:
    """Git's whole message, on one line: every ``fatal:`` and the hint after it."""
    stderr = str(getattr(exc, "stderr", "") or exc).strip()
    stderr = stderr.removeprefix("stderr:").strip()
    if len(stderr) > 1 and stderr[0] == stderr[-1] == "'":
        stderr = stderr[1:-1]  # gitpython quotes what git wrote
    sentences: list[str] = []
    for line in (line.strip() for line in stderr.splitlines()):
        if not line:
            continue
        text = re.sub(r"^(fatal|error|warning):\s*", "", line)
        if sentences and text == line and not sentences[-1].endswith((".", "!", "?")):
            sentences[-1] += " " + text  # a hint wrapped over several lines
        else:
            sentences.append(text)
    ended = [s if s.endswith((".", "!", "?")) else s + "." for s in sentences]
    return " ".join(ended) or "git fetch failed"


def fetch(repo: Any, url: str, sha: str | None, pr: int | None) -> None:
    """Bring ``sha`` into the cache: with the PR's head ref, by SHA, or with the branches."""
    git = _git()
    if pr is not None:
        ref = f"refs/pull/{pr}/head"
        try:
            _git_fetch(repo, f"+{ref}:{ref}")
        except git.GitCommandError as exc:
            raise FetchError(f"cannot fetch {ref} from {url}: {_fetch_failure(exc)}") from exc
        return
    assert sha is not None
    if len(sha) == 40:
        if _commits_with_prefix(repo, sha):
            return  # already here: no network needed
        try:
            _git_fetch(repo, f"+{sha}:refs/sync/{sha}")
            return
        except git.GitCommandError:
            pass  # servers may refuse unadvertised SHAs; the branches may still have it
    try:
        _git_fetch(repo, "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*")
    except git.GitCommandError as exc:
        raise FetchError(f"cannot fetch from {url}: {_fetch_failure(exc)}") from exc


def _commits_with_prefix(repo: Any, prefix: str) -> list[str]:
    git = _git()
    try:
        found = repo.git.rev_parse(f"--disambiguate={prefix.lower()}").split()
    except git.GitCommandError:
        return []
    return [oid for oid in found if repo.git.cat_file("-t", oid) == "commit"]


def resolve_commit(repo: Any, sha: str | None, url: str, pr: int | None) -> Any:
    """The one commit whose id starts with ``sha`` (a ``git.Commit``); without ``sha``, the
    head of the pull request ``pr``."""
    if sha is None:
        assert pr is not None
        return repo.commit(f"refs/pull/{pr}/head")
    commits = _commits_with_prefix(repo, sha)
    if not commits and pr is not None:
        raise RevisionError(f"no commit {sha} on refs/pull/{pr}/head of {url}")
    if not commits:
        hint = "" if len(sha) == 40 else "; a commit only on a pull request needs --pr N"
        raise RevisionError(f"no commit {sha} in {url}{hint}")
    if len(commits) > 1:
        listed = ", ".join(sorted(commits))
        raise RevisionError(f"{sha} is ambiguous in {url}: {listed}; give more digits")
    return repo.commit(commits[0])


def expand_sha(repo: str, sha: str, pr: int | None) -> str:
    """The full id of the one commit ``sha`` (checked) starts with in ``repo`` (a URL or a
    path; with ``pr``, on the pull request's head ref), fetched into the cache clone."""
    sha = checked_sha(sha)
    url = repo_location(repo)
    with cache_clone(url) as clone:
        fetch(clone, url, sha, pr)
        return str(resolve_commit(clone, sha, url, pr).hexsha)
