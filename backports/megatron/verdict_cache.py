"""The probe's verdict, kept per environment, so that worker processes reuse it.

Every process that imports megatron's target probes it (signature, helpers, the behaviour
sniff). In a job of many ranks and workers that is the same question asked again of the
same files. The first process to prove a verdict writes it here; a later one reuses it
only if everything that decided it is unchanged. The key covers:

- Python (version, bytecode tag) and the torch version the sniff ran on;
- this package: the size and mtime of each of its files (so its version, the catalog, the
  probe, the sniffs), and the sha256 of every file of the entry's vendored folder;
- a plugin's entry (not a builtin's): its distribution (name, version, RECORD's sha256) and
  the sha256 of the module its entry point names and of its sniff's module, so that an
  upgrade or an edit of the plugin is probed again;
- the entry: its id, and per target the defining module's file (path and sha256), the
  sha256 of the function's code object as loaded, and the target distribution (version and
  the sha256 of its RECORD, which lists the hash of every installed file).

An import guard's entry (its sniff imports the module in two child interpreters: seconds,
so ``status`` and ``check`` reuse it) is keyed instead on the interpreter, ``sys.path``, the
guarded module's file (sha256) and distribution (version, RECORD's sha256), the vendored
folder, our own files, a plugin's parts as above, and what every folder of ``sys.path``
offers an import (package and module names, each distribution's metadata by size and
mtime: flash-attn-4, which the vendored guard asks about, and whatever the module imports).

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
written whole (a temporary file renamed into place), one per backport id.

A verdict decides whether a fix runs, so the cache is trusted as pip and git trust theirs:
a folder or file owned by another user, or writable by every user, is refused (said once,
in one line), and only a regular file of at most ``MAX_BYTES`` is read (a FIFO or a link to
``/dev/zero`` at its path must not hang or exhaust every process that imports megatron).
"""

import hashlib
import importlib.metadata
import json
import logging
import marshal
import os
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import switches
from .activation import once_per_job
from .errors import BackportWarning
from .model import BackportSpec, Target
from .one_look import remembered
from .targets import find_loaded_target
from .vendored_sniff import UPSTREAM_ONLY, WITH_LOCAL_CHANGES
from .versions import installed_distribution

__all__ = ["CACHE", "CACHE_DIR", "FORMAT", "enabled", "fingerprint", "load", "locations", "store"]

CACHE = "MEGATRON_BACKPORTS_CACHE"  # off: never read or write the cache
CACHE_DIR = "MEGATRON_BACKPORTS_CACHE_DIR"  # where the cache lives (default: see above)
# Bump when the file layout or the key's meaning changes. 2: a ``needed`` verdict carries
# the sniff on the vendored replacement (files of 1 were proved without it).
FORMAT = 2
KEPT = ("needed", "upstream")
MAX_BYTES = 1 << 20  # an entry is a few kB; anything larger is not one of ours

_LOG = logging.getLogger("backports.megatron")
_PACKAGE_DIR = Path(__file__).resolve().parent


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


def _targets(spec: BackportSpec) -> tuple[Target, ...]:
    # A catalog entry may list several targets (``targets``) or one (``target``).
    many = getattr(spec, "targets", None)
    return tuple(many) if many else (spec.target,)


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(folder: str) -> Iterator[os.DirEntry[str]]:
    """Every file below ``folder`` but bytecode and temporary files, in a stable order.

    ``os.scandir``, not ``os.walk`` and ``Path``: this runs in every process that imports
    megatron, and the difference is ~1.5 ms against ~0.1 ms here."""
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from _files(entry.path)
        elif not entry.name.endswith((".pyc", ".tmp")):
            yield entry


def _our_code() -> dict[str, Any]:
    """Our own files, by size and mtime: an upgrade or an edit of the probe, the catalog or a
    sniff changes what a verdict means."""
    digest = hashlib.sha256()
    for entry in _files(str(_PACKAGE_DIR)):
        stat = entry.stat()
        digest.update(f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return {"dir": str(_PACKAGE_DIR), "files": digest.hexdigest()}


def _vendored(spec: BackportSpec) -> str:
    """sha256 over the content of every file of the entry's vendored folder."""
    package = sys.modules.get(spec.vendored.package) or __import__(
        spec.vendored.package, fromlist=["__path__"]
    )
    digest = hashlib.sha256()
    for folder in package.__path__:
        for entry in _files(folder):
            digest.update(f"{entry.name}\0{_sha256_file(Path(entry.path))}\n".encode())
    return digest.hexdigest()


def _distribution(name: str, module: str, source: str) -> dict[str, Any] | None:
    """The installed distribution that ``source`` belongs to, or None if it does not."""
    found = remembered(("verdict_cache", name), lambda: _record(name))
    if found is None:
        return None
    dist, key = found
    relative = module.replace(".", "/") + (
        "/__init__.py" if source.endswith("__init__.py") else ".py"
    )
    owned = Path(str(dist.locate_file(relative)))
    if not owned.is_file() or not owned.samefile(source):
        return None
    return dict(key)


def _record(name: str) -> tuple[importlib.metadata.Distribution, dict[str, Any]] | None:
    """The distribution, and what of it goes into a key: its version, and its RECORD's
    sha256 (a reinstall that changes any file changes it)."""
    dist, record = installed_distribution(name)
    if dist is None or record is None:
        return None
    key = {
        "name": name,
        "version": dist.version,
        "record_sha256": hashlib.sha256(record.encode()).hexdigest(),
    }
    return dist, key


def _target(target: Target, backport_id: str) -> dict[str, Any] | None:
    """The loaded target as it stands; None when it cannot be keyed (so: probe)."""
    found = find_loaded_target(target, backport_id)
    if found is None or found.foreign is not None or found.installed is not None:
        return None
    source = getattr(found.module, "__file__", None)
    if not source or not os.path.isfile(source):
        return None
    distribution = _distribution(target.distribution, found.module_name, str(source))
    if distribution is None:
        return None
    return {
        "module": found.module_name,
        "imported_as": found.imported_as,
        "file": str(source),
        "file_sha256": _sha256_file(Path(source)),
        # As loaded: an in-memory replacement compiled under the module's file name too.
        "code_sha256": hashlib.sha256(marshal.dumps(_code(found.original))).hexdigest(),
        "distribution": distribution,
    }


def _code(original: Any) -> Any:
    """The code object of a target as the class or module holds it (a staticmethod's own)."""
    return (original.__func__ if isinstance(original, staticmethod) else original).__code__


def _module_sha256(name: str) -> str | None:
    source = getattr(sys.modules.get(name), "__file__", None)
    if not source or not os.path.isfile(source):
        return None
    return _sha256_file(Path(source))


def _plugin(spec: BackportSpec, where: tuple[str, str]) -> dict[str, Any]:
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


def fingerprint(spec: BackportSpec) -> dict[str, Any] | None:
    """Everything that decides ``spec``'s verdict here, or None if a target is not loaded
    (an import guard: None if its module is not a file of the installed distribution)."""
    if spec.guard is not None:
        return _guard_key(spec)
    targets = []
    for target in _targets(spec):
        keyed = _target(target, spec.id)
        if keyed is None:
            return None
        targets.append(keyed)
    torch = sys.modules.get("torch")
    key = {
        "format": FORMAT,
        "python": [sys.version, sys.implementation.cache_tag],
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "megatron_backports": remembered(("verdict_cache", "our code"), _our_code),
        "vendored_sha256": _vendored(spec),
        "id": spec.id,
        "targets": targets,
    }
    return _with_plugin(spec, key)


def _with_plugin(spec: BackportSpec, key: dict[str, Any]) -> dict[str, Any]:
    from .catalog import origin  # the catalog imports the entries: only a key needs it

    where = origin(spec.id)
    if where is not None:  # a builtin's key stays as it was: its code is ours
        key["plugin"] = _plugin(spec, where)
    return key


# ---- an import guard's key -----------------------------------------------------------------
# Its sniff imports the guarded module in child interpreters, one per guard (stock and
# vendored, side by side), each with a stale ``flash_attn`` first on this process's
# ``sys.path`` and the backports off: seconds of torch and megatron imports that ``status``
# and ``check`` would pay in every run. What the children's answer depends on: the
# interpreter, the path they search, the module's file and every file its distribution
# installed, the vendored guard, our own code (the sniff, the child's script, the stale
# stub) and whatever else the import reaches on that path: any distribution (flash-attn,
# flash-attn-4 -- which the vendored guard asks importlib.metadata about --,
# nvidia-cutlass-dsl, torch, Transformer Engine...) or a package put there by hand. Not
# keyed: environment variables the import may read (keying on all of them would never hit);
# MEGATRON_BACKPORTS_CACHE=0 probes afresh.

# What an import can reach in a folder of sys.path: a package or namespace folder, a module,
# an extension; and the metadata of each distribution installed there.
_MODULE_SUFFIXES = (".py", ".so", ".pyd")
_INSTALLED_SUFFIXES = (".egg-link", ".egg")  # older installs: a link or an archive
_METADATA = ("RECORD", "METADATA", "PKG-INFO")


def _module_file(module: str) -> Path | None:
    """The guarded module's file as a child with this ``sys.path`` finds it, without
    importing anything (megatron's packages import it)."""
    relative = Path(*module.split("."))
    for entry in sys.path:
        for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):
            path = Path(entry or ".") / candidate
            if path.is_file():
                return path
    return None


def _folder_contents(folder: str) -> list[Any]:
    """What an import can find in one folder of ``sys.path``: the names of its packages,
    modules and distributions, with the size and mtime of each distribution's metadata (a
    reinstall rewrites RECORD). ``.pth`` files are left out: what they add to the path is
    in ``sys.path`` itself, and the start-up hook's own file changes nothing in a child
    that runs with the backports off."""
    try:
        listing = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:  # a zip file, a missing folder: its path alone stands for it
        return []
    found: list[Any] = []
    for entry in listing:
        name = entry.name
        if name.endswith((".dist-info", ".egg-info")) and entry.is_dir():
            stats = []
            for meta in _METADATA:
                try:
                    status = os.stat(os.path.join(entry.path, meta))
                except OSError:
                    continue
                stats.append([meta, status.st_size, status.st_mtime_ns])
            found.append([name, stats])
        elif _importable(name, entry):
            found.append(name)
    return found


def _importable(name: str, entry: os.DirEntry[str]) -> bool:
    """Whether ``import <stem>`` could find ``name``: a package folder named as a module,
    or a module or extension file (``foo.py``, ``foo.cpython-312-x86_64-linux-gnu.so``).
    Not ``__pycache__``, a README or a ``tmp-1234`` folder: they come and go (in a working
    directory on the path, say) and no import reaches them."""
    if name == "__pycache__":
        return False
    if name.endswith(_INSTALLED_SUFFIXES):
        return True
    if "." not in name:
        return name.isidentifier() and entry.is_dir()
    return name.partition(".")[0].isidentifier() and name.endswith(_MODULE_SUFFIXES)


def _environment() -> str:
    """sha256 over what every folder of ``sys.path`` offers an import (``_folder_contents``).
    An install, an upgrade or an uninstall by pip changes it; an edit in place of another
    package's file, outside pip, does not (as for any target's helpers)."""
    digest = hashlib.sha256()
    for folder in sys.path:  # where each folder is, and their order: the "sys_path" part
        contents = _folder_contents(folder or ".")
        if contents:
            digest.update(json.dumps(contents).encode() + b"\n")
    return digest.hexdigest()


def _guard_key(spec: BackportSpec) -> dict[str, Any] | None:
    guard = spec.guard
    assert guard is not None
    module = guard.modules[0]
    source = _module_file(module)
    if source is None:
        return None
    distribution = _distribution(guard.distribution, module, str(source))
    if distribution is None:  # a source checkout or an editable install: RECORD does not follow it
        return None
    key = {
        "format": FORMAT,
        "id": spec.id,
        "kind": "import-guard",
        "python": [sys.executable, sys.version, sys.implementation.cache_tag],
        "sys_path": list(sys.path),  # the children's PYTHONPATH
        "module": {"name": module, "file": str(source), "file_sha256": _sha256_file(source)},
        "distribution": distribution,
        "vendored_sha256": _vendored(spec),
        "megatron_backports": remembered(("verdict_cache", "our code"), _our_code),
        "environment": remembered(("verdict_cache", "environment"), _environment),
    }
    return _with_plugin(spec, key)


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


# ---- read and write ------------------------------------------------------------------------


def _file_name(spec: BackportSpec) -> str:
    return f"{spec.id}.json"


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
    spec: BackportSpec, key: dict[str, Any], *, upstream_only: bool | None = None
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
    path = folder / _file_name(spec)
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
    spec: BackportSpec, key: dict[str, Any], verdict: str, reason: str, evidence: dict[str, Any]
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
            return _write_atomically(folder, _file_name(spec), text)
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
