#!/usr/bin/env python3
"""Refresh ``vendor/<backport>/`` from an upstream commit, and check that nothing drifted.

    python tools/sync_upstream.py --backport megatron-lm-7617 --sha 3d07347 --pr 7617
    python tools/sync_upstream.py --backport megatron-lm-7617 --sha SHA --repo ../Megatron-LM
    python tools/sync_upstream.py --check

A sync keeps a bare clone of the upstream repository under the user's cache directory
(``$XDG_CACHE_HOME/megatron-backports/upstream/``), fetches ``refs/pull/N/head`` (with
``--pr``) or the commit, reads the manifest's source path at that commit (or the module's
planned new location, when the old one is gone or only forwards), vendors the function
with ``tools/sync_rewrite.py``, prints a unified diff and writes both files atomically.
``--dry-run`` only prints. ``--check`` needs no network: it compares every vendored file
with the sha256 in its ``UPSTREAM.toml``. Git runs through gitpython, never a shell.

Exit status: 0 done (or nothing to do), 1 ``--check`` found drift, 2 an error (nothing
written).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import difflib
import hashlib
import json
import os
import re
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sync_rewrite import Provenance, SourceError, SyncError, Vendored, defines, render_vendored

__all__ = ["FetchError", "RevisionError", "UsageError", "check", "main", "sync"]

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor"
MANIFEST = "UPSTREAM.toml"
CACHE_SUBDIR = Path("megatron-backports") / "upstream"

_SHA = re.compile(r"[0-9a-fA-F]{4,40}")
_BACKPORT_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_REQUIRED = {"id": str, "repo": str, "pr": int, "path": str, "symbol": str, "file": str}
# Variables that would point git at some other repository than the cache clone.
_GIT_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


class UsageError(SyncError):
    """A bad argument or manifest: ``--backport``, ``--sha``, ``--repo``, ``UPSTREAM.toml``."""


class FetchError(SyncError):
    """The upstream repository, or the ref asked for, could not be fetched."""


class RevisionError(SyncError):
    """The SHA names no commit, or more than one, in the fetched repository."""


# --- manifests ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Backport:
    id: str
    folder: Path
    manifest: dict[str, Any]
    manifest_text: str

    @property
    def file(self) -> Path:
        return self.folder / str(self.manifest["file"])

    @property
    def manifest_path(self) -> Path:
        return self.folder / MANIFEST

    def shown(self, name: str) -> str:
        """``vendor/<folder>/<name>``: how diffs and messages name the backport's files."""
        return f"{self.folder.parent.name}/{self.folder.name}/{name}"


def _read_manifest(folder: Path) -> Backport:
    path = folder / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    for key, kind in _REQUIRED.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise UsageError(f"{path}: {key!r} must be a {kind.__name__}")
    if not isinstance(data.get("moved_path", ""), str):
        raise UsageError(f"{path}: 'moved_path' must be a str")
    name = data["file"]
    if Path(name).name != name or name in ("", ".", "..") or not name.endswith(".py"):
        raise UsageError(f"{path}: 'file' must be a .py file name in {folder.name}/")
    return Backport(data["id"], folder, data, text)


def known_backports(vendor: Path) -> list[Backport]:
    return [_read_manifest(path.parent) for path in sorted(vendor.glob(f"*/{MANIFEST}"))]


def load_backport(vendor: Path, backport_id: str) -> Backport:
    """The backport ``id`` (``megatron-lm-7617`` lives in ``vendor/megatron_lm_7617/``)."""
    folder = vendor / backport_id.replace("-", "_")
    if not _BACKPORT_ID.fullmatch(backport_id) or not (folder / MANIFEST).is_file():
        known = ", ".join(b.id for b in known_backports(vendor)) or "none"
        raise UsageError(f"unknown backport {backport_id!r} (known under {vendor}: {known})")
    backport = _read_manifest(folder)
    if backport.id != backport_id:
        raise UsageError(f"{backport.manifest_path} says id = {backport.id!r}, not {backport_id!r}")
    return backport


# --- the cache clone and fetching ---------------------------------------------------------


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


def open_cache(url: str) -> Any:
    """The bare cache clone for ``url`` (a ``git.Repo``), created on first use."""
    try:
        import git
    except ImportError as exc:
        raise UsageError("syncing needs gitpython: pip install 'megatron-backports[git]'") from exc
    for var in _GIT_LOCATION_VARS:
        os.environ.pop(var, None)
    path = _cache_path(url)
    try:
        if (path / "HEAD").is_file():
            repo = git.Repo(path)
        else:
            path.mkdir(parents=True, exist_ok=True)
            repo = git.Repo.init(path, bare=True)
        repo.git.update_environment(GIT_TERMINAL_PROMPT="0")
        repo.git.config("remote.origin.url", url)
    except (git.GitError, OSError) as exc:
        raise FetchError(f"cannot set up the cache clone {path}: {exc}") from exc
    return repo


def _git_fetch(repo: Any, *refspecs: str) -> None:
    # The repository is the configured remote, never an argument git could take for an
    # option; the refspecs are built here from hex and integers only.
    repo.git.fetch("--quiet", "--no-tags", "--", "origin", *refspecs)


def _fetch_failure(exc: Exception) -> str:
    stderr = str(getattr(exc, "stderr", "") or exc).strip()
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1].removeprefix("stderr: ").strip("'") if lines else "git fetch failed"


def fetch(repo: Any, url: str, sha: str, pr: int | None) -> None:
    """Bring ``sha`` into the cache: with the PR's head ref, by SHA, or with the branches."""
    import git

    if pr is not None:
        ref = f"refs/pull/{pr}/head"
        try:
            _git_fetch(repo, f"+{ref}:{ref}")
        except git.GitCommandError as exc:
            raise FetchError(f"cannot fetch {ref} from {url}: {_fetch_failure(exc)}") from exc
        return
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
    import git

    try:
        found = repo.git.rev_parse(f"--disambiguate={prefix.lower()}").split()
    except git.GitCommandError:
        return []
    return [oid for oid in found if repo.git.cat_file("-t", oid) == "commit"]


def resolve_commit(repo: Any, sha: str, url: str, pr: int | None) -> Any:
    """The one commit whose id starts with ``sha`` (a ``git.Commit``)."""
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


# --- reading the source at the commit -----------------------------------------------------


@dataclass(frozen=True)
class Source:
    path: str
    text: str
    note: str | None  # set when the planned new location was read instead of ``path``


def _blob_text(commit: Any, path: str) -> str | None:
    try:
        blob = commit.tree / path
    except KeyError:
        return None
    if blob.type != "blob":
        return None
    data = blob.data_stream.read()
    try:
        return str(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path} at {commit.hexsha[:12]} is not UTF-8: {exc}") from exc


def _only_forwards(text: str, symbol: str) -> bool:
    """True when the module parses but does not itself define ``symbol`` (a forwarder)."""
    try:
        return defines(ast.parse(text), symbol) is None
    except SyntaxError:
        return False


def read_source(commit: Any, manifest: dict[str, Any]) -> Source:
    """The manifest's ``path`` at ``commit``, or ``moved_path`` when ``path`` is gone or
    only forwards the symbol to it."""
    path, symbol = manifest["path"], manifest["symbol"]
    moved: str | None = manifest.get("moved_path")
    short = commit.hexsha[:12]
    text = _blob_text(commit, path)
    moved_text = None if moved is None else _blob_text(commit, moved)
    if text is not None and (moved_text is None or not _only_forwards(text, symbol)):
        return Source(path, text, None)
    if moved is not None and moved_text is not None:
        why = "is gone" if text is None else f"does not define {symbol} (a forwarder)"
        note = f"{path} {why} at {short}; reading the planned new location {moved}"
        return Source(moved, moved_text, note)
    if moved is None:
        raise SourceError(f"{path} does not exist at {short}")
    raise SourceError(f"neither {path} nor {moved} exists at {short}")


# --- writing ------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # JSON string escapes are TOML basic-string escapes; DEL must be escaped too.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise UsageError(f"cannot write {value!r} into a flat UPSTREAM.toml")


def render_manifest(old_text: str, data: dict[str, Any]) -> str:
    """A flat TOML table in ``data``'s key order, after the old file's leading comments."""
    comments = []
    for line in old_text.splitlines():
        if not line.startswith("#"):
            break
        comments.append(line)
    body = [f"{key} = {_toml_value(value)}" for key, value in data.items()]
    text = "\n".join([*comments, *body]) + "\n"
    if tomllib.loads(text) != data:
        raise UsageError("internal error: the UPSTREAM.toml written would not read back")
    return text


def unified_diff(old: str, new: str, name: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` in one rename: readers see the old bytes or the new, never a mix."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- sync and check -----------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _new_manifest(
    backport: Backport, commit: Any, source: Source, vendored: Vendored, synced_repo: str | None
) -> dict[str, Any]:
    data = dict(backport.manifest)
    for key in ("synced_repo", "synced_date"):
        data.pop(key, None)
    data.update(
        sha256=_sha256(vendored.text.encode("utf-8")),
        origin="synced",
        origin_note=(
            f"Synced by tools/sync_upstream.py from {source.path} at {commit.hexsha[:12]}: "
            "upstream's function as it is, its module-global reads made live look-ups."
        ),
        synced_sha=commit.hexsha,
        synced_path=source.path,
        upstream_sha256=_sha256(vendored.segment.encode("utf-8")),
        reads=list(vendored.reads),
    )
    if synced_repo is not None:
        data["synced_repo"] = synced_repo
    return data


def _with_date(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Today's date when anything changed; the old date when a re-sync changes nothing."""
    unchanged = {k: v for k, v in old.items() if k != "synced_date"} == new
    date = old.get("synced_date") if unchanged else None
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return {**new, "synced_date": date or today}


def sync(
    vendor: Path, backport_id: str, sha: str, repo_arg: str | None, pr: int | None, dry_run: bool
) -> int:
    if not _SHA.fullmatch(sha):
        raise UsageError(f"--sha must be 4 to 40 hex digits, not {sha!r}")
    if pr is not None and pr <= 0:
        raise UsageError(f"--pr must be a positive pull-request number, not {pr}")
    backport = load_backport(vendor, backport_id)
    url = repo_location(repo_arg if repo_arg is not None else backport.manifest["repo"])
    repo = open_cache(url)
    fetch(repo, url, sha.lower(), pr)
    commit = resolve_commit(repo, sha.lower(), url, pr)
    if pr is not None and not repo.is_ancestor(commit.hexsha, f"refs/pull/{pr}/head"):
        print(f"note: {commit.hexsha[:12]} is not on refs/pull/{pr}/head")
    source = read_source(commit, backport.manifest)
    if source.note:
        print(f"note: {source.note}")
    manifest = backport.manifest
    provenance = Provenance(
        repo=manifest["repo"],
        pr=manifest["pr"],
        sha=commit.hexsha,
        path=source.path,
        symbol=manifest["symbol"],
        target_module=_module_name(manifest["path"]),
    )
    vendored = render_vendored(source.text, manifest["symbol"], provenance)
    synced_repo = None if url == repo_location(manifest["repo"]) else url
    data = _with_date(_new_manifest(backport, commit, source, vendored, synced_repo), manifest)
    return _write_or_show(backport, vendored, data, dry_run)


def _write_or_show(
    backport: Backport, vendored: Vendored, data: dict[str, Any], dry_run: bool
) -> int:
    old_file = backport.file.read_text(encoding="utf-8") if backport.file.exists() else ""
    new_manifest = render_manifest(backport.manifest_text, data)
    print(f"reads from the target module: {', '.join(vendored.reads) or 'nothing'}")
    diff = unified_diff(old_file, vendored.text, backport.shown(backport.file.name))
    diff += unified_diff(backport.manifest_text, new_manifest, backport.shown(MANIFEST))
    if not diff:
        print(f"{backport.id}: up to date with {data['synced_sha'][:12]}; nothing written")
        return 0
    sys.stdout.write(diff)
    if dry_run:
        print(f"{backport.id}: dry run; nothing written")
        return 0
    # The vendored file first: if the manifest write fails, --check and the probe see drift.
    write_atomic(backport.file, vendored.text)
    write_atomic(backport.manifest_path, new_manifest)
    print(f"{backport.id}: wrote {backport.file.name} and {MANIFEST}")
    return 0


def check(vendor: Path, only: str | None = None) -> int:
    """0 when every vendored file matches the sha256 in its UPSTREAM.toml, else 1."""
    backports = [load_backport(vendor, only)] if only else known_backports(vendor)
    if not backports:
        raise UsageError(f"no vendored backports (*/{MANIFEST}) under {vendor}")
    drifted = []
    for backport in backports:
        expected = backport.manifest.get("sha256")
        try:
            actual = _sha256(backport.file.read_bytes())
        except OSError as exc:
            actual = f"unreadable ({exc.strerror})"
        if actual != expected:
            drifted.append(backport.file)
            shown = backport.shown(backport.file.name)
            print(f"drifted: {shown} (sha256 {actual}, {MANIFEST} says {expected})")
    if drifted:
        print(f"{len(drifted)} vendored file(s) differ from {MANIFEST}; re-sync, do not edit")
        return 1
    print(f"ok: {len(backports)} vendored file(s) match their {MANIFEST}")
    return 0


# --- command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sync_upstream.py",
        description="Refresh vendor/<backport>/ from an upstream commit, or check for drift.",
    )
    parser.add_argument("--backport", help="backport id, e.g. megatron-lm-7617")
    parser.add_argument("--sha", help="upstream commit, 4 to 40 hex digits")
    parser.add_argument("--repo", help="URL or local path (default: repo in UPSTREAM.toml)")
    parser.add_argument("--pr", type=int, help="fetch refs/pull/PR/head instead of the SHA")
    parser.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    parser.add_argument("--check", action="store_true", help="verify sha256s only, no network")
    parser.add_argument("--vendor-dir", type=Path, default=VENDOR, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.check:
            extra = [flag for flag in ("sha", "repo", "pr") if getattr(args, flag) is not None]
            if extra or args.dry_run:
                parser.error("--check takes only --backport")
            return check(args.vendor_dir, args.backport)
        if args.backport is None or args.sha is None:
            parser.error("a sync needs --backport and --sha (or use --check)")
        return sync(args.vendor_dir, args.backport, args.sha, args.repo, args.pr, args.dry_run)
    except SyncError as exc:
        print(f"sync_upstream.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
