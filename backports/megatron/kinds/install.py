"""Install and uninstall backports: every target of an entry, or none, whatever their kinds.

Each target's kind puts its replacement in place; this module makes the entry all or none,
shares one scan for module aliases among every entry installed at once (a scan reads every
module's globals), and keeps the installations on the session: what was replaced, where,
in which mode. An installation whose module was reloaded or re-imported is no longer live:
it moves to the stale list, which the next uninstall still cleans.
"""

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..model import Target
from ..session import SESSION
from . import Installation, Kind, Part, Resolved, kind_of
from ._bindings import bindings_of_each, one_scan_for

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replacement:
    """What to put in place of one resolved target."""

    target: Target
    resolved: Resolved
    replacement: object


@dataclass(frozen=True)
class Request:
    """One backport to install: its replacements, its mode, and markers set on each
    replacement that can carry them (``__backport_mode__``, ...)."""

    backport_id: str
    mode: str
    replacements: Sequence[Replacement]
    markers: Mapping[str, object]


def installed(backport_id: str) -> Installation | None:
    """The live installation of ``backport_id``, or None.

    One that no longer stands everywhere (reloaded or re-imported module, or rebound by
    someone else) is never reported: it moves to the stale list.
    """
    with SESSION.lock:
        installation: Installation | None = SESSION.installed.get(backport_id)
        if installation is None:
            return None
        dead = [part for part in installation.parts if not part.kind.is_live(part)]
        if not dead:
            return installation
        del SESSION.installed[backport_id]
        SESSION.stale.setdefault(backport_id, []).append(installation)
        _LOG.info(
            "%s is no longer bound at %s.%s (module reloaded, re-imported or rebound)",
            backport_id,
            dead[0].resolved.module_name,
            dead[0].target.attribute,
        )
        return None


def install_all(requests: Sequence[Request]) -> list[tuple[Installation, bool] | Exception]:
    """Install each request, each all or none, with one scan for aliases for them all. Per
    request: (the installation, whether this call installed it), or the exception that left
    that backport uninstalled."""
    with SESSION.lock:
        outcomes: dict[int, tuple[Installation, bool] | Exception] = {}
        due: dict[int, Request] = {}
        for index, request in enumerate(requests):
            existing = installed(request.backport_id)
            if existing is not None:
                outcomes[index] = (existing, False)
            else:
                due[index] = request
        olds = [
            old
            for request in due.values()
            for r in request.replacements
            for old in kind_of(r.target).aliases(r.resolved)
        ]
        try:
            # Scanned before any rebinding: between this scan and the last install only
            # setattr on modules runs.
            aliases = bindings_of_each(olds)
        except Exception as exc:  # nothing rebound yet: each due request failed with it
            outcomes.update((index, exc) for index in due)
            due = {}
        for index, request in due.items():
            try:
                outcomes[index] = (_install_one(request, aliases), True)
            except Exception as exc:
                outcomes[index] = exc
        return [outcomes[index] for index in range(len(requests))]


def _install_one(request: Request, aliases: dict[int, list[tuple[str, str]]]) -> Installation:
    parts: list[Part] = []
    try:
        for r in request.replacements:
            kind = kind_of(r.target)
            parts.append(
                kind.install(
                    request.backport_id,
                    r.target,
                    r.resolved,
                    r.replacement,
                    request.markers,
                    aliases,
                )
            )
    except BaseException:
        for part in reversed(parts):  # all or none
            part.kind.uninstall(part)
        raise
    notes = _after_install(parts)
    installation = Installation(request.backport_id, request.mode, tuple(parts), notes)
    SESSION.installed[request.backport_id] = installation
    return installation


def by_kind(parts: Sequence[Part]) -> list[tuple[Kind, list[Part]]]:
    """The parts grouped by their kind, in the order the kinds first appear."""
    grouped: dict[int, tuple[Kind, list[Part]]] = {}
    for part in parts:
        grouped.setdefault(id(part.kind), (part.kind, []))[1].append(part)
    return list(grouped.values())


def _after_install(parts: list[Part]) -> dict[str, object]:
    """What each kind says once its parts are in: ``note`` for the reason, and evidence."""
    note, evidence = "", {}
    for kind, mine in by_kind(parts):
        said, found = kind.after_install(mine)
        note += said
        evidence.update(found)
    return {"note": note, "evidence": evidence}


@contextmanager
def uninstalling(backport_ids: Iterable[str]) -> Iterator[None]:
    """A block that uninstalls these backports: one scan of ``sys.modules`` finds the late
    aliases of every replacement they installed (live or stale), not one scan per part."""
    with SESSION.lock:
        ids = set(backport_ids)
        installations = [
            *(SESSION.installed[i] for i in ids if i in SESSION.installed),
            *(stale for i in ids for stale in SESSION.stale.get(i, [])),
        ]
        with one_scan_for(part.replacement for i in installations for part in i.parts):
            yield


def uninstall(backport_id: str) -> Installation | None:
    """Put every original back wherever our replacements still stand; None if not installed.

    Stale installations (a module reloaded or re-imported) are undone too, wherever their
    replacements are still bound, so that nothing of ours is left behind.
    """
    with SESSION.lock:
        live = installed(backport_id)
        SESSION.installed.pop(backport_id, None)
        for installation in [*SESSION.stale.pop(backport_id, []), *([live] if live else [])]:
            for part in reversed(installation.parts):
                part.kind.uninstall(part)
        return live
