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
Any ``BaseException`` (a ``SystemExit`` from an ``argparse`` at module level, a
``KeyboardInterrupt`` the plugin raises itself) is such a failure too: a plugin never ends
the job. Only the user's Ctrl-C goes through: a ``KeyboardInterrupt`` while a SIGINT arrived
during the import (``_UserInterrupts``).

A plugin's import runs at every job's start, in every rank, so two more things are watched
(``_watched``). An import that takes longer than ``SLOW_IMPORT_S`` is said at once, on
stderr, while it still runs, naming the plugin and the switch that leaves it out: it is not
given up on, because Python cannot stop an import midway, and one abandoned in a thread would
run on beside the job holding import locks of the modules it was importing (megatron's
among them). A thread the import starts that is not a daemon thread is named in one
``BackportWarning``: the interpreter waits for such threads at its exit, so a finished job
would hang there. It is not made a daemon behind the plugin's back (that kills it midway at
exit, whatever it was writing).
``MEGATRON_BACKPORTS_SKIP_PLUGINS=dist,...`` turns distributions off without importing them.

A plugin never knocks out a builtin: one that claims a builtin's id is withheld, the builtin
kept. The builtin prefix ``megatron-lm-`` is this package's: a plugin's entry may use it
only where ``MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS=dist,...`` names its distribution (a team
carrying an upstream pull request this package does not carry yet).

Loading happens once per process (``catalog.entries()`` caches it); this module only reads
entry points and judges what they hold.
"""

import importlib.metadata
import signal
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any

from packaging.utils import canonicalize_name

from .. import switches
from ..errors import BackportWarning
from ..model import BackportSpec
from ..report import Verdict
from ._checks import problem

GROUP = "megatron_backports"
BUILTIN = "builtin"  # the source of the entries this package carries itself
BUILTIN_PREFIX = "megatron-lm-"  # the ids of this package's own entries
# A plugin's import is said on stderr once it has run this long (it runs at every job start;
# importing megatron-core and torch for the first time takes about 10 s on a busy node).
SLOW_IMPORT_S = 30.0


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
    label = f"entry point {entry_point.name!r} of {source}"
    with _UserInterrupts() as user, _watched(label, distribution):
        try:
            entries, problem = _as_entries(entry_point.load())
        except BaseException as exc:
            # A plugin's bug must not break (nor end: SystemExit from an argparse at module
            # level, a KeyboardInterrupt of its own) the job that imports megatron.
            if isinstance(exc, KeyboardInterrupt) and user.pressed_ctrl_c:
                raise
            problem = f"failed to load {entry_point.value}: {_one_line(exc)}"
            entries = ()
    return _Plugin(entry_point.name, distribution, source, entries, problem, entry_point.module)


def _one_line(exc: BaseException) -> str:
    said = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


class _UserInterrupts:
    """Whether the user pressed Ctrl-C (a SIGINT arrived) while the block ran.

    A ``KeyboardInterrupt`` comes from a SIGINT only in the main thread, through a Python
    handler; in the block this one stands before it, notes the signal and hands it on (the
    default handler raises, as ever; a job's own handler does what it did). Elsewhere (another
    thread, SIGINT ignored or left to the system) no ``KeyboardInterrupt`` can be the user's.
    """

    def __init__(self) -> None:
        self.pressed_ctrl_c = False
        self._before: Any = None

    def _noted(self, signum: int, frame: FrameType | None) -> Any:
        self.pressed_ctrl_c = True
        return self._before(signum, frame)

    def __enter__(self) -> "_UserInterrupts":
        if threading.current_thread() is threading.main_thread():
            before = signal.getsignal(signal.SIGINT)
            if callable(before):
                try:
                    signal.signal(signal.SIGINT, self._noted)
                    self._before = before
                except ValueError:  # not the main interpreter: its signals are not ours
                    pass
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Put back only our own: a handler the plugin set at import is the plugin's choice.
        if self._before is not None and signal.getsignal(signal.SIGINT) == self._noted:
            signal.signal(signal.SIGINT, self._before)


@contextmanager
def _watched(label: str, distribution: str) -> Iterator[None]:
    """The block (a plugin's import) said on stderr once it runs past ``SLOW_IMPORT_S``, and
    the non-daemon threads it started named in a ``BackportWarning`` afterwards."""
    before = set(threading.enumerate())
    skip = f"{switches.SKIP_PLUGINS}={distribution}"
    slow = threading.Timer(
        SLOW_IMPORT_S,
        _say_now,
        (
            f"backports: warning: importing {label} has taken over {SLOW_IMPORT_S:g} s and "
            f"goes on (it runs at every job start; {skip} leaves it out)",
        ),
    )
    slow.daemon = True
    slow.start()
    try:
        yield
    finally:
        slow.cancel()
        slow.join()  # gone before the job goes on: no thread of ours left behind at a fork
    started = [
        t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon
    ]
    if started:
        names = ", ".join(repr(t.name) for t in started)
        warnings.warn(
            f"{label} started thread(s) {names} at import, not daemon threads: the "
            f"interpreter waits for them at its exit, so a finished job may hang there "
            f"(ask its authors for daemon threads, or leave it out: {skip})",
            BackportWarning,
            stacklevel=1,  # the loader's line: the plugin's own would be a guess
        )


def _say_now(line: str) -> None:
    """One line on stderr from the watchdog's thread, now: a warning would wait in a
    command's notes until the end, which a hung import never reaches."""
    if sys.stderr is None:  # print(file=None) would write on stdout
        return
    with suppress(OSError, ValueError):  # a stderr closed or gone: nowhere to say it
        print(line, file=sys.stderr, flush=True)


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
