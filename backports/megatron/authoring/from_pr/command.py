"""``backports new --from-pr N --repo CLONE``: the derivation as named steps.

    resolve -> symbols -> locate -> budget -> vendor -> sniff -> prove -> write

Exit status: 0 written and proven; 1 not proven or refused (nothing written, or with
``--keep-unfinished`` the unfinished plugin, which ``backports check`` fails); 2 bad input.
Nothing here prints: ``derive_plugin`` returns what was written or raises a ``FromPrError``
that carries its exit status, and the commands wing (``commands/new.py``) prints both.
"""

import argparse
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ...termination import sigterm_unwinds
from . import _tool, child
from .budget import check_budget
from .clone import Clone, open_clone
from .derivation import Derivation, Names
from .errors import AlreadyPresent, BadInput, FromPrError, NotProven, Reason, TooBig
from .locate import installed_distribution, locate, refuse_uncarried_files
from .merge import Conflict
from .model import Located, PullRequest
from .plugin import write_plugin
from .present import already_present
from .prove import prove, upstream_tests
from .report import report_lines
from .resolve import resolve_pull_request
from .sniff import focus_names, route_a_tests, synthesise
from .symbols import changed_symbols
from .vendor import VendoredCode, vendor

_ID = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
T = TypeVar("T")
# Shows one notice as it comes (the commands wing: stdout, flushed before the children run).
Say = Callable[[str], object]
CHILDREN_NOTICE = (
    "note: this runs the pull request's code, its tests included, with your rights, in "
    "child processes (python -I or -P, in a private scratch folder), as pip install of a "
    "package would: derive only from a clone you trust"
)


def _names(args: argparse.Namespace) -> Names:
    backport_id = args.id or f"mlm-pr-{args.from_pr}"
    if not _ID.fullmatch(backport_id):
        raise BadInput(
            f"--id must be lowercase words joined by '-' (acme-6099), not {backport_id!r}"
        )
    if backport_id in _tool.builtin_ids() or backport_id.startswith(_tool.builtin_prefix()):
        raise BadInput(
            f"--id {backport_id}: {_tool.builtin_prefix()} is for megatron-backports' own "
            "entries; a plugin takes its own id (the default is mlm-pr-<N>)"
        )
    return Names(backport_id)


def _dest(args: argparse.Namespace, names: Names) -> Path:
    dest = Path(args.dest) if args.dest else Path.cwd() / names.distribution
    if dest.exists() or dest.is_symlink():
        raise BadInput(f"{dest} exists: `backports new` never overwrites")
    return dest


class _Steps:
    """Times each named step into the derivation."""

    def __init__(self, d: Derivation) -> None:
        self.d = d

    def __call__(self, name: str, step: Callable[[], T]) -> T:
        start = time.monotonic()
        try:
            return step()
        finally:
            self.d.seconds[name] = self.d.seconds.get(name, 0.0) + time.monotonic() - start


def _sniffs(d: Derivation) -> list[dict[str, Any]]:
    assert d.sniffed is not None and d.vendored is not None
    modules = {t.attribute: t.module for t in d.vendored.targets}
    entries = []
    for target, result in d.sniffed.results.items():
        if result.get("route") == "a":
            test = result["test"]
            entries.append(
                {
                    "route": "a",
                    "target": target,
                    "module": modules[target],
                    "test": test["function"],
                    "id": test["id"],
                }
            )
        elif result.get("route"):
            entries.append(
                {
                    "route": result["route"],
                    "target": target,
                    "module": modules[target],
                    "observation": result["observation"],
                }
            )
    return entries


def _fix_texts(
    clone: Clone, pr: PullRequest, vendored: VendoredCode, located: list[Located]
) -> dict[str, str]:
    """The merge's text of every carried symbol (targets by their installed name, the
    helpers carried along), as normalised AST digests, as ``fixed_symbols_sha256`` records
    them; {} where one cannot be recorded (an open pull request, a target renamed since):
    then no text votes for ``upstream``."""
    if pr.merge is None or any(t.attribute != t.upstream for t in vendored.targets):
        return {}
    merge = pr.merge.sha
    paths = {t.attribute: t.located.symbol.path for t in vendored.targets}
    paths |= {
        loc.symbol.qualname: loc.symbol.path
        for loc in located
        if loc.symbol.qualname in vendored.carried
    }
    found = _tool.symbol_digests(lambda name: clone.text(merge, paths[name]), list(paths))
    return found if len(found) == len(paths) else {}


def _derive(d: Derivation, number: int, scratch: Path, staging: Path, keep: bool) -> None:
    step = _Steps(d)
    clone = open_clone(str(d.clone))
    installed = installed_distribution()
    d.pr = pr = step("resolve", lambda: resolve_pull_request(clone, number))
    d.title = re.sub(rf"\s*\(#{number}\)\s*$", "", clone.subject(pr.new.sha))
    d.changes = changes = step("symbols", lambda: changed_symbols(clone, pr))
    d.located = step("locate", lambda: locate(changes.symbols, clone, pr, installed))
    if already_present(d.located, clone, pr, installed):
        raise AlreadyPresent(
            f"{installed.name} {installed.version} already has #{number}'s change "
            "(every symbol it changes reads as its fixed text): nothing to carry, nothing written"
        )
    refuse_uncarried_files(changes.other_files, installed, number)
    d.figures = check_budget(d.located)
    try:
        d.vendored = step(
            "vendor", lambda: vendor(d.located, clone, pr, installed, repo_url=d.repo_url)
        )
    except Conflict as exc:
        if not keep:
            raise
        d.unfinished = str(exc).splitlines()[0]
        d.vendored = vendor(
            d.located, clone, pr, installed, repo_url=d.repo_url, conflicts="installed"
        )
        return
    vendored = d.vendored
    d.fixed_symbols = _fix_texts(clone, pr, vendored, d.located)
    write_plugin(d, staging)
    d.focus = focus_names(clone, pr, changes.symbols, changes.tests)
    tests = route_a_tests(clone, pr, changes.tests)
    d.sniffed = sniffed = step(
        "sniff",
        lambda: synthesise(
            vendored,
            d.names.vendored_package,
            staging,
            scratch / "sniff",
            focus=d.focus,
            tests=tests,
        ),
    )
    sniffed_targets = sniffed.discriminating()
    if not sniffed_targets:
        tried = "; ".join(
            f"{name}: {' / '.join(r.get('tried', []))}" for name, r in sniffed.results.items()
        )
        _, discarded = sniffed.soundness()
        raise NotProven(
            f"no route tells the installed code from the fixed one on CPU ({tried}; "
            f"{discarded} candidate sniff(s) discarded by the rewrites)",
            Reason.NO_ROUTE,
        )
    if sniffed_targets[0] != vendored.targets[0].attribute:
        d.vendored = vendor(
            d.located, clone, pr, installed, repo_url=d.repo_url, first=sniffed_targets[0]
        )
    d.sniffs = _sniffs(d)
    shutil.rmtree(staging)
    write_plugin(d, staging)
    proof, paths = step("prove", lambda: prove(d.names.id, staging, scratch / "prove"))
    passed, discarded = sniffed.soundness()
    d.proof = [
        f"sniff soundness: {passed} semantics-preserving rewrite(s) of the installed and the "
        f"fixed code read as their versions; {discarded} candidate sniff(s) discarded by them",
        *proof,
    ]
    d.upstream_tests = step(
        "upstream-tests", lambda: upstream_tests(d.names.id, d.clone, paths, scratch / "prove")
    )


@contextmanager
def _scratch() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="backports-from-pr-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _finish(d: Derivation, staging: Path, dest: Path) -> None:
    """The plugin appears at ``dest`` whole or not at all: copied beside it under a hidden
    name, then renamed (atomic); a stop mid-copy (Ctrl-C, SIGTERM) removes the copy."""
    shutil.rmtree(staging, ignore_errors=True)
    write_plugin(d, staging)  # the final README holds the whole report
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    try:
        shutil.copytree(staging, partial, symlinks=True)
        partial.rename(dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


@dataclass(frozen=True)
class Derived:
    """A plugin written at ``dest``: proven, or with ``--keep-unfinished`` ``unfinished`` (the
    first line of what stopped it; ``backports check`` fails on it)."""

    distribution: str
    dest: Path
    report: list[str]  # what was derived, a line each (``report.report_lines``)
    unfinished: str | None


def derive_plugin(args: argparse.Namespace, say: Say) -> Derived:
    """The derivation, start to end; the notices before it to ``say`` as they come. Raises a
    ``FromPrError`` (its ``exit_code`` and, past the resolve step, the ``report`` so far). A
    SIGTERM, as a Ctrl-C, stops every child's process group and removes the scratch folder
    before the process ends."""
    with sigterm_unwinds():
        return _derive_plugin(args, say)


def _derive_plugin(args: argparse.Namespace, say: Say) -> Derived:
    d: Derivation | None = None
    try:
        if args.repo is None:
            raise BadInput("--from-pr needs --repo: the path of a Megatron-LM clone")
        names = _names(args)
        dest = _dest(args, names)
        clone_path = Path(args.repo).expanduser().resolve()
        clone = open_clone(args.repo)
        installed = installed_distribution()
        say(CHILDREN_NOTICE)  # first, once the arguments are good
        d = Derivation(
            names, clone_path, clone.origin_url(), f"{installed.name} {installed.version}"
        )
        same = [i for i in sorted(_tool.builtin_ids()) if i == f"megatron-lm-{args.from_pr}"]
        if same:
            say(
                f"note: {same[0]} (builtin) carries #{args.from_pr} and installs first: the "
                f"plugin is proven, and installs, where MEGATRON_BACKPORTS_SKIP={same[0]}"
            )
        with _scratch() as scratch, child.skipping(same):
            staging = scratch / "plugin"
            try:
                _derive(d, args.from_pr, scratch, staging, args.keep_unfinished)
            except NotProven as exc:
                if not args.keep_unfinished or d.vendored is None:
                    raise
                d.unfinished = str(exc).splitlines()[0]
            if d.unfinished is not None:
                d.sniffs = []
            _finish(d, staging, dest)
        return Derived(names.distribution, dest, report_lines(d), d.unfinished)
    except (RecursionError, MemoryError) as exc:  # source too deep or too big to analyse
        raise TooBig(
            "the pull request's code is too deeply nested or too big to analyse "
            f"({type(exc).__name__})"
        ) from None
    except FromPrError as exc:
        # Nothing to carry (exit 0) is one line: the report would list what must be written.
        if d is not None and d.pr is not None and exc.exit_code != 0:
            exc.report = report_lines(d)
        raise
