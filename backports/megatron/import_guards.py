"""Run a module's execution inside a guard: the install kind for fixes to module-level code.

A backport of a function rebinds it after the import; a fix to what a module does while it
executes (a probe of optional packages at import time, say) must be in place before that
execution starts. ``install`` has the post-import finder (``activation.post_import``, the
one finder of ours in ``sys.meta_path``) run each execution of the guarded module inside
``guard()``, the vendored context manager. ``apply()`` installs it before the module's
first import (the start-up hook fires on ``megatron``'s first lookup); ``uninstall``
drops it. A module executed before the install is not re-executed: a reload or a fresh
import runs guarded. This module keeps the bookkeeping: which guard each backport
installed, and how each guarded execution ended.

Standard library only (and ``post_import``): the start-up path may import this before
anything of megatron.
"""

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .activation import post_import

__all__ = ["GuardInstallation", "GuardTarget", "install", "installed", "no_guard", "uninstall"]

Guard = Callable[[], contextlib.AbstractContextManager[Any]]

_LOCK = threading.RLock()
_INSTALLED: dict[str, "GuardInstallation"] = {}


@contextlib.contextmanager
def no_guard() -> Iterator[None]:
    """The guard in force when none is installed: the module's code as it stands."""
    yield


@dataclass(frozen=True)
class GuardTarget:
    """What an import guard's sniff judges: ``module_name`` imported under ``original``."""

    module_name: str
    original: Guard
    installed: Guard | None = None


@dataclass
class GuardInstallation:
    """One backport's guard, and what it did to each guarded execution so far."""

    backport_id: str
    module_name: str
    guard: Guard
    mode: str
    # One entry per guarded execution: "ok", or the exception's "Type: message".
    executions: list[str] = field(default_factory=list)

    @property
    def replacement(self) -> Guard:
        return self.guard


def _key(backport_id: str) -> str:
    return f"import-guard:{backport_id}"  # its post_import key


def _around(installation: GuardInstallation) -> post_import.Around:
    """What post_import runs each execution of the guarded module inside: the guard, and
    a note of how the execution ended."""

    @contextlib.contextmanager
    def guarded(module: ModuleType) -> Iterator[None]:
        try:
            with installation.guard():
                yield
        except BaseException as exc:
            installation.executions.append(f"{type(exc).__name__}: {exc}")
            raise
        installation.executions.append("ok")

    return guarded


def install(backport_id: str, module_name: str, guard: Guard, mode: str) -> bool:
    """Guard every later execution of ``module_name``; False if it was installed already."""
    with _LOCK:
        if backport_id in _INSTALLED:
            return False
        installation = GuardInstallation(backport_id, module_name, guard, mode)
        _INSTALLED[backport_id] = installation
        post_import.register_around(module_name, _key(backport_id), _around(installation))
        return True


def installed(backport_id: str) -> GuardInstallation | None:
    with _LOCK:
        return _INSTALLED.get(backport_id)


def uninstall(backport_id: str) -> GuardInstallation | None:
    """Remove the guard (a later execution runs unguarded); the removed one, or None."""
    with _LOCK:
        removed = _INSTALLED.pop(backport_id, None)
        post_import.unregister(_key(backport_id))
        return removed
