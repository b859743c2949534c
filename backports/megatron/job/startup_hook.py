"""The start-up hook this catalog writes: which packages it watches, and what it holds.

``hook_file`` is the mechanism (render, read, write, remove the ``.pth`` file) and knows
nothing of backports; this module gives it the catalog's answers: which packages' first
import triggers ``apply()`` (``watched_packages``) and the hook file for an ``only`` /
``strict`` (``hook_text``, ``write_hook``, ``read_hook``). Only the commands load it
(``backports apply``, ``revert``, ``status``): a job's processes never do.
"""

from pathlib import Path
from typing import Any

from ..catalog import select
from . import hook_file
from .hook_file import HookState

# ---- what the hook file holds --------------------------------------------------------------


def target_modules(only: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Every module name the (selected) backports may patch, in catalog order."""
    specs = select(only)
    return tuple(
        dict.fromkeys(m for spec in specs for target in spec.targets for m in target.modules)
    )


def watched_packages(only: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The top-level packages whose first import triggers ``apply()``."""
    return tuple(dict.fromkeys(name.partition(".")[0] for name in target_modules(only)))


def hook_text(only: tuple[str, ...] | None = None, strict: bool = False) -> str:
    """The whole hook file this package writes for this interpreter and catalog."""
    return hook_file.render(watched_packages(only), {"strict": strict, "only": only})


def start_text(only: tuple[str, ...] | None = None, strict: bool = False) -> str:
    """The hook's ``.start`` file (PEP 829, Python 3.15+) for the same arguments."""
    return hook_file.render_start(watched_packages(only), {"strict": strict, "only": only})


def _text_for(config: dict[str, Any]) -> str:
    return hook_text(config.get("only"), bool(config.get("strict")))


def _start_text_for(config: dict[str, Any]) -> str:
    return start_text(config.get("only"), bool(config.get("strict")))


def read_hook(site_dir: Path) -> HookState:
    """The hook files in ``site_dir``; ``current`` when this version would write them so."""
    return hook_file.read_hook(site_dir, _text_for, _start_text_for)


def write_hook(
    site_dir: Path, only: tuple[str, ...] | None = None, strict: bool = False
) -> tuple[HookState, bool]:
    """Write (or refresh) the hook files; returns their state and whether a file changed."""
    return hook_file.write_hook(site_dir, hook_text(only, strict), start_text(only, strict))
