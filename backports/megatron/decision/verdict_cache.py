"""The probe's verdict, kept per environment, so that worker processes reuse it.

Every process that imports megatron's target probes it (signature, helpers, the behaviour
sniff). In a job of many ranks and workers that is the same question asked again of the
same files. The first process to prove a verdict writes it here; a later one reuses it
only if everything that decided it is unchanged. The key covers:

- Python (interpreter, version, bytecode tag) and the torch version the sniff ran on;
- this package: the size and mtime of each of its files (so its version, the catalog, the
  probe, the sniffs), and the sha256 of every file of the entry's vendored folder;
- a plugin's entry (not a builtin's): its distribution (name, version, RECORD's sha256) and
  the sha256 of the module its entry point names and of its sniff's module, so that an
  upgrade or an edit of the plugin is probed again;
- the entry: its id, and per target what its kind fingerprints (``Kind.fingerprint``): for
  a function the defining module's file, the code object as loaded and the distribution's
  RECORD; for an import guard the module's file and everything an import can reach on the
  path the sniff's children search (which is keyed too: ``child_path``).

Any difference, an unreadable or corrupt cache file, or a target that is not loaded, not
the module's own function, or not a file of the installed distribution (a source checkout
or an editable install, whose other files RECORD does not follow) means: probe as before
(and store the new verdict where it can be kept). Only the
verdicts the behaviour sniff decides (``needed``, ``upstream``) are kept: a failure may be
passing, and cheap verdicts need no cache. A ``needed`` verdict is reused only if its
evidence shows the vendored replacement sniffed fixed in the mode asked for and upstream-only
alone (``vendored_behaviour``, see probe): one proved in the other mode is probed again.

Where: ``MEGATRON_BACKPORTS_CACHE_DIR`` if set, else ``<sys.prefix>/var/cache/
megatron-backports`` (the venv's own), else, where that cannot be written, the user cache
dir (``$XDG_CACHE_HOME`` if absolute, as XDG says, or ``~/.cache``) under a folder per
environment. Reads look in the one folder writes go to (the first that works), never in a
later one. ``MEGATRON_BACKPORTS_CACHE=0`` turns the cache off (read and write). Files are
written whole (a temporary file renamed into place), one per backport id and environment.

A verdict decides whether a fix runs, so the cache is trusted as pip and git trust theirs:
a folder or file owned by another user, or writable by every user, is refused (said once,
in one line), and only a regular file of at most ``MAX_BYTES`` is read (a FIFO or a link to
``/dev/zero`` at its path must not hang or exhaust every process that imports megatron).
"""

import hashlib
import importlib.metadata
import json
import logging
import os
import stat
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import switches
from ..errors import BackportWarning
from ..evidence.fingerprints import our_code, sha256_file
from ..evidence.one_look import remembered
from ..evidence.versions import installed_distribution
from ..interpreter import once_per_job
from ..model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, BackportSpec

CACHE = "MEGATRON_BACKPORTS_CACHE"  # off: never read or write the cache
CACHE_DIR = "MEGATRON_BACKPORTS_CACHE_DIR"  # where the cache lives (default: see above)
# Bump when the file layout or the key's meaning changes. 2: a ``needed`` verdict carries
# the sniff on the vendored replacement (files of 1 were proved without it). 3: one key for
# every kind (each target's kind fingerprints it), one file per backport and environment.
FORMAT = 3
KEPT = ("needed", "upstream")
MAX_BYTES = 1 << 20  # an entry is a few kB; anything larger is not one of ours

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
    per_environment = hashlib.sha256(sys.prefix.encode()).hexdigest()[:16]
    return [
        Path(sys.prefix) / "var" / "cache" / "megatron-backports",
        Path(base) / "megatron-backports" / per_environment,
    ]


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
    """Everything that decides ``spec``'s verdict here, or None when a target cannot be
    keyed (its kind's fingerprint is None: the probe then runs). ``child_path``: the path
    the sniff's child interpreters search (None: the sniff runs in this process)."""
    if any(target is None for target in targets):
        return None
    found: dict[str, object] = {
        "format": FORMAT,
        "id": spec.id,
        "python": [sys.executable, sys.version, sys.implementation.cache_tag],
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
    """One file per backport and environment: two environments sharing one cache folder
    (``MEGATRON_BACKPORTS_CACHE_DIR``) keep their verdicts side by side."""
    environment = hashlib.sha256(f"{sys.prefix}\0{sys.executable}".encode()).hexdigest()[:12]
    return f"{spec.id}.{environment}.json"


def _untrusted(path: Path | str, status: os.stat_result) -> str | None:
    """Why another user could have written ``path``, or None."""
    me = os.geteuid()
    if status.st_uid != me:
        return f"{path} is owned by uid {status.st_uid}, not by this user (uid {me})"
    if status.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user"
    return None


def _refuse(why: str) -> None:
    """Say once per job (and log every time) why a cache folder or file is not used."""
    message = f"megatron-backports: not using the verdict cache: {why}; probing instead"
    _LOG.debug(message)
    if once_per_job.claim(f"cache-refused:{why}"):
        warnings.warn(message, BackportWarning, stacklevel=2)


def _creatable(folder: Path) -> bool:
    """Whether ``folder`` (missing) could be made: its nearest existing parent is writable."""
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def _home() -> Path | None:
    """The folder the cache is read from: the first location that works, which is where
    ``store`` writes. A later location is a fallback for writing, never read beside it."""
    for folder in locations():
        try:
            status = os.stat(folder)
        except FileNotFoundError:
            if _creatable(folder):
                return None  # the first write makes it: nothing to read anywhere yet
            continue
        except OSError:
            continue
        if not stat.S_ISDIR(status.st_mode) or not os.access(folder, os.W_OK | os.X_OK):
            continue
        why = _untrusted(folder, status)
        if why is not None:
            _refuse(why)
            continue
        return folder
    return None


def _read_entry(path: Path) -> object:
    """The JSON of a cache file, read only if it is a regular file of ours of a bounded size.

    Opened without blocking and without following a link: a FIFO or a device must never
    stall the import of megatron."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
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
    folder = _home()
    if folder is None:
        return None
    path = folder / file_name(spec)
    try:
        entry = _read_entry(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # unreadable, corrupt or refused: as if absent
        _LOG.debug("ignoring the verdict cache %s: %r", path, exc)
        return None
    if not (_valid(entry) and isinstance(entry, dict)):
        return None
    if entry["key"] == _digest(key) and _proves(entry, upstream_only):
        return {k: entry[k] for k in ("verdict", "reason", "evidence")}, path
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
        try:
            return _write_atomically(folder, file_name(spec), text)
        except (OSError, ValueError) as exc:
            _LOG.debug("cannot write the verdict cache in %s: %r", folder, exc)
    return None


def _write_atomically(folder: Path, name: str, text: str) -> Path:
    # A process reading meanwhile sees the old file or the new one, never half of one.
    folder.mkdir(parents=True, exist_ok=True)
    why = _untrusted(folder, os.stat(folder))
    if why is not None:  # another user's folder: what is written there cannot be trusted
        _refuse(why)
        raise ValueError(why)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / name
