"""Job start for this catalog: what the hook watches and holds, and what runs when it fires.

``activation`` is the mechanism (the hook file, the triggers, the post-import finder) and
knows nothing of backports; this module gives it the catalog's answers: which packages'
first import triggers ``apply()`` (``watched_packages``), the hook file for an ``only`` /
``strict`` (``hook_text``, ``write_hook``, ``read_hook``), and ``fire``, which the trigger
in the package's ``__init__`` calls once megatron has executed. The trigger imports this
module only then: the api (and the catalog) load when megatron does, never at start-up.
"""

import logging
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

from .activation import hook_file, start_up
from .activation.hook_file import HookState
from .catalog import select
from .errors import BackportError

__all__ = [
    "fire",
    "fire_after_import",
    "hook_text",
    "read_hook",
    "start_text",
    "target_modules",
    "watched_packages",
    "write_hook",
]

_LOG = logging.getLogger("backports.megatron")


class _StrictHookFailure(BackportError):
    # A strict hook's apply() failed: the import of megatron itself must fail.
    fatal_on_import = True


# ---- what the trigger calls ----------------------------------------------------------------


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
        from .activation.once_per_job import claim

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
    The post-import finder takes the ``trigger``'s place (``start_up.hand_over``)."""

    def after_import(module: ModuleType) -> None:
        try:
            fire(config)  # raises only when strict
        except Exception as exc:
            raise _StrictHookFailure(f"the strict start-up hook failed: {exc}") from exc

    return start_up.hand_over(trigger, name, path, target, after_import)


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
