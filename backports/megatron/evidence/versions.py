"""The installed distribution's version and location, found without importing it.

Nothing here knows a distribution by name: the catalog's ``Target.distribution`` says which
one, and the target's modules say which of its packages is the one imported.
"""

import ast
import csv
import importlib.metadata
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .one_look import remembered


def release_predates(version: Version, release: Version) -> bool:
    """Whether ``version``'s release number is below ``release``'s: ``0.19.0rc0`` does not
    predate ``0.19`` (a pre-release of the first release with a target has the target),
    though it sorts before it. The pre-release, dev and local parts are left out."""
    return Version(version.base_version) < Version(release.base_version)


def first_release_missing(version: Version, *releases: Version | None) -> int | None:
    """The index of the first of ``releases`` that ``version`` predates (``release_predates``;
    None entries skipped), or None: one question for "before the target? before the bug?"."""
    for index, release in enumerate(releases):
        if release is not None and release_predates(version, release):
            return index
    return None


@dataclass(frozen=True)
class InstalledVersion:
    """``source`` is "metadata", "package_info" (a source tree on sys.path) or "missing"."""

    version: Version | None
    source: str
    package_dir: Path | None
    # The installed distribution's own version when the code that is (or would be)
    # imported is another tree, e.g. a source checkout first on PYTHONPATH; else None.
    distribution_version: Version | None = None
    # The distribution's package that holds the targets (e.g. "megatron.core"), if found.
    package: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {
            "version": None if self.version is None else str(self.version),
            "source": self.source,
            "package_dir": None if self.package_dir is None else str(self.package_dir),
            "distribution_version": (
                None if self.distribution_version is None else str(self.distribution_version)
            ),
            "package": self.package,
        }


def describe(distribution: str, info: dict[str, str | None]) -> str:
    """``megatron-core 0.19.2`` from ``InstalledVersion.to_dict()``, saying so when the
    imported code is not the installed distribution's."""
    text = f"{distribution} {info['version']}"
    if info.get("distribution_version"):
        text += (
            f" (imported from {info['package_dir']}; the installed {distribution} "
            f"distribution is {info['distribution_version']})"
        )
    return text


def _package_dir(package: str) -> Path | None:
    """Where ``package`` is or would be imported from, without importing it."""
    loaded = sys.modules.get(package)
    if loaded is not None and getattr(loaded, "__file__", None):
        return Path(str(loaded.__file__)).resolve().parent
    relative = Path(*package.split("."))
    for entry in sys.path:
        candidate = Path(entry or ".") / relative / "__init__.py"
        if candidate.is_file():
            return candidate.resolve().parent
    return _found_by_a_finder(package)


def _found_by_a_finder(package: str) -> Path | None:
    """Where a ``sys.meta_path`` finder would import ``package`` from (an editable install's
    finder: ``pip install -e`` of a Megatron-LM checkout puts no folder on ``sys.path``),
    asked name by name as the import system asks, without executing any module."""
    search: list[str] | None = None
    spec = None
    parts = package.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = None
        for finder in sys.meta_path:
            if type(finder).__module__.startswith("backports.megatron"):
                continue  # ours (the start-up trigger, the import finder): they fire on lookups
            find = getattr(finder, "find_spec", None)
            try:
                spec = find(name, search) if find is not None else None
            except Exception:  # a finder that cannot answer this question: ask the next
                spec = None
            if spec is not None:
                break
        if spec is None or spec.submodule_search_locations is None:
            return None
        search = list(spec.submodule_search_locations)
    origin = getattr(spec, "origin", None)
    if origin and origin.endswith("__init__.py") and Path(origin).is_file():
        return Path(origin).resolve().parent
    return None


def installed_distribution(
    distribution: str,
) -> tuple[importlib.metadata.Distribution | None, str | None]:
    """The installed distribution (None if absent) and its RECORD's text (None without one),
    read once per ``one_look()`` block: the version evidence lists packages from RECORD, the
    verdict cache's key hashes it, and a look-up scans ``sys.path``."""

    def read() -> tuple[importlib.metadata.Distribution | None, str | None]:
        try:
            dist = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            return None, None
        return dist, dist.read_text("RECORD")

    return remembered(("distribution", distribution), read)


def _metadata_version(distribution: str) -> Version | None:
    # importlib.metadata.version(), not dist.version: it is the seam tests patch to stand in
    # other releases.
    try:
        return Version(importlib.metadata.version(distribution))
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None


# What one read of a distribution finds: the distribution, its version, its packages.
_Read = tuple[importlib.metadata.Distribution | None, Version | None, list[str]]


def _read(distribution: str) -> _Read:
    """Once per ``one_look()`` block: one apply() asks for every entry's version evidence,
    and the entries share megatron-core."""

    def read() -> _Read:
        dist, record = installed_distribution(distribution)
        return dist, _metadata_version(distribution), _own_packages(dist, record)

    return remembered(("versions", distribution), read)


def _own_packages(dist: importlib.metadata.Distribution | None, record: str | None) -> list[str]:
    """The distribution's regular packages (folders with ``__init__.py``), shallowest first.

    Read from RECORD's text: ``Distribution.files`` builds a path object and stats the file
    for each of its rows (~1,100 for megatron-core, ~14 ms), once per target of every
    entry, in every process that imports megatron. ``files`` only where there is no
    RECORD (an egg-info install lists its files elsewhere).
    """
    if dist is None:
        return []
    if record is not None:
        rows = [line for line in record.splitlines() if "__init__.py" in line]  # ~1 in 12
        names = (row[0] for row in csv.reader(rows) if row)
        inits = [tuple(name.split("/")) for name in names if name.endswith("/__init__.py")]
    else:
        inits = [f.parts for f in dist.files or [] if f.name == "__init__.py"]
    found = {".".join(parts[:-1]) for parts in inits if len(parts) > 1}
    return sorted(found, key=lambda name: (name.count("."), name))


def _is_package_on_path(package: str) -> bool:
    relative = Path(*package.split(".")) / "__init__.py"
    return any((Path(entry or ".") / relative).is_file() for entry in sys.path)


def _target_package(own: list[str], modules: Sequence[str]) -> str | None:
    """The outermost regular package that holds a target module: one of the distribution's
    ``own`` packages when it is installed, else one on ``sys.path`` (a source tree).
    Without modules, the distribution's shallowest package."""
    for module in modules:
        parts = module.split(".")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if prefix in own if own else _is_package_on_path(prefix):
                return prefix
    return own[0] if own and not modules else None


# megatron's package_info.py is about 1 kB; parsing costs about 60 times a file's size.
_MAX_PACKAGE_INFO_BYTES = 64 * 1024


def _version_from_package_info(package_dir: Path) -> Version | None:
    """Read MAJOR/MINOR/PATCH/PRE_RELEASE from package_info.py without executing it.

    megatron's own ``__version__`` appends ``+<sha>`` of whatever git work tree the package
    sits in (even a user's project), so it is no evidence of which commit it is.
    """
    path = package_dir / "package_info.py"
    try:
        if path.stat().st_size > _MAX_PACKAGE_INFO_BYTES:  # not megatron's: no evidence
            return None
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, RecursionError, MemoryError):
        return None  # unreadable, or too deeply nested to parse: no evidence either
    parts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    parts[target.id] = node.value.value
    try:
        text = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"
        return Version(text)
    except (KeyError, InvalidVersion):
        return None


def _distribution_package_dir(dist: importlib.metadata.Distribution, package: str) -> Path | None:
    """Where the distribution's own ``package`` files are (None for an editable install,
    whose files are elsewhere).

    ``locate_file`` rather than the ``files`` list (see ``_own_packages``).
    """
    found = dist.locate_file("/".join([*package.split("."), "__init__.py"]))
    path = Path(str(found))
    return path.resolve().parent if path.is_file() else None


def installed_versions(
    wanted: Sequence[tuple[str, Sequence[str]]],
) -> dict[str, InstalledVersion]:
    """``installed_version`` of each (distribution, modules), the first asked of each name."""
    found: dict[str, InstalledVersion] = {}
    for distribution, modules in wanted:
        if distribution not in found:
            found[distribution] = installed_version(distribution, modules)
    return found


def installed_version(distribution: str, modules: Sequence[str] = ()) -> InstalledVersion:
    """The version of the code that is (or would be) imported, with the distribution's own
    when they differ: metadata describes what pip installed, not what ``sys.path`` finds
    first. ``modules`` are the target's candidate modules: they name the package to look
    for (default: the distribution's shallowest package)."""
    dist, metadata, own = _read(distribution)
    package = _target_package(own, modules)
    package_dir = None if package is None else _package_dir(package)
    own_dir = None
    if dist is not None and metadata is not None and package is not None:
        own_dir = _distribution_package_dir(dist, package)
    if metadata is not None and (package_dir is None or own_dir in (None, package_dir)):
        return InstalledVersion(metadata, "metadata", package_dir, package=package)
    if package_dir is not None:
        version = _version_from_package_info(package_dir)
        if version is not None:
            return InstalledVersion(version, "package_info", package_dir, metadata, package)
    if metadata is not None:
        return InstalledVersion(metadata, "metadata", package_dir, package=package)
    return InstalledVersion(None, "missing", package_dir, package=package)
