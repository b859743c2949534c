"""The proof store: the probe's verdict, kept per environment, so that worker processes reuse it.

Every process that imports megatron's target probes it (signature, helpers, the behaviour
sniff). In a job of many ranks and workers that is the same question asked again of the
same files. The first process to prove a verdict writes it here; a later one reuses it
only if everything that decided it is unchanged. The key (``key``, the one function that
computes it) covers what decides the answer and nothing else:

- Python: the real interpreter binary (links and a venv's ``bin/python`` resolved: the
  name a job was started by, ``python``, ``python3``, ``-m``, torchrun, a second venv over
  the same packages, is no part of it), its version and bytecode tag; and the torch version
  the sniff ran on;
- this package: the size and mtime of each of its files (so its version, the catalog, the
  probe, the sniffs), and the sha256 of every file of the entry's vendored folder;
- a plugin's entry (not a builtin's): its distribution (name, version, RECORD's sha256) and
  the sha256 of the module its entry point names and of its sniff's module, so that an
  upgrade or an edit of the plugin is probed again;
- the entry: its id, and per target what its kind fingerprints (``Kind.fingerprint``): for
  a function the defining module's file, the code object as loaded and the distribution's
  RECORD; for an import guard the module's file and everything an import can reach on the
  path the sniff's children search (which is keyed too: ``child_path``, only the folders
  that offer what a child imports: a job's script folder or a site dir it adds for the
  hook's ``.pth`` file is not part of it).

Any difference, an unreadable or corrupt cache file, or a target that is not loaded, not
the module's own function, or not a file of the installed distribution (a source checkout
or an editable install, whose other files RECORD does not follow) means: probe as before
(and store the new verdict where it can be kept). Only the
verdicts the behaviour sniff decides (``needed``, ``upstream``) are kept: a failure may be
passing, and cheap verdicts need no cache. A ``needed`` verdict is reused only if its
evidence shows the vendored replacement sniffed fixed in the mode asked for and upstream-only
alone (``vendored_behaviour``, see probe): one proved in the other mode is probed again.

Where: ``MEGATRON_BACKPORTS_CACHE_DIR`` if set, else ``<prefix>/var/cache/
megatron-backports``, where prefix is the environment megatron-backports is installed in
(``environment_prefix``: a second venv over the first's packages finds the first's store),
else, where that cannot be written, the user cache dir (``$XDG_CACHE_HOME`` if absolute, as
XDG says, or ``~/.cache``) under a folder per environment. Reads look in the first folder
that exists (read-only is enough: an image, Apptainer, a shared venv), and where that one
cannot be written, also in the folder this user's writes go to; never in a folder after
those. ``MEGATRON_BACKPORTS_CACHE=0`` turns the store off (read and write). Files are
written whole (a temporary file renamed into place), one per backport id and environment.

A verdict decides whether a fix runs, so the store is trusted as pip and git trust theirs:
a folder or file owned by another user, or writable by every user, is refused (said once,
in one line). One exception serves an image built as root and run as another user, or a
venv shared by its admin: a folder or file inside the environment (``sys.prefix``, or the
prefix above) owned by root or by the owner of the environment's code, writable by neither
group nor others. Only a regular file of at most ``MAX_BYTES`` is read
(a FIFO or a link to ``/dev/zero`` at its path must not hang or exhaust every process that
imports megatron); a file that is not the JSON of an entry is as if absent.
"""

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import switches
from ..errors import BackportWarning
from ..evidence.fingerprints import interpreter, our_code, sha256_file
from ..evidence.one_look import remembered
from ..evidence.versions import installed_distribution
from ..interpreter import once_per_job
from ..model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, BackportSpec

try:
    import fcntl
except ImportError:  # Windows: each process proves for itself
    fcntl = None  # type: ignore[assignment]

CACHE = "MEGATRON_BACKPORTS_CACHE"  # off: never read or write the proof store
CACHE_DIR = "MEGATRON_BACKPORTS_CACHE_DIR"  # where the store lives (default: see above)
# Bump when the file layout or the key's meaning changes. 2: a ``needed`` verdict carries
# the sniff on the vendored replacement (files of 1 were proved without it). 3: one key for
# every kind (each target's kind fingerprints it), one file per backport and environment.
# 4: the real interpreter, not the name it was started by; files named per environment.
FORMAT = 4
KEPT = ("needed", "upstream")
MAX_BYTES = 1 << 20  # an entry is a few kB; anything larger is not one of ours
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_LOG = logging.getLogger(__name__)


def enabled() -> bool:
    return switches.flag(CACHE, True)


def locations() -> list[Path]:
    """Where to look for the cache, first choice first (writes go to the first that works)."""
    override = os.environ.get(CACHE_DIR, "").strip()
    if override:
        return [Path(override)]
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # XDG: a relative path is invalid and is ignored
        base = str(Path.home() / ".cache")
    prefix = environment_prefix()
    per_environment = hashlib.sha256(str(prefix).encode()).hexdigest()[:16]
    return [
        prefix / "var" / "cache" / "megatron-backports",
        Path(base) / "megatron-backports" / per_environment,
    ]


_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # backports/megatron


def environment_prefix() -> Path:
    """The environment megatron-backports is installed in: the prefix of the site-packages
    that holds this package where that is an environment (a venv's ``pyvenv.cfg`` is there,
    or it is this interpreter's own prefix), else ``sys.prefix`` (a source checkout). A job
    in a second venv whose path reaches the first venv's packages is served by the store
    ``backports apply`` filled in the first."""
    site_packages = _PACKAGE_DIR.parents[1]
    prefix = site_packages.parents[2] if len(site_packages.parents) > 2 else site_packages
    if site_packages.name == "site-packages" and site_packages.parent.name.startswith("python"):
        known = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
        if (prefix / "pyvenv.cfg").is_file() or os.path.realpath(prefix) in known:
            return prefix
    return Path(sys.prefix)


# ---- the key -------------------------------------------------------------------------------


def _module_sha256(name: str) -> str | None:
    source = getattr(sys.modules.get(name), "__file__", None)
    if not source or not os.path.isfile(source):
        return None
    return sha256_file(source)


def _plugin(spec: BackportSpec, where: tuple[str, str]) -> dict[str, object]:
    """What of a plugin decides its entry's verdict besides the target: its distribution
    (an upgrade changes version and RECORD) and its code (an editable install changes
    neither when a file is edited)."""
    name, module = where
    dist, record = installed_distribution(name)
    modules = sorted({module, getattr(spec.sniff, "__module__", None) or module})
    return {
        "name": name,
        "version": None if dist is None else dist.version,
        "record_sha256": None if record is None else hashlib.sha256(record.encode()).hexdigest(),
        "modules": {m: _module_sha256(m) for m in modules},
    }


def key(
    spec: BackportSpec,
    vendored_sha256: str,
    targets: Sequence[dict[str, object] | None],
    *,
    child_path: Sequence[str] | None,
    plugin: tuple[str, str] | None,
) -> dict[str, object] | None:
    """The proof's key: everything that decides ``spec``'s verdict here, and nothing that
    does not (the module docstring lists it). None when a target cannot be keyed (its kind's
    fingerprint is None: the probe then runs). ``child_path``: the folders of the path the
    sniff's child interpreters search that offer what they import (None: the sniff runs in
    this process). ``backports apply`` and every way of starting a job in the same
    environment compute the same key (tests/job/test_proof_key.py)."""
    if any(target is None for target in targets):
        return None
    found: dict[str, object] = {
        "format": FORMAT,
        "id": spec.id,
        "python": interpreter(),
        "torch": _torch_version(),
        "megatron_backports": our_code(),
        "vendored_sha256": vendored_sha256,
        "targets": list(targets),
    }
    if child_path is not None:
        found["child_path"] = list(child_path)
    if plugin is not None:  # a builtin's key stays as it was: its code is ours
        found["plugin"] = _plugin(spec, plugin)
    return found


def _torch_version() -> str | None:
    """torch's installed version, read without importing it: a job decides an import guard
    before anything imports torch, and must find the proof ``backports apply`` (which had
    imported it) keyed the same. The imported module's where no distribution says."""

    def read() -> str | None:
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            torch = sys.modules.get("torch")
            return None if torch is None else str(getattr(torch, "__version__", None))

    return remembered(("verdict_cache", "torch"), read)


def _digest(key: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


# ---- read and write ------------------------------------------------------------------------


def file_name(spec: BackportSpec) -> str:
    """One file per backport and environment: two environments sharing one store folder
    (``MEGATRON_BACKPORTS_CACHE_DIR``) keep their verdicts side by side. Named by the
    environment and the real interpreter, never by the name a process was started by."""
    real, _, tag = interpreter()
    named = f"{environment_prefix()}\0{real}\0{tag}"
    return f"{spec.id}.{hashlib.sha256(named.encode()).hexdigest()[:12]}.json"


def stored_for(spec: BackportSpec) -> bool:
    """Whether the store holds a verdict on ``spec`` for this environment (for any key):
    cheap, reading no file; False when the store is off."""
    if not enabled():
        return False
    try:
        return any((folder / file_name(spec)).is_file() for folder in read_folders())
    except OSError:
        return False


def _untrusted(path: Path | str, status: os.stat_result) -> str | None:
    """Why another user could have written ``path``, or None. Ours, not writable by every
    user; or, inside the environment, owned by whoever owns the environment's code (root in
    an image, the admin of a shared venv: the job runs their code already) and writable by
    neither group nor others (what ``backports apply`` leaves where jobs run as another user)."""
    me = os.geteuid()
    if status.st_uid == me:
        if status.st_mode & stat.S_IWOTH:
            return f"{path} is writable by every user"
        return None
    if status.st_uid in _environment_owners() and _inside_the_environment(path):
        if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} is owned by uid {status.st_uid} and writable by other users"
        return None
    return f"{path} is owned by uid {status.st_uid}, not by this user (uid {me})"


def _environment_owners() -> set[int]:
    """root, and the owners of the environment and of this package's installed files."""
    owners = {0}
    for folder in (sys.prefix, environment_prefix(), _PACKAGE_DIR):
        try:
            owners.add(os.stat(folder).st_uid)
        except OSError:
            continue
    return owners


def _inside_the_environment(path: Path | str) -> bool:
    real = Path(os.path.realpath(path))
    prefixes = {os.path.realpath(p) for p in (sys.prefix, environment_prefix())}
    return any(real.is_relative_to(prefix) for prefix in prefixes)


def _refuse(why: str) -> None:
    """Say once per job (and log every time) why a cache folder or file is not used."""
    message = (
        f"megatron-backports: not using the proof store (verdict cache): {why}; probing instead"
    )
    _LOG.debug(message)
    if once_per_job.claim(f"cache-refused:{why}"):
        warnings.warn(message, BackportWarning, stacklevel=2)


def _creatable(folder: Path) -> bool:
    """Whether ``folder`` (missing) could be made: its nearest existing parent is writable."""
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def _usable(folder: Path) -> bool | None:
    """Whether ``folder`` is a store folder to read: True (readable, trusted), False (there
    but not to be used), None (not there)."""
    try:
        status = os.stat(folder)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    if not stat.S_ISDIR(status.st_mode) or not os.access(folder, os.R_OK | os.X_OK):
        return False
    why = _untrusted(folder, status)
    if why is not None:
        _refuse(why)
        return False
    return True


def _writable(folder: Path) -> bool:
    if folder.exists():
        return os.access(folder, os.W_OK | os.X_OK)
    return _creatable(folder)


def read_folders() -> list[Path]:
    """The folders a proof is read from, in order: the first location that exists and may
    be read (read-only is enough: a read-only image, Apptainer, a shared venv), and, where
    that one cannot be written, also the one this user's proofs are written to (``store``
    writes to the first location it can). A missing first location that could be made:
    nothing to read there yet, and nothing read after it."""
    found: list[Path] = []
    for folder in locations():
        usable = _usable(folder)
        if usable is None and not found and _creatable(folder):
            return found  # the first write makes it: nothing to read anywhere yet
        if usable:
            found.append(folder)
        if (usable or usable is None) and _writable(folder):
            break  # writes go here: no folder after it is read
    return found


def write_folder() -> Path | None:
    """The folder ``store`` writes to: the first location that can be written."""
    for folder in locations():
        if _writable(folder) and _usable(folder) is not False:
            return folder
    return None


def _read_entry(path: Path) -> object:
    """The JSON of a cache file, read only if it is a regular file of ours of a bounded size.

    Opened without blocking and without following a link: a FIFO or a device must never
    stall the import of megatron."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
    fd = os.open(path, flags)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError("not a regular file")
        why = _untrusted(path, status)
        if why is not None:
            _refuse(why)
            raise ValueError(why)
        if status.st_size > MAX_BYTES:
            raise ValueError(f"{status.st_size} bytes, more than {MAX_BYTES}")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_BYTES:
            raise ValueError(f"more than {MAX_BYTES} bytes")
    finally:
        os.close(fd)
    return json.loads(b"".join(chunks).decode("utf-8"))


def load(
    spec: BackportSpec, key: dict[str, object], *, upstream_only: bool | None = None
) -> tuple[dict[str, Any], Path] | None:
    """The stored ``verdict``, ``reason`` and ``evidence`` for exactly this key, and the file.

    ``upstream_only``: the mode the backport is to install in (default:
    ``MEGATRON_BACKPORTS_UPSTREAM_ONLY``); a ``needed`` verdict must have proved the vendored
    replacement in it. Read from one folder only: the first location that works (``_home``).
    """
    if upstream_only is None:
        upstream_only = switches.upstream_only()
    digest = _digest(key)
    for folder in read_folders():
        path = folder / file_name(spec)
        entry = _entry_at(path)
        if not (_valid(entry) and isinstance(entry, dict)):
            continue
        if entry["key"] == digest and _proves(entry, upstream_only):
            return {k: entry[k] for k in ("verdict", "reason", "evidence")}, path
    return None


def _entry_at(path: Path) -> object:
    """The JSON at ``path``; None where there is none, or none to trust (unreadable,
    corrupt, nested too deep for the parser, refused): as if absent."""
    try:
        return _read_entry(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        _LOG.debug("ignoring the proof store's file %s: %r", path, exc)
        return None


def _valid(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("format") == FORMAT
        and isinstance(entry.get("key"), str)
        and entry.get("verdict") in KEPT
        and isinstance(entry.get("reason"), str)
        and isinstance(entry.get("evidence"), dict)
    )


def _proves(entry: dict[str, Any], upstream_only: bool) -> bool:
    """Whether ``entry`` may stand for this mode: not ``needed``, or ``needed`` with the
    vendored replacement sniffed fixed alone and, in the default mode, with local changes."""
    if entry["verdict"] != "needed":
        return True
    shown = entry["evidence"].get("vendored_behaviour")
    modes = [UPSTREAM_ONLY] if upstream_only else [UPSTREAM_ONLY, WITH_LOCAL_CHANGES]
    return isinstance(shown, dict) and all(
        isinstance(shown.get(mode), dict) and shown[mode].get("fixed") is True for mode in modes
    )


def store(
    spec: BackportSpec, key: dict[str, object], verdict: str, reason: str, evidence: dict[str, Any]
) -> Path | None:
    """Write the verdict for ``key``; the file written, or None (not kept, or no folder)."""
    if verdict not in KEPT:
        return None
    entry = {
        "format": FORMAT,
        "key": _digest(key),
        "verdict": verdict,
        "reason": reason,
        "evidence": evidence,
        "fingerprint": key,  # what the key covers, for a person reading the file
    }
    text = json.dumps(entry, indent=1, sort_keys=True, default=str)
    for folder in locations():
        if not _writable(folder):  # a read-only store (an image): read, never written
            continue
        try:
            return _write_atomically(folder, file_name(spec), text)
        except (OSError, ValueError) as exc:
            _LOG.debug("cannot write the verdict cache in %s: %r", folder, exc)
    return None


# How long a process waits for another one proving the same entry (its children's time
# limits end a sniff long before): then it proves for itself.
LOCK_WAIT_SECONDS = 900.0


@contextlib.contextmanager
def proving(spec: BackportSpec) -> Iterator[bool]:
    """Held while this process proves ``spec`` where no proof exists, so that the ranks of a
    node that start together prove it once: the first takes the lock, the others wait for
    it and then find its proof (the caller looks again inside). A file lock (``flock``) in
    the folder proofs are written to, released by the kernel if its holder dies; yields
    whether it is held (False: no folder to lock in, no ``flock``, or the wait ran out: the
    caller proves without it)."""
    folder = write_folder()
    if folder is None or fcntl is None:
        yield False
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f".{file_name(spec)}.lock", os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o644)
    except OSError as exc:
        _LOG.debug("no lock for %s in %s: %r", spec.id, folder, exc)
        yield False
        return
    try:
        yield _lock(fd)
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int) -> bool:
    assert fcntl is not None
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        except OSError:  # a file system without locks
            return False


def _write_atomically(folder: Path, name: str, text: str) -> Path:
    # A process reading meanwhile sees the old file or the new one, never half of one.
    folder.mkdir(parents=True, exist_ok=True)
    why = _untrusted(folder, os.stat(folder))
    if why is not None:  # another user's folder: what is written there cannot be trusted
        _refuse(why)
        raise ValueError(why)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        # Readable by the jobs of every user (mkstemp makes it 0600: a store written as
        # root in an image would serve no one else), writable by its owner alone.
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / name
