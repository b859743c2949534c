"""``backports new --from-pr N --repo CLONE``: the derivation as named steps.

    resolve -> symbols -> locate -> budget -> vendor -> sniff -> prove -> write

Exit status: 0 written and proven; 1 not proven or refused (nothing written, or with
``--keep-unfinished`` the unfinished plugin, which ``backports check`` fails); 2 bad input.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ...termination import sigterm_unwinds
from . import _tool, child
from .budget import check_budget
from .clone import open_clone
from .derivation import Derivation, Names
from .errors import AlreadyPresent, BadInput, FromPrError, NotProven, Reason
from .locate import installed_distribution, locate, refuse_uncarried_files
from .merge import Conflict
from .plugin import write_plugin
from .present import already_present
from .prove import prove, upstream_tests
from .report import report_lines
from .resolve import resolve_pull_request
from .sniff import focus_names, route_a_tests, synthesise
from .symbols import changed_symbols
from .vendor import vendor

_ID = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
T = TypeVar("T")
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
        raise NotProven(
            f"no route tells the installed code from the fixed one on CPU ({tried})",
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
    d.proof = list(proof)
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


def run(args: argparse.Namespace) -> int:
    """The command; every error is one line on stderr (a conflict shows its hunk after).
    A SIGTERM, as a Ctrl-C, stops every child's process group and removes the scratch
    folder before the process ends."""
    with sigterm_unwinds():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    d: Derivation | None = None
    try:
        if args.repo is None:
            raise BadInput("--from-pr needs --repo: the path of a Megatron-LM clone")
        names = _names(args)
        dest = _dest(args, names)
        clone_path = Path(args.repo).expanduser().resolve()
        clone = open_clone(args.repo)
        installed = installed_distribution()
        print(CHILDREN_NOTICE, flush=True)  # first, once the arguments are good
        d = Derivation(
            names, clone_path, clone.origin_url(), f"{installed.name} {installed.version}"
        )
        same = [i for i in sorted(_tool.builtin_ids()) if i == f"megatron-lm-{args.from_pr}"]
        if same:
            print(
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
                _print_report(d)
                print(
                    f"wrote the UNFINISHED plugin {names.distribution} in {dest} "
                    f"(backports check fails on it): {d.unfinished}",
                    file=sys.stderr,
                )
                return 1
            _finish(d, staging, dest)
        _print_report(d)
        print(f"wrote {names.distribution} in {dest}: proven (contract kit, backports check)")
        return 0
    except (RecursionError, MemoryError) as exc:  # source too deep or too big to analyse
        print(
            f"backports new: the pull request's code is too deeply nested or too big to "
            f"analyse ({type(exc).__name__}); nothing written",
            file=sys.stderr,
        )
        return 1
    except FromPrError as exc:
        # Nothing to carry (exit 0) is one line: the report would list what must be written.
        if d is not None and d.pr is not None and exc.exit_code != 0:
            _print_report(d)
        first, *rest = str(exc).splitlines()
        written = "" if exc.exit_code != 1 else "; nothing written"
        where = sys.stdout if exc.exit_code == 0 else sys.stderr  # nothing to do: no error
        # A refusal's named reason leads (docs/from-pr.md gives each one's next step).
        named = f"[{exc.reason.code}] " if exc.exit_code == 1 and exc.reason else ""
        print(f"backports new: {named}{first.rstrip(':')}{written}", file=where)
        for line in rest:  # a merge conflict's hunk
            print(f"  {line}", file=sys.stderr)
        return exc.exit_code


def _print_report(d: Derivation) -> None:
    for line in report_lines(d):
        print(line)
