"""Job-start activation: the hook file that ``backports apply`` writes and revert removes.

Python's ``site`` runs every line of a ``site-packages/*.pth`` file that starts with
``import``, in each interpreter of the environment (torchrun ranks, Ray and
multiprocessing workers, plain ``python``). Ours is one readable line, as coverage's and
virtualenv's hooks are: if our package is still installed, import it and start the
trigger (``backports.megatron._start_up``: the package's ``__init__`` holds it, since each
module more would cost every interpreter start). After ``pip uninstall megatron-backports``
leaves the hook file behind (pip removes only what it installed) the line imports nothing:
start-up stays silent and unbroken.
"""

import ast
import importlib.metadata
import logging
import os
import site
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

from . import post_import
from .catalog import select
from .errors import BackportError

__all__ = [
    "HOOK_FILE",
    "HookState",
    "active",
    "deactivate",
    "default_site_dir",
    "fire",
    "fire_after_import",
    "hook_text",
    "is_site_dir",
    "read_hook",
    "remove_hook",
    "same_hook",
    "target_modules",
    "triggers",
    "watched_packages",
    "write_hook",
]

HOOK_FILE = "megatron_backports_startup.pth"
_MARKER = "__megatron_backports_trigger__"  # backports.megatron._TRIGGER
_CONFIG_LINE = "# config: "
_LOG = logging.getLogger("backports.megatron")
_FIRST_IMPORT = "start-up trigger"  # the post_import key of the trigger's one callback


class _StrictHookFailure(BackportError):
    # A strict hook's apply() failed: the import of megatron itself must fail.
    fatal_on_import = True


# ---- what the trigger calls, and how to find it ------------------------------------------


def fire(config: dict[str, Any]) -> None:
    """``apply(only, strict=strict)``; never breaks the import that got here, unless strict."""
    strict = bool(config.get("strict", False))
    only = config.get("only")
    try:
        from .api import apply

        apply(None if only is None else tuple(only), strict=strict)
    except Exception as exc:
        if strict:
            raise
        from .once_per_job import claim

        said = claim("start-up-apply-failed")  # once per job, as the warnings are
        _LOG.log(
            logging.ERROR if said else logging.DEBUG,
            "megatron-backports: job-start apply() failed: %r",
            exc,
        )


def fire_after_import(
    name: str,
    path: Sequence[str] | None,
    target: ModuleType | None,
    config: dict[str, Any],
    trigger: object = None,
) -> ModuleSpec | None:
    """``name``'s spec, whose loader runs ``fire(config)`` once the package has executed and
    sits in ``sys.modules``: a plugin that imports megatron then finds that very module.
    The post-import finder takes the ``trigger``'s place: one finder from here on. None
    (nothing to watch) when no other finder finds ``name``."""

    def after_import(module: ModuleType) -> None:
        post_import.unregister(_FIRST_IMPORT)  # once: a re-import does not apply again
        try:
            fire(config)  # raises only when strict
        except Exception as exc:
            raise _StrictHookFailure(f"the strict start-up hook failed: {exc}") from exc

    post_import.take_place_of(trigger)
    post_import.register(name, _FIRST_IMPORT, after_import)
    spec = post_import.watched_spec(name, path, target)
    if spec is None:
        post_import.unregister(_FIRST_IMPORT)
    return spec


def triggers() -> list[Any]:
    """The start-up triggers in ``sys.meta_path`` (fired ones included)."""
    return [finder for finder in sys.meta_path if getattr(finder, _MARKER, False)]


def active() -> bool:
    """Whether a trigger in this interpreter still waits for megatron's first import."""
    return any(not trigger.fired for trigger in triggers())


def deactivate() -> None:
    """Drop the triggers (the CLI and ``audit``'s probe decide explicitly). Not from a finder:
    removing from ``sys.meta_path`` while the import system iterates it skips an entry."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not getattr(finder, _MARKER, False)]
    post_import.unregister(_FIRST_IMPORT)


# ---- what the hook file holds ------------------------------------------------------------


def target_modules(only: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Every module name the (selected) backports may patch, in catalog order."""
    specs = select(only)
    return tuple(
        dict.fromkeys(m for spec in specs for target in spec.targets for m in target.modules)
    )


def watched_packages(only: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The top-level packages whose first import triggers ``apply()``."""
    return tuple(dict.fromkeys(name.partition(".")[0] for name in target_modules(only)))


def _hook_line(packages: tuple[str, ...], config: dict[str, Any]) -> str:
    # `site` execs a .pth line only if it starts with "import", and prints a traceback
    # for one that raises: the file check keeps the line silent once we are uninstalled,
    # and asking the finders for `backports` first keeps it silent in an interpreter that
    # reads this folder but cannot import us (a copied venv, `-I -S` + site.addsitedir).
    # The finders are already loaded: no import is added to every interpreter's start.
    # An editable install also needs its .dist-info checked (see _still_installed).
    package = str(Path(__file__).with_name("__init__.py"))
    return (
        f"import os, sys; os.path.isfile({package!r}) and any(getattr(f, 'find_spec', None) "
        f"and f.find_spec('backports', None) for f in sys.meta_path) and {_still_installed()}"
        f"__import__('backports.megatron', fromlist=['_start_up'])._start_up({packages!r}, "
        f"{config!r})\n"
    )


def _still_installed() -> str:
    """For an editable install, the hook line's check that the distribution is still there.

    ``pip uninstall`` of a wheel removes the package's files, so the ``__init__.py`` check
    is enough. An editable install's files stay in the checkout while pip removes its
    metadata and the finder that made the package importable: the import would then fail
    with a traceback at every interpreter start. So, for one, the line also looks for our
    ``.dist-info`` in the site dir that held it (any version: an upgrade keeps the hook).
    """
    try:
        distribution = importlib.metadata.distribution("megatron-backports")
    except importlib.metadata.PackageNotFoundError:
        return ""  # run from a source tree: nothing else to check
    site_dir = Path(str(distribution.locate_file(""))).resolve()
    if Path(__file__).resolve().is_relative_to(site_dir):
        return ""  # installed into the site dir: uninstalling removes __init__.py
    return (
        f"any(n.startswith('megatron_backports-') and n.endswith('.dist-info') "
        f"for n in os.listdir({str(site_dir)!r})) and "
    )


def hook_text(only: tuple[str, ...] | None = None, strict: bool = False) -> str:
    """The whole hook file this package writes for this interpreter and catalog."""
    packages = watched_packages(only)
    config = {"strict": strict, "only": only}
    return (
        "# megatron-backports: activates the backports in every Python process of this\n"
        "# environment. Written by `backports apply`, removed by `backports revert`; does\n"
        "# nothing under MEGATRON_BACKPORTS=0 or once megatron-backports is uninstalled.\n"
        f"# The line imports backports.megatron ({_version()}), whose trigger waits for the "
        f"first import of {', '.join(packages)}.\n"
        f"{_CONFIG_LINE}{config!r}\n" + _hook_line(packages, config)
    )


def _version() -> str:
    try:
        return f"megatron-backports {importlib.metadata.version('megatron-backports')}"
    except importlib.metadata.PackageNotFoundError:
        return "megatron-backports, not installed as a distribution"


@dataclass(frozen=True)
class HookState:
    """The hook file at ``path``; ``config`` is None when it is not a file we wrote."""

    path: Path
    exists: bool
    config: dict[str, Any] | None = None

    @property
    def current(self) -> bool:
        """Written by this version for this interpreter (else: rerun ``backports apply``)."""
        if not self.exists or self.config is None:
            return False
        try:
            expected = hook_text(self.config.get("only"), bool(self.config.get("strict")))
            return same_hook(self.path.read_text(encoding="utf-8"), expected)
        except (OSError, BackportError, TypeError):
            return False


def same_hook(a: str, b: str) -> bool:
    """Whether two hook files are the same (the text is the whole hook: no compiled bytes)."""
    return a == b


def _parse(text: str) -> dict[str, Any] | None:
    for line in text.splitlines():
        if line.startswith(_CONFIG_LINE):
            try:
                config = ast.literal_eval(line[len(_CONFIG_LINE) :])
            except (ValueError, SyntaxError):
                return None
            return config if isinstance(config, dict) else None
    return None


def read_hook(site_dir: Path) -> HookState:
    path = site_dir / HOOK_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return HookState(path, False)
    return HookState(path, True, _parse(text))


# ---- where it goes -----------------------------------------------------------------------


def default_site_dir() -> Path:
    """The running interpreter's site-packages (the venv's, for a venv's ``backports``)."""
    return Path(sysconfig.get_paths()["purelib"])


def is_site_dir(folder: Path) -> bool:
    """Whether start-up processes ``.pth`` files in ``folder`` for this interpreter."""
    known = [d for d in {*site.getsitepackages(), site.getusersitepackages()} if os.path.isdir(d)]
    return folder.is_dir() and any(os.path.samefile(folder, d) for d in known)


def write_hook(
    site_dir: Path, only: tuple[str, ...] | None = None, strict: bool = False
) -> tuple[HookState, bool]:
    """Write (or refresh) the hook file; returns its state and whether the file changed."""
    path = site_dir / HOOK_FILE
    text = hook_text(only, strict)
    written = HookState(path, True, _parse(text))
    try:
        if same_hook(path.read_text(encoding="utf-8"), text):
            return written, False
    except FileNotFoundError:
        pass
    # Atomic: an interpreter starting meanwhile sees the old file or the new, never half.
    fd, tmp = tempfile.mkstemp(prefix=".megatron_backports.", suffix=".tmp", dir=site_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return written, True


def remove_hook(site_dir: Path) -> tuple[HookState, bool]:
    """Delete the hook file; returns its state before and whether this call removed it."""
    state = read_hook(site_dir)
    try:
        state.path.unlink()
    except FileNotFoundError:
        return state, False
    return state, True
