"""Fingerprints of files and distributions: what a cached verdict is keyed on.

A verdict proved in one process is reused in another only if every file and distribution
that decided it is unchanged (``decision.verdict_cache``). These are the readings: a file's
sha256, an installed distribution's version and RECORD, our own files by size and mtime,
what each folder of ``sys.path`` offers an import. ``os.scandir``, not ``os.walk`` and
``Path``: this runs in every process that imports megatron.
"""

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .one_look import remembered
from .versions import installed_distribution

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # backports/megatron

# What an import can reach in a folder of sys.path: a package or namespace folder, a module,
# an extension; and the metadata of each distribution installed there.
_MODULE_SUFFIXES = (".py", ".so", ".pyd")
_INSTALLED_SUFFIXES = (".egg-link", ".egg")  # older installs: a link or an archive
_METADATA = ("RECORD", "METADATA", "PKG-INFO")


def interpreter() -> list[str]:
    """The interpreter a proof holds for: the real binary (links resolved, and a venv's
    ``bin/python`` followed to the base interpreter it runs), the full version and the
    bytecode tag. Never the name it was started by: ``python``, ``python3``, ``python3.12``,
    a venv's link or a second venv over the same packages run the same code."""
    started = getattr(sys, "_base_executable", None) or sys.executable
    return [os.path.realpath(started), sys.version, sys.implementation.cache_tag]


def sha256_file(path: Path | str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def files_below(folder: str) -> Iterator[os.DirEntry[str]]:
    """Every file below ``folder`` but bytecode and temporary files, in a stable order."""
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from files_below(entry.path)
        elif not entry.name.endswith((".pyc", ".tmp")):
            yield entry


# Where an installed wheel keeps the vendored folders: each entry's key has its own folder's
# hash, so an edit of one entry's vendored code leaves the other entries' proofs standing.
_VENDORED_INSIDE = _PACKAGE_DIR / "_vendor"


def _read_our_code() -> dict[str, Any]:
    digest = hashlib.sha256()
    for entry in files_below(str(_PACKAGE_DIR)):
        if Path(entry.path).is_relative_to(_VENDORED_INSIDE):
            continue
        stat = entry.stat()
        digest.update(f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return {"dir": str(_PACKAGE_DIR), "files": digest.hexdigest()}


def our_code() -> dict[str, Any]:
    """Our own files, by size and mtime: an upgrade or an edit of the probe, the catalog or a
    sniff changes what a verdict means (read once per look)."""
    return remembered(("fingerprints", "our code"), _read_our_code)


def _record(name: str) -> dict[str, Any] | None:
    dist, record = installed_distribution(name)
    if dist is None or record is None:
        return None
    return {
        "name": name,
        "version": dist.version,
        "record_sha256": hashlib.sha256(record.encode()).hexdigest(),
    }


def installed_file(name: str, module: str, source: object) -> dict[str, Any] | None:
    """``source``, the file of ``module``, keyed as the distribution ``name`` installed it
    (``file``, ``file_sha256``, ``distribution``: what a kind's fingerprint holds of it);
    None where there is no such file or it is not that distribution's (a checkout, an
    editable install: nothing then says when it changes)."""
    if not isinstance(source, str | os.PathLike) or not os.path.isfile(source):
        return None
    distribution = distribution_of(name, module, str(source))
    if distribution is None:
        return None
    return {
        # Resolved: a venv reached through a link to its folder is the same install.
        "file": os.path.realpath(source),
        "file_sha256": sha256_file(str(source)),
        "distribution": distribution,
    }


def distribution_of(name: str, module: str, source: str) -> dict[str, Any] | None:
    """The installed distribution ``name`` (version, RECORD's sha256: a reinstall that
    changes any file changes it) when ``source`` is its file of ``module``; None when it is
    not (a source checkout or an editable install, whose other files RECORD does not follow)."""
    key = remembered(("fingerprints", "record", name), lambda: _record(name))
    if key is None:
        return None
    dist, _ = installed_distribution(name)
    assert dist is not None
    relative = module.replace(".", "/") + (
        "/__init__.py" if source.endswith("__init__.py") else ".py"
    )
    owned = Path(str(dist.locate_file(relative)))
    if not owned.is_file() or not owned.samefile(source):
        return None
    return dict(key)


def module_file(module: str, path: Sequence[str] | None = None) -> Path | None:
    """A module's source file as an interpreter searching ``path`` (default: this
    ``sys.path``) finds it, importing nothing (importing a package of it may import the
    module)."""
    relative = Path(*module.split("."))
    for entry in sys.path if path is None else path:
        for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):
            found = Path(entry or ".") / candidate
            if found.is_file():
                return found
    return None


def _importable(name: str, entry: os.DirEntry[str]) -> bool:
    """Whether ``import <stem>`` could find ``name``: a package folder named as a module,
    or a module or extension file. Not ``__pycache__``, a README or a ``tmp-1234`` folder:
    they come and go (in a working directory on the path, say) and no import reaches them."""
    if name == "__pycache__":
        return False
    if name.endswith(_INSTALLED_SUFFIXES):
        return True
    if "." not in name:
        return name.isidentifier() and entry.is_dir()
    return name.partition(".")[0].isidentifier() and name.endswith(_MODULE_SUFFIXES)


def _folder_contents(folder: str) -> list[Any]:
    """What an import can find in one folder of ``sys.path``: the names of its packages,
    modules and distributions, with the size and mtime of each distribution's metadata (a
    reinstall rewrites RECORD). ``.pth`` files are left out: what they add to the path is
    in ``sys.path`` itself."""
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


def offering_imports(path: Sequence[str], names: Iterable[str] | None = None) -> list[str]:
    """The folders of ``path`` that can change what a child imports: with ``names`` None,
    every folder that offers an import of anything (a ``bin/`` folder of scripts, an empty
    folder: none); else a folder pip installs into, one that offers one of ``names``
    (top-level names the child imports), or one that offers a name another folder of
    ``path`` offers too (which comes first decides).
    A job's own script folder (``train.py``, ``data_utils.py``) is then no part of it: the
    proof ``backports apply`` keeps holds in the job (read once per look)."""
    path = [folder for folder in path if not _inside_a_package(folder, path)]
    offered = [(folder, _offered(folder)) for folder in path]
    if names is None:
        return [folder for folder, found in offered if found]
    # A clash needs a module or a regular package on each side: a bare folder (``venv/``
    # beside a job's script) is a namespace portion that no regular package gives way to.
    regular = {folder: _regular(folder, found) for folder, found in offered}
    counts: dict[str, int] = {}
    for names_here in regular.values():
        for name in names_here:
            counts[name] = counts.get(name, 0) + 1
    wanted = frozenset(names)
    return [
        folder
        for folder, found in offered
        if _holds_distributions(folder)
        or not found.isdisjoint(wanted)
        or any(counts[name] > 1 for name in regular[folder])
    ]


def _regular(folder: str, names: frozenset[str]) -> frozenset[str]:
    """The names of ``folder`` that are modules or regular packages (an ``__init__.py``)
    (read once per look: with strings, not ``Path`` objects, as it runs for every name of
    every folder of the path)."""

    def read() -> frozenset[str]:
        return frozenset(
            name
            for name in names
            if not os.path.isdir(os.path.join(folder, name))
            or os.path.isfile(os.path.join(folder, name, "__init__.py"))
        )

    return remembered(("fingerprints", "regular", folder, names), read)


def _holds_distributions(folder: str) -> bool:
    """Whether pip installs into ``folder`` (it holds ``.dist-info`` / ``.egg-info``): an
    install there can change what any import finds."""
    return any(not isinstance(item, str) for item in _folder_contents(folder))


def _inside_a_package(folder: str, path: Sequence[str]) -> bool:
    """Whether ``folder`` lies inside a package of another folder of ``path`` (setuptools
    puts its ``_vendor`` folder on the path when something imports it): an import that
    happened here, not where the child's modules come from; it would key a proof taken
    after that import apart from a process that has not made it yet (read once per look)."""

    def read() -> bool:
        here = Path(folder)
        for other in path:
            if other and other != folder and here.is_relative_to(other):
                first = here.relative_to(other).parts[0]
                if os.path.isfile(os.path.join(other, first, "__init__.py")):
                    return True
        return False

    return remembered(("fingerprints", "inside-a-package", folder, tuple(path)), read)


def _offered(folder: str) -> frozenset[str]:
    """The top-level names a folder offers: "torch", "six.py" -> "six", "x.cpython-312.so"
    -> "x"; a distribution's metadata folder by its project name."""
    return remembered(
        ("fingerprints", "offers", folder),
        lambda: frozenset(
            item.partition(".")[0] if isinstance(item, str) else str(item[0]).partition("-")[0]
            for item in _folder_contents(folder)
        ),
    )


def _read_import_environment() -> str:
    digest = hashlib.sha256()
    for folder in offering_imports(sys.path, ()):  # where each folder is, and their order
        where = os.path.realpath(folder)  # the same folder, through a link or not
        digest.update(json.dumps([where, _folder_contents(folder)]).encode() + b"\n")
    return digest.hexdigest()


def import_environment() -> str:
    """sha256 over what the folders of ``sys.path`` that can change an import offer (those
    pip installs into, and any that shadows another: ``offering_imports``). An install, an
    upgrade or an uninstall by pip changes it; an edit in place of another package's file,
    outside pip, does not; nor does the folder of the script a job runs (read once per
    look)."""
    return remembered(("fingerprints", "environment"), _read_import_environment)
