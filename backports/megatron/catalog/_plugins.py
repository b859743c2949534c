"""Catalog entries other distributions register under the entry-point group ``megatron_backports``.

A team carries its own backports without a fork: its distribution declares, in
``pyproject.toml``::

    [project.entry-points.megatron_backports]
    acme-7617 = "acme_backports.entry:SPEC"   # a BackportSpec, or an iterable of them

Each entry point contributes all of its entries or none. One that cannot be imported,
names something that is not an entry (or an iterable holding one), or claims an id that
another entry claims too, contributes nothing and becomes one ``Withheld`` record: an
``incompatible`` report naming the distribution, never an exception out of the loader.
So does one holding an entry with a field of the wrong type or an empty one
(``spec_checks``): the reason names the field, and every other backport keeps working.
Any ``BaseException`` but ``KeyboardInterrupt`` (a ``SystemExit`` from an ``argparse`` at
module level) is such a failure too.
``MEGATRON_BACKPORTS_SKIP_PLUGINS=dist,...`` turns distributions off without importing them.

A plugin never knocks out a builtin: one that claims a builtin's id is withheld, the builtin
kept. The builtin prefix ``megatron-lm-`` is this package's: a plugin's entry may use it
only where ``MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS=dist,...`` names its distribution (a team
carrying an upstream pull request this package does not carry yet).

Loading happens once per process (``catalog.entries()`` caches it); this module only reads
entry points and judges what they hold.
"""

import importlib.metadata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.utils import canonicalize_name

from .. import switches
from ..model import BackportSpec
from ..report import Verdict
from ._checks import problem

GROUP = "megatron_backports"
BUILTIN = "builtin"  # the source of the entries this package carries itself
BUILTIN_PREFIX = "megatron-lm-"  # the ids of this package's own entries


@dataclass(frozen=True)
class Withheld:
    """Something that contributes no entry: an id (or entry-point name), its source, why."""

    id: str
    source: str
    verdict: Verdict  # incompatible, or disabled for a skipped distribution
    reason: str


@dataclass(frozen=True)
class Loaded:
    """The usable entries with their sources, builtins first, and what was withheld."""

    entries: tuple[BackportSpec, ...]
    sources: Mapping[str, str]  # id -> "builtin" or "<distribution> <version>"
    withheld: tuple[Withheld, ...]
    # id -> (distribution name, module the entry point names), for each plugin entry: the
    # verdict cache keys a plugin's verdict on its own code and version.
    origins: Mapping[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plugin:
    """One entry point, loaded: its entries, or why it has none."""

    name: str
    distribution: str
    source: str
    entries: tuple[BackportSpec, ...] = ()
    problem: str | None = None
    module: str = ""  # the module the entry point names

    @property
    def label(self) -> str:
        return f"entry point {self.name!r} of {self.source}"


def _source(entry_point: importlib.metadata.EntryPoint) -> tuple[str, str]:
    """(distribution name, "<name> <version>") of the distribution declaring the entry point."""
    dist = entry_point.dist
    if dist is None:  # an EntryPoint built by hand has no distribution
        return "unknown", "unknown distribution"
    name = str(dist.metadata["Name"] or dist.name)
    return name, f"{name} {dist.version}"


def _as_entries(value: Any) -> tuple[tuple[BackportSpec, ...], str | None]:
    """(the entries ``value`` holds, or why it is not a catalog entry or an iterable of them)."""
    if isinstance(value, BackportSpec):
        value = (value,)  # one entry: checked as every entry of a list is
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return (), f"names a {type(value).__name__}, not a BackportSpec or an iterable of them"
    items = list(value)  # may raise: the caller reports it like an import failure
    bad = [
        f"item {i} is a {type(v).__name__}"
        for i, v in enumerate(items)
        if not isinstance(v, BackportSpec)
    ]
    if bad:
        return (), f"holds something that is not a BackportSpec ({'; '.join(bad)})"
    if not items:
        return (), "names an empty iterable: no catalog entry"
    for spec in items:
        malformed = problem(spec)
        if malformed is not None:
            return (), f"holds an entry {_label(spec)} whose {malformed}"
    ids = Counter(spec.id for spec in items)
    twice = sorted(i for i, n in ids.items() if n > 1)
    if twice:
        return (), f"holds the id {', '.join(twice)} more than once"
    return tuple(items), None


def _label(spec: BackportSpec) -> str:
    backport_id = getattr(spec, "id", None)
    return repr(backport_id) if isinstance(backport_id, str) else f"(id {backport_id!r:.40})"


def _load_one(entry_point: importlib.metadata.EntryPoint) -> _Plugin:
    distribution, source = _source(entry_point)
    try:
        entries, problem = _as_entries(entry_point.load())
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # A plugin's bug must not break (nor end: SystemExit from an argparse at module
        # level) the job that imports megatron. Only the user's Ctrl-C goes through.
        problem = f"failed to load {entry_point.value}: {_one_line(exc)}"
        entries = ()
    return _Plugin(entry_point.name, distribution, source, entries, problem, entry_point.module)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _skipped(distribution: str, names: frozenset[str]) -> bool:
    return canonicalize_name(distribution) in names


def _refused(plugin: _Plugin, builtin_ids: set[str], allowed: frozenset[str]) -> _Plugin:
    """``plugin`` without its entries if one takes a builtin's id, or the builtin prefix
    without the user's leave: a plugin never knocks out a builtin."""
    ids = [spec.id for spec in plugin.entries]
    taken = [i for i in ids if i in builtin_ids]
    if taken:
        problem = (
            f"claims {', '.join(taken)}, the id of a builtin entry: the builtin is kept and "
            "this plugin withheld (give its entry another id)"
        )
        return replace(plugin, entries=(), problem=problem)
    prefixed = [i for i in ids if i.startswith(BUILTIN_PREFIX)]
    if prefixed and not _skipped(plugin.distribution, allowed):
        problem = (
            f"claims {', '.join(prefixed)}: the prefix {BUILTIN_PREFIX} is for builtin entries "
            f"(allow it with {switches.ALLOW_BUILTIN_IDS}={plugin.distribution})"
        )
        return replace(plugin, entries=(), problem=problem)
    return plugin


def _discover(environ: Mapping[str, str] | None) -> tuple[list[_Plugin], list[Withheld]]:
    """Every entry point of the group loaded, but those of skipped distributions."""
    skip = frozenset(canonicalize_name(n) for n in switches.skipped_plugins(environ))
    plugins, withheld = [], []
    for entry_point in importlib.metadata.entry_points(group=GROUP):
        distribution, source = _source(entry_point)
        if _skipped(distribution, skip):
            why = f"{switches.SKIP_PLUGINS} names {distribution}: its entries are not imported"
            withheld.append(Withheld(entry_point.name, source, Verdict.DISABLED, why))
            continue
        plugins.append(_load_one(entry_point))
    return plugins, withheld


def _claims(builtins: Sequence[BackportSpec], plugins: list[_Plugin]) -> dict[str, list[str]]:
    """id -> every source that claims it (a plugin's entries count only if it loaded)."""
    claims: dict[str, list[str]] = {}
    for spec in builtins:
        claims.setdefault(spec.id, []).append(BUILTIN)
    for plugin in plugins:
        for spec in plugin.entries:
            claims.setdefault(spec.id, []).append(plugin.source)
    return claims


def load(builtins: Sequence[BackportSpec], environ: Mapping[str, str] | None = None) -> Loaded:
    """The builtins and every plugin's entries, with duplicates and failures withheld.

    A plugin claiming a builtin's id is withheld, the builtin kept. An id two plugins claim
    is applied from neither: one ``incompatible`` record names both, and each entry point
    that claims it contributes nothing else either.
    """
    plugins, withheld = _discover(environ)
    allowed = frozenset(canonicalize_name(n) for n in switches.builtin_ids_allowed(environ))
    builtin_ids = {spec.id for spec in builtins}
    plugins = [_refused(plugin, builtin_ids, allowed) for plugin in plugins]
    claims = _claims(builtins, plugins)
    clashing = {i: who for i, who in claims.items() if len(who) > 1}
    for backport_id, who in clashing.items():
        reason = f"the id {backport_id} is claimed by {' and '.join(who)}: neither is applied"
        withheld.append(Withheld(backport_id, ", ".join(who), Verdict.INCOMPATIBLE, reason))
    entries = [spec for spec in builtins if spec.id not in clashing]
    sources = {spec.id: BUILTIN for spec in entries}
    origins: dict[str, tuple[str, str]] = {}
    for plugin in plugins:
        ids = [spec.id for spec in plugin.entries]
        if plugin.problem is not None:
            reason = f"{plugin.label} {plugin.problem}; it contributes nothing"
            withheld.append(Withheld(plugin.name, plugin.source, Verdict.INCOMPATIBLE, reason))
        elif any(i in clashing for i in ids):
            dup = ", ".join(i for i in ids if i in clashing)
            for backport_id in (i for i in ids if i not in clashing):
                reason = f"withheld with {plugin.label}, which also claims {dup}, claimed twice"
                withheld.append(Withheld(backport_id, plugin.source, Verdict.INCOMPATIBLE, reason))
        else:
            entries.extend(plugin.entries)
            sources.update(dict.fromkeys(ids, plugin.source))
            origins.update(dict.fromkeys(ids, (plugin.distribution, plugin.module)))
    unique = tuple(_unique_ids(withheld, set(sources)))
    return Loaded(tuple(entries), sources, unique, origins)


def _unique_ids(withheld: list[Withheld], taken: set[str]) -> list[Withheld]:
    """Each record's id unique among all reports: a clash gets "<source>:<id>"."""
    unique = []
    for record in withheld:
        backport_id = record.id
        if backport_id in taken:
            backport_id = f"{record.source.split()[0]}:{record.id}"
        taken.add(backport_id)
        unique.append(Withheld(backport_id, record.source, record.verdict, record.reason))
    return unique
