"""The hook file that ``backports apply`` writes and revert removes, and where it goes.

Python's ``site`` runs every line of a ``site-packages/*.pth`` file that starts with
``import``, in each interpreter of the environment (torchrun ranks, Ray and
multiprocessing workers, plain ``python``). Ours is one readable line, as coverage's and
virtualenv's hooks are: if our package is still installed, import it and start the
trigger (``backports.megatron._start_up``: the package's ``__init__`` holds it, since each
module more would cost every interpreter start). After ``pip uninstall megatron-backports``
leaves the hook file behind (pip removes only what it installed) the line imports nothing:
start-up stays silent and unbroken.

Python 3.15 (PEP 829) runs entry points named in ``site-packages/*.start`` files, and a
``<name>.start`` beside ``<name>.pth`` turns that ``.pth`` file's import lines off (3.18
ignores them everywhere). So the hook is two files of one name: the ``.pth`` line for
Pythons before 3.15, and a ``.start`` file naming a zero-argument entry point
(``backports.megatron:_start_up_from_start_file``) that reads what to watch and the config
from the ``.start`` file itself: on any Python exactly one of them runs. Unlike the ``.pth``
line, an entry point cannot check first that the package is still installed: run
``backports revert`` before ``pip uninstall`` on 3.15+, or ``site`` says once per
interpreter that it cannot import the entry point.

The mechanism only: the caller says which packages the trigger watches and which config it
fires with (``backports.megatron.job.startup_hook`` works them out from the catalog).
"""

import ast
import importlib.metadata
import os
import site
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BackportError

HOOK_FILE = "megatron_backports_startup.pth"
# PEP 829: the same name, so that on Python 3.15+ it replaces the .pth file's import line.
START_FILE = "megatron_backports_startup.start"
START_ENTRY_POINT = "backports.megatron:_start_up_from_start_file"
_CONFIG_LINE = "# config: "
# The file the hook line checks for: the package whose __init__ holds the trigger.
_PACKAGE_INIT = Path(__file__).parents[1] / "__init__.py"

ExpectedText = Callable[[dict[str, Any]], str]  # a hook's config -> the text to write now


# ---- what the hook file holds ------------------------------------------------------------


def _hook_line(packages: tuple[str, ...], config: dict[str, Any]) -> str:
    # `site` execs a .pth line only if it starts with "import", and prints a traceback
    # for one that raises: the file check keeps the line silent once we are uninstalled,
    # and asking the finders for `backports` first keeps it silent in an interpreter that
    # reads this folder but cannot import us (a copied venv, `-I -S` + site.addsitedir).
    # The finders are already loaded: no import is added to every interpreter's start.
    # An editable install also needs its .dist-info checked (see _still_installed).
    package = str(_PACKAGE_INIT)
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


def render(packages: tuple[str, ...], config: dict[str, Any]) -> str:
    """The whole hook file for this interpreter: a trigger that waits for the first import
    of ``packages``, then fires with ``config`` (``apply()``'s arguments)."""
    return (
        "# megatron-backports: activates the backports in every Python process of this\n"
        "# environment. Written by `backports apply`, removed by `backports revert`; does\n"
        "# nothing under MEGATRON_BACKPORTS=0 or once megatron-backports is uninstalled.\n"
        f"# The line imports backports.megatron ({_version()}), whose trigger waits for the "
        f"first import of {', '.join(packages)}.\n"
        f"{_CONFIG_LINE}{config!r}\n" + _hook_line(packages, config)
    )


def render_start(packages: tuple[str, ...], config: dict[str, Any]) -> str:
    """The whole ``.start`` file for the same hook: the entry point, and in comment lines
    (``# key: value``, read without ``ast``: it runs at every interpreter start) the
    packages to watch and ``config``. Ids hold no comma (``MEGATRON_BACKPORTS_SKIP`` splits
    on it)."""
    only = config.get("only")
    return (
        "# megatron-backports: the start-up hook for Python 3.15+ (PEP 829); it turns off the\n"
        f"# import line of {HOOK_FILE} beside it, which older Pythons run instead.\n"
        "# Written by `backports apply`, removed by `backports revert`.\n"
        f"# watch: {','.join(packages)}\n"
        f"# only: {'*' if only is None else ','.join(only)}\n"
        f"# strict: {'yes' if config.get('strict') else 'no'}\n"
        f"{START_ENTRY_POINT}\n"
    )


def _version() -> str:
    try:
        return f"megatron-backports {importlib.metadata.version('megatron-backports')}"
    except importlib.metadata.PackageNotFoundError:
        return "megatron-backports, not installed as a distribution"


@dataclass(frozen=True)
class HookState:
    """The hook file at ``path``; ``config`` is None when it is not a file we wrote.

    ``current``: it holds what would be written now, for its own config, and so does the
    ``.start`` file beside it (else: rerun ``backports apply``). Only a reader told those
    texts can say: False otherwise.
    """

    path: Path
    exists: bool
    config: dict[str, Any] | None = None
    current: bool = False
    start_exists: bool = False
    # Its import line hands ``config`` to ``backports.megatron._start_up`` (the address every
    # version's hook calls): it patches every new process even where it is not ``current``
    # (written by an earlier version, before an in-place upgrade).
    working: bool = False

    @property
    def start_path(self) -> Path:
        """The ``.start`` file of the same hook (PEP 829), beside the ``.pth`` file."""
        return self.path.with_name(START_FILE)


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


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def read_hook(
    site_dir: Path,
    expected: ExpectedText | None = None,
    expected_start: ExpectedText | None = None,
) -> HookState:
    """The hook files in ``site_dir``, each read once; ``expected(config)`` and
    ``expected_start(config)`` are the texts a rewrite would hold now (``current`` compares)."""
    path = site_dir / HOOK_FILE
    start = _read(path.with_name(START_FILE))
    text = _read(path)
    if text is None:
        return HookState(path, False, start_exists=start is not None)
    config = _parse(text)
    current = _is_current(text, config, expected) and (
        start is not None and _is_current(start, config, expected_start)
    )
    working = config is not None and any(
        line.startswith("import ") and "backports.megatron" in line and "._start_up(" in line
        for line in text.splitlines()
    )
    return HookState(path, True, config, current, start is not None, working)


def _is_current(text: str, config: dict[str, Any] | None, expected: ExpectedText | None) -> bool:
    if config is None or expected is None:
        return False
    try:
        return same_hook(text, expected(config))
    except (BackportError, TypeError):
        return False  # a config this version cannot write (an unknown id, a wrong type)


# ---- where it goes -----------------------------------------------------------------------


def default_site_dir() -> Path:
    """The running interpreter's site-packages (the venv's, for a venv's ``backports``)."""
    return Path(sysconfig.get_paths()["purelib"])


def is_site_dir(folder: Path) -> bool:
    """Whether start-up processes ``.pth`` files in ``folder`` for this interpreter."""
    known = [d for d in {*site.getsitepackages(), site.getusersitepackages()} if os.path.isdir(d)]
    return folder.is_dir() and any(os.path.samefile(folder, d) for d in known)


def write_hook(site_dir: Path, text: str, start_text: str | None = None) -> tuple[HookState, bool]:
    """Write (or refresh) the hook file with ``text`` (from ``render``), then its ``.start``
    file with ``start_text`` (from ``render_start``); returns the state and whether a file
    changed. The ``.pth`` first: interrupted between the two, the old way still runs
    everywhere (and ``status`` says to rerun ``apply``), never a ``.start`` alone."""
    path = site_dir / HOOK_FILE
    changed = _write(path, text)
    if start_text is not None:
        changed = _write(path.with_name(START_FILE), start_text) or changed
    return HookState(path, True, _parse(text), True, start_text is not None), changed


def _write(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it holds it already; whether it did."""
    existing = _read(path)
    if existing is not None and same_hook(existing, text):
        return False
    site_dir = path.parent
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
    return True


def remove_hook(site_dir: Path) -> tuple[HookState, bool]:
    """Delete the hook files; returns their state before and whether this call removed one.
    The ``.start`` first: interrupted between the two, what is left is a ``.pth`` file that
    ``status`` shows and a second ``revert`` removes, never a ``.start`` that runs unseen."""
    state = read_hook(site_dir)
    removed = False
    # Only what exists is unlinked: a read-only site-packages without a hook is no error.
    for path, exists in ((state.start_path, state.start_exists), (state.path, state.exists)):
        if not exists:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed = True
    return state, removed
