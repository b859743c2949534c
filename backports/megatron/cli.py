"""``backports status / apply / revert / audit``: a thin layer over the api.

Exit codes: 0 done; 1 a check failed (``--strict`` with an incompatible backport,
``audit --fail-on-landed`` with a landed one); 2 the command could not run (bad
arguments, an unknown backport id, a hook file that cannot be written, a candidate that
cannot be probed).
"""

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import activation
from .api import apply, revert, status
from .audit import audit, candidate_dir, outcome
from .errors import BackportError, BackportWarning
from .report import Report, Verdict

__all__ = ["main"]

_OK, _CHECK_FAILED, _CANNOT_RUN = 0, 1, 2


def _upstream_label(report: Report) -> str:
    upstream = report.evidence.get("upstream") or {}
    repo = str(upstream.get("repo") or "")
    name = repo.removesuffix(".git").removeprefix("https://github.com/")
    return f"{name}#{upstream['pr']}" if upstream.get("pr") else "-"


def _core_version(report: Report) -> str:
    return str((report.evidence.get("distribution") or {}).get("version") or "-")


Column = tuple[str, Callable[[Report], str]]
_ID: Column = ("id", lambda r: r.id)
_UPSTREAM: Column = ("upstream", _upstream_label)
_CORE: Column = ("megatron-core", _core_version)
_VERDICT: Column = ("verdict", lambda r: str(r.verdict))
_ACTION: Column = ("action", lambda r: str(r.action))
_REASON: Column = ("reason", lambda r: r.reason)
_STATUS_COLUMNS = (_ID, _UPSTREAM, _CORE, _VERDICT, _ACTION, _REASON)


def _table(reports: list[Report], columns: Sequence[Column]) -> str:
    """Aligned columns; the last one (the reason) runs on unpadded."""
    rows = [[title for title, _ in columns]]
    rows += [[cell(r) for _, cell in columns] for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns) - 1)]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def _emit(
    args: argparse.Namespace,
    reports: list[Report],
    notes: list[str],
    columns: Sequence[Column] = _STATUS_COLUMNS,
) -> None:
    """Reports as JSON on stdout (notes on stderr), or a table and the notes on stdout."""
    if args.json:
        json.dump([r.to_dict() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
        for note in notes:
            print(note, file=sys.stderr)
        return
    print(_table(reports, columns))
    for note in notes:
        print(note)


def _site_dir(args: argparse.Namespace) -> Path:
    return Path(args.site_dir) if args.site_dir else activation.default_site_dir()


def _hook_note(site_dir: Path) -> str:
    state = activation.read_hook(site_dir)
    if not state.exists:
        return f"hook: none in {site_dir}: `backports apply` activates the backports at job start"
    if not state.current:
        return f"hook: {state.path} is stale or not ours: rerun `backports apply` to refresh it"
    return f"hook: {state.path} activates the backports in every new interpreter"


def _site_warning(site_dir: Path) -> list[str]:
    if activation.is_site_dir(site_dir):
        return []
    return [
        f"note: {site_dir} is not a site-packages folder of {sys.executable}: its .pth files "
        "run only in interpreters that add it as a site dir"
    ]


def _only(args: argparse.Namespace) -> tuple[str, ...] | None:
    return tuple(dict.fromkeys(args.only)) if args.only else None


def _cmd_status(args: argparse.Namespace) -> int:
    reports = status(_only(args))
    _emit(args, reports, [_hook_note(_site_dir(args))])
    incompatible = any(r.verdict is Verdict.INCOMPATIBLE for r in reports)
    return _CHECK_FAILED if args.strict and incompatible else _OK


def _cmd_apply(args: argparse.Namespace) -> int:
    only = _only(args)
    # status() imports the target module, so apply() below probes it and installs now
    # instead of deferring: this output is the truth for this environment.
    status(only)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BackportWarning)
        try:
            reports = apply(only, strict=args.strict)
        except BackportError as exc:
            if not args.strict:
                raise
            print(f"backports: {exc}; hook not written", file=sys.stderr)
            return _CHECK_FAILED
    site_dir = _site_dir(args)
    state, changed = activation.write_hook(site_dir, only, args.strict)
    where = "wrote" if changed else "unchanged:"
    notes = [f"warning: {w.message}" for w in caught if issubclass(w.category, BackportWarning)]
    notes += [f"hook: {where} {state.path}", *_site_warning(site_dir)]
    _emit(args, reports, notes)
    return _OK


def _cmd_revert(args: argparse.Namespace) -> int:
    reports = revert()
    state, removed = activation.remove_hook(_site_dir(args))
    note = f"hook: removed {state.path}" if removed else f"hook: none at {state.path}"
    _emit(args, reports, [note], (_ID, _ACTION, _REASON))
    return _OK


def _cmd_audit(args: argparse.Namespace) -> int:
    wheel = Path(args.wheel) if args.wheel else None
    folder = Path(args.dir) if args.dir else None
    with candidate_dir(wheel, folder) as candidate:
        reports = audit(candidate, _only(args))
    landed = [r.id for r in reports if r.verdict is Verdict.UPSTREAM]
    columns = (_ID, _UPSTREAM, ("candidate", _core_version), _VERDICT, ("outcome", outcome))
    _emit(args, reports, [], (*columns, _REASON))
    if landed and args.fail_on_landed:
        print(f"backports: landed in the candidate, delete: {', '.join(landed)}", file=sys.stderr)
        return _CHECK_FAILED
    return _OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backports",
        description="Carry upstream Megatron-LM fixes on a pinned megatron-core.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, run: Callable[[argparse.Namespace], int]) -> Any:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(run=run)
        sub.add_argument("--json", action="store_true", help="print the reports as JSON")
        return sub

    def only(sub: Any) -> None:
        sub.add_argument("--only", action="append", metavar="ID", help="this backport only")

    def site(sub: Any) -> None:
        sub.add_argument(
            "--site-dir",
            metavar="DIR",
            help="where the hook file lives (default: this interpreter's site-packages)",
        )

    sub = command("status", "probe each backport; say what apply would do", _cmd_status)
    only(sub)
    site(sub)
    sub.add_argument("--strict", action="store_true", help="exit 1 if any is incompatible")

    sub = command("apply", "apply now and at every later interpreter start", _cmd_apply)
    only(sub)
    site(sub)
    sub.add_argument("--strict", action="store_true", help="fail on incompatible, also later")

    sub = command("revert", "remove the start-up hook and revert in this process", _cmd_revert)
    site(sub)

    sub = command("audit", "probe a candidate megatron-core without installing it", _cmd_audit)
    only(sub)
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("--wheel", metavar="PATH", help="a megatron-core wheel")
    where.add_argument("--dir", metavar="SITE_PACKAGES", help="a folder holding megatron/")
    sub.add_argument(
        "--fail-on-landed", action="store_true", help="exit 1 if a backport has landed there"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # This process decides explicitly; the environment's hook must not apply on its own.
    activation.deactivate()
    try:
        return int(args.run(args))
    except (BackportError, OSError) as exc:
        print(f"backports: {exc}", file=sys.stderr)
        return _CANNOT_RUN
