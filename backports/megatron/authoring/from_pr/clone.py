"""The user's Megatron-LM clone, read through gitpython: refs, commits, blobs, diffs.

Read only, offline: nothing is fetched. Git runs with the repository given and never with
an argument git could take for an option (SHAs and ref names are checked before use).
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadInput, Reason, Refused

_SHA = re.compile(r"[0-9a-f]{40}")
_PULL_HEAD = re.compile(r"refs/pull/(\d+)/head")
_BLAME_HEADER = re.compile(r"^([0-9a-f]{40}) \d+ \d+", re.MULTILINE)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
# Where a clone keeps main: a mirror (bare) or a working clone of it.
_MAIN_REFS = ("refs/heads/main", "refs/remotes/origin/main", "refs/heads/master")
# The largest file of megatron/ at main's tip (2026-08) is 265 kB; parsing one costs about
# 60 times its size in memory. A bigger "source file" is refused before it is read.
MAX_SOURCE_BYTES = 2 * 1024 * 1024
# Variables that would point git at another repository than the one given.
_GIT_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


@dataclass(frozen=True)
class Hunk:
    """One ``-U0`` hunk: lines ``old_start..`` (``old_count`` of them) became ``new_...``."""

    old_start: int
    old_count: int
    new_start: int
    new_count: int

    def old_lines(self) -> range:
        return range(self.old_start, self.old_start + self.old_count)

    def new_lines(self) -> range:
        return range(self.new_start, self.new_start + self.new_count)


@dataclass
class Clone:
    path: Path
    repo: Any  # git.Repo

    @property
    def git(self) -> Any:
        return self.repo.git

    def ref_sha(self, ref: str) -> str | None:
        """The commit a ref names, or None when there is no such ref."""
        try:
            sha = str(self.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")).strip()
        except Exception:
            return None
        return sha if _SHA.fullmatch(sha) else None

    def is_commit(self, sha: str) -> bool:
        if not _SHA.fullmatch(sha):
            return False
        try:
            return str(self.git.cat_file("-t", sha)).strip() == "commit"
        except Exception:
            return False

    def main_ref(self) -> str:
        for ref in _MAIN_REFS:
            if self.ref_sha(ref) is not None:
                return ref
        raise BadInput(f"{self.path} has no main branch ({', '.join(_MAIN_REFS)})")

    def pull_numbers(self) -> list[int]:
        """Every N with a ``refs/pull/N/head`` in the clone, ascending."""
        out = str(self.git.for_each_ref("--format=%(refname)", "refs/pull/"))
        return sorted(int(m.group(1)) for m in map(_PULL_HEAD.fullmatch, out.split()) if m)

    def commits_naming(self, text: str) -> list[tuple[str, str]]:
        """(sha, subject) of every commit reachable from any ref whose message holds ``text``."""
        out = str(
            self.git.log("--all", "--fixed-strings", f"--grep={text}", "--format=%H %s", "--")
        )
        return [(line[:40], line[41:]) for line in out.splitlines() if _SHA.match(line)]

    def is_ancestor(self, sha: str, ref: str) -> bool:
        try:
            self.git.merge_base("--is-ancestor", sha, ref)
        except Exception:
            return False
        return True

    def on_first_parent_line(self, sha: str, ref: str) -> bool:
        """Whether ``sha`` is one of ``ref``'s own commits (its first-parent chain): a squash
        or merge commit landed there, not a commit of a branch merged into it."""
        if not _SHA.fullmatch(sha):
            return False
        try:
            out = str(self.git.rev_list("--first-parent", ref, "--not", f"{sha}^@", "--"))
        except Exception:
            return False
        return sha in out.split()

    def last_changed(self, sha: str, path: str, first: int, last: int) -> list[str]:
        """The commits that last changed lines ``first..last`` of ``path`` at ``sha`` (git
        blame), newest first, each once; [] where blame cannot tell."""
        if not _SHA.fullmatch(sha) or path.startswith("-") or not 0 < first <= last:
            return []
        try:
            out = str(self.git.blame("--porcelain", "-L", f"{first},{last}", sha, "--", path))
        except Exception:
            return []
        found = dict.fromkeys(m.group(1) for m in _BLAME_HEADER.finditer(out))
        return sorted(found, key=lambda c: -int(self.repo.commit(c).committed_date))

    def merge_base(self, a: str, b: str) -> str | None:
        try:
            sha = str(self.git.merge_base(a, b)).strip()
        except Exception:
            return None
        return sha if _SHA.fullmatch(sha) else None

    def parents(self, sha: str) -> list[str]:
        return [p.hexsha for p in self.repo.commit(sha).parents]

    def subject(self, sha: str) -> str:
        return str(self.repo.commit(sha).summary)

    def text(self, sha: str, path: str) -> str | None:
        """The file at ``path`` in commit ``sha`` (UTF-8), or None when it is not there."""
        try:
            blob = self.repo.commit(sha).tree / path
        except KeyError:
            return None
        if blob.type != "blob":
            return None
        if blob.size > MAX_SOURCE_BYTES:
            raise Refused(
                f"{path} at {sha[:12]} is {blob.size / 2**20:.1f} MB, over the "
                f"{MAX_SOURCE_BYTES // 2**20} MB a source file --from-pr reads may have",
                Reason.UNREADABLE,
            )
        return str(blob.data_stream.read().decode("utf-8", errors="replace"))

    def changed_files(self, old: str, new: str) -> list[tuple[str | None, str | None]]:
        """(old path, new path) of each file the diff touches; None where added/removed."""
        out = str(self.git.diff("--name-status", "-M", "--no-color", old, new, "--"))
        changes: list[tuple[str | None, str | None]] = []
        for line in out.splitlines():
            status, *paths = line.split("\t")
            if status.startswith("R") and len(paths) == 2:
                changes.append((paths[0], paths[1]))
            elif status.startswith("A"):
                changes.append((None, paths[0]))
            elif status.startswith("D"):
                changes.append((paths[0], None))
            elif paths:
                changes.append((paths[0], paths[0]))
        return changes

    def hunks(self, old: str, new: str, old_path: str, new_path: str) -> list[Hunk]:
        """The ``-U0`` hunks of one file between two commits."""
        out = str(
            self.git.diff("-U0", "--no-color", f"{old}:{old_path}", f"{new}:{new_path}", "--")
        )
        hunks = []
        for match in _HUNK.finditer(out):
            a, b, c, d = match.groups()
            hunks.append(Hunk(int(a), int(b or 1), int(c), int(d or 1)))
        return hunks

    def origin_url(self) -> str:
        """Where the clone came from, as UPSTREAM.toml records it: the first network URL
        along the chain of ``origin`` remotes (a mirror's clone names the mirror), without
        credentials, else ``NVIDIA/Megatron-LM``: never a path of this machine (a plugin
        is shared; the author's folders are no one else's business)."""
        here: Path | None = self.path
        for _ in range(3):
            if here is None:
                break
            url = _config(here, "remote.origin.url")
            if url is None:
                break
            if url.startswith("file://"):
                url = url.removeprefix("file://")
            elif "://" in url or re.match(r"[\w.-]+@[\w.-]+:", url):
                return _without_credentials(url)
            candidate = Path(url)
            here = candidate if candidate.is_absolute() and candidate.exists() else None
        return UPSTREAM


UPSTREAM = "NVIDIA/Megatron-LM"  # what a clone with no network origin is taken to be


def _without_credentials(url: str) -> str:
    """``https://user:token@host/x`` as ``https://host/x`` (an scp-like URL's user stays)."""
    return re.sub(r"^([a-z][\w+.-]*://)[^/@]*@", r"\1", url)


def _config(path: Path, key: str) -> str | None:
    import git

    try:
        value = git.Repo(path).git.config("--get", key)
    except Exception:
        return None
    return str(value).strip() or None


def open_clone(path: str) -> Clone:
    """The clone at ``path``; ``BadInput`` in one line when it is not a git repository."""
    try:
        import git
    except ImportError as exc:
        raise BadInput("--from-pr needs gitpython: pip install 'megatron-backports[git]'") from exc
    for var in _GIT_LOCATION_VARS:
        os.environ.pop(var, None)
    where = Path(path).expanduser().resolve()
    if path.startswith("-") or "://" in path:
        raise BadInput(f"--repo {path!r}: give the path of a local Megatron-LM clone")
    try:
        repo = git.Repo(where)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise BadInput(f"--repo {path}: not a git repository ({type(exc).__name__})") from exc
    repo.git.update_environment(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0")
    return Clone(where, repo)
