#!/usr/bin/env python3
"""Refresh ``vendor/<backport>/`` from an upstream commit, and check that nothing drifted.

    python tools/sync_upstream.py --backport megatron-lm-7617 --pr 7617            # the PR's head
    python tools/sync_upstream.py --backport megatron-lm-7617 --sha 3d07347 --pr 7617
    python tools/sync_upstream.py --backport megatron-lm-7617 --sha SHA --repo ../Megatron-LM
    python tools/sync_upstream.py --backport megatron-lm-7617 --rehash  # handwritten folder
    python tools/sync_upstream.py --check
    python tools/sync_upstream.py --vendor-dir ../acme-backport/acme_backport/vendor \
        --backport acme-7617 --pr 7617    # a plugin's folder, from the repo its manifest names

A sync keeps a bare clone of the upstream repository under the user's cache directory
(``$XDG_CACHE_HOME/megatron-backports/upstream/``), fetches ``refs/pull/N/head`` (with
``--pr``) or the commit, reads the manifest's source path at that commit (or the module's
planned new location, when the old one is gone or only forwards), vendors the function
with ``tools/sync_rewrite.py`` and prints a unified diff. The new file and the new
``UPSTREAM.toml`` (written with tomlkit: comments and key order kept) go into a staged copy
of the vendored folder, which then takes the folder's place: an error or Ctrl-C leaves the
old pair or the new pair, never a mix, and the next run finishes or undoes what a killed
one left. The local changes the catalog declares live outside ``vendor/`` and wrap
whatever function is vendored, so a sync keeps them; it names each one it kept.

``--dry-run`` only prints. ``--check`` needs no network: it compares the vendored file with
``sha256`` and every ``.py`` of its folder with ``files_sha256`` in ``UPSTREAM.toml``.
``--rehash`` records both for a handwritten folder. Git runs through gitpython, never a
shell.

``--vendor-dir`` points the tool at another folder of vendored backports: a plugin
distribution's (``backports new`` lays one out as ``<package>/vendor/<id>/``). Everything
above holds there too: the repo and path come from that folder's ``UPSTREAM.toml``, the
staging and the swap happen beside it, and ``--check`` compares its hashes.

Exit status: 0 done (or nothing to do), 1 ``--check`` found drift, 2 an error or an
interruption, reported in one line on stderr (the vendored files are then the old ones,
unless the line says otherwise).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import difflib
import hashlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sync_rewrite import Provenance, SourceError, SyncError, Vendored, defines, render_vendored

__all__ = [
    "FetchError",
    "Interrupted",
    "RevisionError",
    "UsageError",
    "WriteError",
    "check",
    "main",
    "recover_interrupted",
    "rehash",
    "sync",
]

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor"
MANIFEST = "UPSTREAM.toml"
CACHE_SUBDIR = Path("megatron-backports") / "upstream"

_SHA = re.compile(r"[0-9a-fA-F]{4,40}")
_BACKPORT_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_REQUIRED = {"id": str, "repo": str, "pr": int, "path": str, "file": str}
# Variables that would point git at some other repository than the cache clone.
_GIT_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


class UsageError(SyncError):
    """A bad argument or manifest: ``--backport``, ``--sha``, ``--repo``, ``UPSTREAM.toml``."""


class FetchError(SyncError):
    """The upstream repository, or the ref asked for, could not be fetched."""


class RevisionError(SyncError):
    """The SHA names no commit, or more than one, in the fetched repository."""


class WriteError(SyncError):
    """The staged folder could not be written or swapped into place."""


class Interrupted(SyncError):
    """Ctrl-C: the message says which pair of files the vendored folder holds."""


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

    def shown(self, name: str = "") -> str:
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
    for key in ("moved_path", "origin", "sha256", "files_sha256"):
        if not isinstance(data.get(key, ""), str):
            raise UsageError(f"{path}: {key!r} must be a str")
    symbol = data.get("symbol")
    names = symbol if isinstance(symbol, list) else [symbol]
    if not names or not all(isinstance(name, str) and name for name in names):
        raise UsageError(f"{path}: 'symbol' must be a name or a list of names")
    name = data["file"]
    if Path(name).name != name or name in ("", ".", "..") or not name.endswith(".py"):
        raise UsageError(f"{path}: 'file' must be a .py file name in {folder.name}/")
    return Backport(data["id"], folder, data, text)


def known_backports(vendor: Path) -> list[Backport]:
    """Every vendored folder; the hidden ones are a sync's staging and set-aside copies."""
    folders = sorted(path.parent for path in vendor.glob(f"*/{MANIFEST}"))
    return [_read_manifest(folder) for folder in folders if not folder.name.startswith(".")]


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


# --- what the package says: the folder digest and the local changes -----------------------


def _package_import(name: str) -> Any:
    """A module of this checkout's ``backports.megatron`` (installed or not): the digest
    --check compares must come from the very function the probe of this tree runs."""
    import importlib

    if str(ROOT) not in sys.path:
        sys.path.insert(1, str(ROOT))
    try:
        return importlib.import_module(f"backports.megatron.{name}")
    except ImportError as exc:
        raise UsageError(f"cannot import backports.megatron.{name} from {ROOT}: {exc}") from exc


def files_digest(folder: Path) -> str:
    """``files_sha256``: one sha256 over the folder's ``.py`` files, as the probe computes it."""
    digest: str = _package_import("vendored").python_files_digest(folder)
    return digest


def local_changes(backport_id: str) -> list[tuple[str, str]] | None:
    """(name, reason) of each local change the catalog entry wraps its vendored code with;
    None when this environment's catalog has no such entry (a plugin not installed here)."""
    catalog = _package_import("catalog")
    try:
        spec = catalog.by_id(backport_id)
    except KeyError:
        return None
    return [(change.name, change.reason) for change in spec.local_changes]


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


# --- UPSTREAM.toml and diffs --------------------------------------------------------------


def render_manifest(old_text: str, data: dict[str, Any]) -> str:
    """``data`` written over the old ``UPSTREAM.toml`` with tomlkit: its comments and key
    order stay, keys ``data`` drops go, new keys follow in ``data``'s order."""
    try:
        import tomlkit
    except ImportError as exc:
        raise UsageError(
            "writing UPSTREAM.toml needs tomlkit: pip install 'megatron-backports[git]'"
        ) from exc
    document = tomlkit.parse(old_text)
    for key in [key for key in document if key not in data]:
        del document[key]
    for key, value in data.items():
        document[key] = value
    text = tomlkit.dumps(document)
    if tomllib.loads(text) != data:
        raise UsageError("internal error: the UPSTREAM.toml written would not read back")
    return text


def unified_diff(old: str, new: str, name: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def write_file(path: Path, text: str) -> None:
    """Write ``text`` and flush it to disk (before the folder holding it is swapped in)."""
    with open(path, "wb") as handle:
        handle.write(text.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


# --- staging and swapping the vendored folder ---------------------------------------------
#
# The vendored file and UPSTREAM.toml must change together: a new file with the old
# manifest makes the probe refuse the backport wherever the tree ships. Both are written
# into a copy of the folder beside it (``.<name>.sync-new-*``), which then takes the
# folder's place in two renames: the folder to ``.<name>.sync-old``, the copy to the
# folder. Ctrl-C is held for those two renames; an error in the second puts the folder
# back; a killed run leaves ``.<name>.sync-old`` for ``recover_interrupted`` to put right.

_STAGE_INFIX = ".sync-new-"
_OLD_SUFFIX = ".sync-old"


def _set_aside(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}{_OLD_SUFFIX}")


@contextlib.contextmanager
def staged_copy(folder: Path, beside: bool = True) -> Iterator[Path]:
    """A copy of ``folder`` to write into; removed on exit unless swapped in first.

    ``beside``: in the folder's parent, so the swap is a rename on one file system;
    otherwise (a dry run) under the system's temporary directory.
    """
    parent = folder.parent if beside else None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}{_STAGE_INFIX}", dir=parent))
    except OSError as exc:
        raise WriteError(f"cannot stage the new files beside {folder}: {exc}") from exc
    try:
        stage = staging / folder.name
        try:
            shutil.copytree(folder, stage, ignore=shutil.ignore_patterns("__pycache__"))
        except OSError as exc:
            raise WriteError(f"cannot stage a copy of {folder}: {exc}") from exc
        yield stage
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[list[int]]:
    """Hold Ctrl-C (SIGINT) until the block is done; the list says whether one came."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held  # signal handlers can only be set in the main thread
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def swap_in(stage: Path, folder: Path) -> bool:
    """Put the staged copy in ``folder``'s place; True if Ctrl-C came meanwhile (held)."""
    aside = _set_aside(folder)
    with _interrupts_held() as held:
        try:
            os.rename(folder, aside)
        except OSError as exc:
            raise WriteError(f"cannot move {folder} aside: {exc}; nothing written") from exc
        try:
            os.rename(stage, folder)
        except BaseException as exc:
            _put_back(aside, folder, exc)
            if isinstance(exc, OSError):
                raise WriteError(f"cannot move the new files into {folder}: {exc}") from exc
            raise
        _fsync_dir(folder.parent)
        shutil.rmtree(aside, ignore_errors=True)
    return bool(held)


def _put_back(aside: Path, folder: Path, cause: BaseException) -> None:
    try:
        os.rename(aside, folder)
    except BaseException as exc:
        raise WriteError(
            f"{type(cause).__name__} while swapping in the new files, and the old folder "
            f"could not be put back ({exc}): it is {aside}; the next run puts it back"
        ) from exc


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def leftovers(vendor: Path) -> list[Path]:
    """Staged copies and set-aside folders a killed run left in ``vendor``."""
    return sorted(
        path
        for path in vendor.glob(".*")
        if path.is_dir() and (path.name.endswith(_OLD_SUFFIX) or _STAGE_INFIX in path.name)
    )


def recover_interrupted(vendor: Path) -> list[str]:
    """Undo or finish what a killed run left; one line per thing done."""
    done = []
    for path in leftovers(vendor):
        if _STAGE_INFIX in path.name:
            shutil.rmtree(path)
            done.append(f"removed {path.name}, a staged copy a killed sync left")
            continue
        folder = vendor / path.name[1:].removesuffix(_OLD_SUFFIX)
        if folder.exists():
            shutil.rmtree(path)
            done.append(f"removed {path.name}: the sync that set it aside had finished")
        else:
            os.rename(path, folder)
            done.append(f"put {folder.name}/ back from {path.name}: its sync was killed")
    return done


# --- sync, rehash and check ---------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


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
    # A handwritten folder of an open pull request may not know its head: the commit
    # synced now is the first one known to be upstream's.
    data.setdefault("head_sha", commit.hexsha)
    return data


def _with_date(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Today's date when anything changed; the old date when a re-sync changes nothing."""
    unchanged = {k: v for k, v in old.items() if k != "synced_date"} == new
    date = old.get("synced_date") if unchanged else None
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return {**new, "synced_date": date or today}


def _check_args(sha: str | None, pr: int | None) -> None:
    if sha is None and pr is None:
        raise UsageError("a sync needs --sha, --pr, or both")
    if sha is not None and not _SHA.fullmatch(sha):
        raise UsageError(f"--sha must be 4 to 40 hex digits, not {sha!r}")
    if pr is not None and pr <= 0:
        raise UsageError(f"--pr must be a positive pull-request number, not {pr}")


def _tidy(vendor: Path, dry_run: bool) -> None:
    """Put right what a killed run left, or (dry run: nothing written) say it is there."""
    if dry_run:
        for path in leftovers(vendor):
            print(f"note: {path.name} is left by a killed sync; the next sync puts it right")
        return
    try:
        done = recover_interrupted(vendor)
    except OSError as exc:
        raise WriteError(f"cannot tidy up after a killed sync in {vendor}: {exc}") from exc
    for line in done:
        print(f"note: {line}")


def _one_symbol(backport: Backport) -> str:
    """The one top-level function a sync vendors; a folder of several targets (a list of
    symbols, or a "Class.method") stays handwritten."""
    symbol = backport.manifest["symbol"]
    names = symbol if isinstance(symbol, list) else [symbol]
    if len(names) != 1 or "." in names[0]:
        raise UsageError(
            f"{backport.shown(MANIFEST)} names {', '.join(map(str, names))}: a sync vendors one "
            "top-level function; keep this folder handwritten and record its hashes with "
            "--rehash"
        )
    return str(names[0])


def sync(
    vendor: Path,
    backport_id: str,
    sha: str | None,
    repo_arg: str | None,
    pr: int | None,
    dry_run: bool,
) -> int:
    _check_args(sha, pr)
    sha = None if sha is None else sha.lower()
    _tidy(vendor, dry_run)
    backport = load_backport(vendor, backport_id)
    manifest = {**backport.manifest, "symbol": _one_symbol(backport)}
    url = repo_location(repo_arg if repo_arg is not None else manifest["repo"])
    with cache_clone(url) as repo:
        fetch(repo, url, sha, pr)
        commit = resolve_commit(repo, sha, url, pr)
        if pr is not None and not repo.is_ancestor(commit.hexsha, f"refs/pull/{pr}/head"):
            print(f"note: {commit.hexsha[:12]} is not on refs/pull/{pr}/head")
        source = read_source(commit, manifest)
    if source.note:
        print(f"note: {source.note}")
    provenance = Provenance(
        repo=manifest["repo"],
        pr=manifest["pr"],
        sha=commit.hexsha,
        path=source.path,
        symbol=manifest["symbol"],
        target_module=_module_name(manifest["path"]),
        # Not once the move is done: the source is then read from the new place.
        moved_path=None
        if source.path == manifest.get("moved_path")
        else manifest.get("moved_path"),
    )
    vendored = render_vendored(source.text, manifest["symbol"], provenance)
    print(f"reads from the target module: {', '.join(vendored.reads) or 'nothing'}")
    synced_repo = None if url == repo_location(manifest["repo"]) else url
    data = _new_manifest(backport, commit, source, vendored, synced_repo)
    code = _write_pair(backport, vendored.text, data, dry_run, dated=True)
    _say_kept_local_changes(backport.id)
    return code


def rehash(vendor: Path, backport_id: str, dry_run: bool) -> int:
    """Record sha256 and files_sha256 of a handwritten folder as it is."""
    _tidy(vendor, dry_run)
    backport = load_backport(vendor, backport_id)
    origin = backport.manifest.get("origin")
    if origin != "handwritten":
        raise UsageError(
            f"{backport.shown(MANIFEST)} says origin = {origin!r}: --rehash records the "
            "hashes of handwritten code only; re-sync synced code instead"
        )
    try:
        text = backport.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {backport.file}: {exc}") from exc
    data = {**backport.manifest, "sha256": _sha256(text.encode("utf-8"))}
    return _write_pair(backport, text, data, dry_run, dated=False)


def _write_pair(
    backport: Backport, text: str, data: dict[str, Any], dry_run: bool, dated: bool
) -> int:
    """Stage the vendored file and its UPSTREAM.toml (files_sha256 over the staged
    folder), print the diff, and swap the pair in unless nothing changed or ``dry_run``."""
    with staged_copy(backport.folder, beside=not dry_run) as stage:
        try:
            write_file(stage / backport.file.name, text)
            data = {**data, "files_sha256": files_digest(stage)}
            if dated:
                data = _with_date(data, backport.manifest)
            manifest_text = render_manifest(backport.manifest_text, data)
            write_file(stage / MANIFEST, manifest_text)
        except OSError as exc:
            raise WriteError(f"cannot write the staged copy of {backport.folder}: {exc}") from exc
        file_diff = unified_diff(
            _read_text(backport.file), text, backport.shown(backport.file.name)
        )
        manifest_diff = unified_diff(
            backport.manifest_text, manifest_text, backport.shown(MANIFEST)
        )
        diff = file_diff + manifest_diff
        if not diff:
            print(f"{backport.id}: {backport.shown()} is up to date; nothing written")
            return 0
        sys.stdout.write(diff)
        if dry_run:
            print(f"{backport.id}: dry run; nothing written")
            return 0
        try:
            held = swap_in(stage, backport.folder)
        except KeyboardInterrupt as exc:
            raise Interrupted(f"interrupted; {backport.shown()} keeps its old files") from exc
    names = [backport.file.name] * bool(file_diff) + [MANIFEST] * bool(manifest_diff)
    wrote = f"wrote {' and '.join(names)} in {backport.shown()}"
    if held:
        raise Interrupted(f"interrupted after the swap: {wrote}")
    print(f"{backport.id}: {wrote}")
    return 0


def _say_kept_local_changes(backport_id: str) -> None:
    """The local changes live outside vendor/ and wrap whatever function is vendored."""
    changes = local_changes(backport_id)
    if changes is None:
        print(
            f"{backport_id}: not in this environment's catalog (a plugin not installed "
            "here?): its local changes, if any, live in its own package and are kept"
        )
    elif not changes:
        print(f"{backport_id}: the catalog declares no local changes")
    for name, reason in changes or []:
        print(f"kept local change {name}: {reason}")


def _drift(backport: Backport) -> list[str]:
    """One line per way the folder differs from its UPSTREAM.toml."""
    lines = []
    expected = backport.manifest.get("sha256")
    try:
        actual = _sha256(backport.file.read_bytes())
    except OSError as exc:
        actual = f"unreadable ({exc.strerror})"
    if actual != expected:
        shown = backport.shown(backport.file.name)
        lines.append(f"drifted: {shown} (sha256 {actual}, {MANIFEST} says {expected})")
    folder_expected = backport.manifest.get("files_sha256")
    folder_actual = files_digest(backport.folder)
    if folder_expected is None:
        lines.append(
            f"drifted: {backport.shown()} ({MANIFEST} has no files_sha256; "
            "re-sync, or --rehash a handwritten folder)"
        )
    elif folder_actual != folder_expected:
        lines.append(
            f"drifted: {backport.shown()}*.py "
            f"(files_sha256 {folder_actual}, {MANIFEST} says {folder_expected})"
        )
    return lines


def check(vendor: Path, only: str | None = None) -> int:
    """0 when every vendored folder matches its UPSTREAM.toml, else 1."""
    stray = leftovers(vendor)
    if stray:
        # A folder may be set aside, not in its place: nothing to compare until a sync
        # (or --rehash) puts it right.
        for path in stray:
            print(f"leftover: {path.name} from a killed sync; the next sync or --rehash tidies it")
        return 1
    backports = [load_backport(vendor, only)] if only else known_backports(vendor)
    if not backports:
        raise UsageError(f"no vendored backports (*/{MANIFEST}) under {vendor}")
    drifted = 0
    for backport in backports:
        lines = _drift(backport)
        drifted += bool(lines)
        for line in lines:
            print(line)
    if drifted:
        print(f"{drifted} vendored folder(s) differ from {MANIFEST}; re-sync, do not edit")
        return 1
    print(f"ok: {len(backports)} vendored folder(s) match their {MANIFEST}")
    return 0


# --- command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sync_upstream.py",
        description=(
            "Refresh vendor/<backport>/ (or a plugin's, --vendor-dir) from an upstream "
            "commit (--backport with --sha, "
            "--pr or both), record the hashes of a handwritten folder (--rehash), or check "
            "for drift (--check)."
        ),
        epilog="exit status: 0 done, 1 --check found drift, 2 an error or an interruption",
    )
    parser.add_argument("--backport", help="backport id, e.g. megatron-lm-7617")
    parser.add_argument(
        "--sha", help="upstream commit, 4 to 40 hex digits (default with --pr: the PR's head)"
    )
    parser.add_argument("--repo", help="URL or local path (default: repo in UPSTREAM.toml)")
    parser.add_argument(
        "--pr", type=int, help="fetch refs/pull/PR/head; alone, sync that head commit"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    parser.add_argument(
        "--rehash",
        action="store_true",
        help="record sha256 and files_sha256 of a handwritten folder as it is",
    )
    parser.add_argument(
        "--check", action="store_true", help="verify sha256 and files_sha256 only, no network"
    )
    parser.add_argument(
        "--vendor-dir",
        type=Path,
        default=VENDOR,
        metavar="DIR",
        help="the folder holding the <id>/ folders (default: this repository's vendor/; "
        "a plugin's: <package>/vendor)",
    )
    return parser


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    fetching = [flag for flag in ("sha", "repo", "pr") if getattr(args, flag) is not None]
    if args.check:
        if fetching or args.dry_run or args.rehash:
            parser.error("--check takes only --backport")
        return check(args.vendor_dir, args.backport)
    if args.backport is None:
        parser.error("a sync needs --backport and --sha or --pr (or use --check)")
    if args.rehash:
        if fetching:
            parser.error("--rehash takes only --backport and --dry-run")
        return rehash(args.vendor_dir, args.backport, args.dry_run)
    if args.sha is None and args.pr is None:
        parser.error("a sync needs --backport and --sha or --pr (or use --check)")
    return sync(args.vendor_dir, args.backport, args.sha, args.repo, args.pr, args.dry_run)


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except SyncError as exc:
        message = str(exc)
    except KeyboardInterrupt:
        message = "interrupted; nothing written"
    except OSError as exc:
        message = f"{exc}; nothing written"
    except Exception as exc:  # a bug: still one line, never a traceback
        message = f"unexpected {type(exc).__name__}: {exc}"
    print(f"sync_upstream.py: error: {_one_line(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
