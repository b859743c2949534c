"""The ``MEGATRON_BACKPORTS*`` environment switches, read the same way everywhere.

``MEGATRON_BACKPORTS`` and ``MEGATRON_BACKPORTS_UPSTREAM_ONLY`` take the usual spellings:
``1 true on yes`` and ``0 false off no``, in any case, surrounding whitespace ignored. An
unset or empty variable means the default. Anything else is a mistake that must not pass
silently (``MEGATRON_BACKPORTS=disable`` would otherwise leave the backports on): one
``BackportWarning`` per variable and value names both and says which default holds.
``MEGATRON_BACKPORTS_SKIP`` is a comma-separated list of backport ids;
``MEGATRON_BACKPORTS_SKIP_PLUGINS`` a comma-separated list of distributions whose
``megatron_backports`` entry points are not even imported (a plugin that breaks at import).

Stdlib and ``errors`` only: the api, the CLI and ``audit`` read the switches through here.
(The start-up trigger, in ``__init__.py``, imports nothing of ours and spells ``FALSE`` out;
``tests/api/test_switches.py`` keeps the two in step.)
"""

import logging
import os
import warnings
from collections.abc import Iterable, Mapping

from .errors import BackportWarning
from .session import SESSION

ENABLE = "MEGATRON_BACKPORTS"  # off: every backport is disabled
SKIP = "MEGATRON_BACKPORTS_SKIP"  # comma-separated ids to disable
UPSTREAM_ONLY = "MEGATRON_BACKPORTS_UPSTREAM_ONLY"  # on: vendored code, no local changes
SKIP_PLUGINS = "MEGATRON_BACKPORTS_SKIP_PLUGINS"  # comma-separated distributions not to load
# Comma-separated distributions whose entries may use the builtin prefix (megatron-lm-).
ALLOW_BUILTIN_IDS = "MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS"
NAMES = (ENABLE, SKIP, UPSTREAM_ONLY, SKIP_PLUGINS)

TRUE = frozenset({"1", "true", "on", "yes"})
FALSE = frozenset({"0", "false", "off", "no"})

_LOG = logging.getLogger(__name__)


def _warn_once(name: str, raw: str, default: bool) -> None:
    message = (
        f"megatron-backports: {name}={raw!r} is neither on (1, true, on, yes) nor off "
        f"(0, false, off, no); using the default, {'on' if default else 'off'}"
    )
    _warn_once_per_job(f"{name}={raw}", message)


def _warn_once_per_job(key: str, message: str) -> None:
    with SESSION.lock:
        if f"switch:{key}" in SESSION.warned:
            return
        SESSION.warned.add(f"switch:{key}")
    from .interpreter.once_per_job import claim  # here, not at the top: only a bad value needs it

    if claim(key):  # rank 0, and not again in the children of one that warned
        warnings.warn(message, BackportWarning, stacklevel=3)
    else:
        _LOG.debug("%s", message)


def warn_unknown_skips(known: Iterable[str], environ: Mapping[str, str] | None = None) -> None:
    """One warning naming every id ``MEGATRON_BACKPORTS_SKIP`` names that no backport has.

    A misspelt id would otherwise leave the backport it meant on, silently.
    """
    unknown = sorted(skipped_ids(environ) - set(known))
    if not unknown:
        return
    listed = ", ".join(unknown)
    _warn_once_per_job(
        f"{SKIP}:{listed}",
        f"megatron-backports: {SKIP} names no backport called {listed}: it turns nothing "
        "off (`backports --help` lists the ids)",
    )


def flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """The on/off switch ``name``; ``default`` when unset, empty or not a known spelling."""
    raw = (os.environ if environ is None else environ).get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    _warn_once(name, raw, default)
    return default


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``MEGATRON_BACKPORTS``: off disables every backport; on by default."""
    return flag(ENABLE, True, environ)


def upstream_only(environ: Mapping[str, str] | None = None) -> bool:
    """``MEGATRON_BACKPORTS_UPSTREAM_ONLY``: on runs the vendored code alone; off by default."""
    return flag(UPSTREAM_ONLY, False, environ)


def _names(name: str, environ: Mapping[str, str] | None) -> frozenset[str]:
    raw = (os.environ if environ is None else environ).get(name, "")
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def skipped_ids(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The ids ``MEGATRON_BACKPORTS_SKIP`` names."""
    return _names(SKIP, environ)


def skipped_plugins(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The distributions ``MEGATRON_BACKPORTS_SKIP_PLUGINS`` names (as written)."""
    return _names(SKIP_PLUGINS, environ)


def builtin_ids_allowed(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The distributions ``MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS`` names (as written)."""
    return _names(ALLOW_BUILTIN_IDS, environ)


def disabled_reason(backport_id: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the environment turns ``backport_id`` off, or None."""
    env = os.environ if environ is None else environ
    if not enabled(env):
        return f"{ENABLE}={env[ENABLE].strip()} turns every backport off"
    if backport_id in skipped_ids(env):
        return f"{SKIP} names {backport_id}"
    return None
