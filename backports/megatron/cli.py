"""``backports status / apply / revert / audit / check``: a thin layer over the api.

Exit codes: 0 done; 1 a check failed (``--strict`` with an incompatible backport,
``audit --fail-on-landed`` with a landed one, ``check`` with a backport that is
incompatible, landed upstream, or not installed where it should be); 2 the command
could not run (bad arguments, an unknown backport id, a hook folder that does not exist or cannot be
written, a candidate that is not megatron-core or cannot be probed). A reader of stdout that
hangs up early (`backports check | head -1`) changes none of them: output is dropped, the
command runs to its own exit status.

The command prints its own words: other packages' known import notices are hidden
(``-v`` shows them), and a ``BackportWarning`` becomes a ``warning:`` line among the notes.
"""

import argparse
import importlib.metadata
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from . import import_notices, job_start, json_output, switches, table
from .activation import hook_file, start_up
from .api import applied, apply, load_targets, probe_ignoring_switches, revert, status
from .audit import audit, candidate_dir, outcome
from .catalog import entries, select, source
from .check import Judgement, judge
from .errors import BackportError, BackportWarning
from .report import Action, Report, Verdict

__all__ = ["main"]

_OK, _CHECK_FAILED, _CANNOT_RUN = 0, 1, 2
_FORMATS = ("table", "json", "json-object")
_DISTRIBUTION = "megatron-backports"


# ---- the table and the JSON ----------------------------------------------------------------


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
_OUTCOME: Column = ("outcome", outcome)
_REASON: Column = ("reason", lambda r: r.reason)
_SOURCE: Column = ("source", lambda r: r.source)
_STATUS_COLUMNS = (_ID, _UPSTREAM, _CORE, _VERDICT, _ACTION, _SOURCE, _REASON)
_AUDIT_COLUMNS = (_ID, _UPSTREAM, ("candidate", _core_version), _VERDICT, _OUTCOME, _REASON)


# Left out first on a narrow terminal: what the id already says (upstream), what every row
# shares (megatron-core, candidate), where the entry comes from (source).
_OPTIONAL = ("source", "upstream", "megatron-core", "candidate")


def _table(reports: list[Report], columns: Sequence[Column], layout: table.Layout) -> str:
    """Aligned columns, fitted to ``layout``; the last one (the reason) runs on unpadded."""
    rows = [[title for title, _ in columns]]
    rows += [[cell(r) for _, cell in columns] for r in reports]
    titles = [title for title, _ in columns]
    optional = [titles.index(title) for title in _OPTIONAL if title in titles]
    return table.render(rows, layout, optional)


def _jsonable(value: Any) -> Any:
    """``value`` as strict JSON: what a sniff's detail holds that JSON has no word for (an
    object, a set, bytes, NaN) becomes its ``repr``; keys become strings."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, str | int | float):
        return value
    return repr(value)


def _emit(
    args: argparse.Namespace,
    reports: list[Report],
    notes: list[str],
    columns: Sequence[Column] = _STATUS_COLUMNS,
    json_extra: Sequence[Column] = (),
    summary: dict[str, Any] | None = None,
) -> None:
    """Reports as JSON or a table on stdout; warnings on stderr whatever the format.

    ``json_extra``: table columns that are no ``Report`` field, added to each JSON object.
    The table's other notes (the hook, the summary) follow it on stdout; with JSON, stdout
    holds the JSON alone and they go to stderr.
    """
    warned = [*args.warning_notes, *(n for n in notes if n.startswith("warning:"))]
    notes = [n for n in notes if not n.startswith("warning:")]
    for note in warned:
        print(note, file=sys.stderr)
    if args.format == "table":
        layout = table.layout_for(sys.stdout, full=args.verbose)
        print(_table(reports, columns, layout))
        for note in notes:
            print(table.fit_note(note, layout))
        return
    data = [{**r.to_dict(), **{title: cell(r) for title, cell in json_extra}} for r in reports]
    document: Any = data
    if args.format == "json-object":
        document = json_output.document(args.command, data, summary, notes, warned)
    # Built whole before anything is written: never half a document on stdout.
    sys.stdout.write(json.dumps(_jsonable(document), indent=2, allow_nan=False) + "\n")
    for note in notes:
        print(note, file=sys.stderr)


# ---- the hook file, as the commands report it ------------------------------------------------


@dataclass(frozen=True)
class _Hook:
    """The hook file of a site dir, read once per command."""

    state: hook_file.HookState
    current: bool
    runs_at_startup: bool  # in a site-packages folder of this interpreter

    @classmethod
    def read(cls, site_dir: Path) -> "_Hook":
        state = job_start.read_hook(site_dir)
        return cls(state, state.current, hook_file.is_site_dir(site_dir))

    def applies(self, backport_id: str) -> bool:
        """Whether later processes apply ``backport_id`` through this hook."""
        if not (self.current and self.runs_at_startup) or self.state.config is None:
            return False
        only = self.state.config.get("only")
        return only is None or backport_id in only

    def evidence(self, backport_id: str) -> dict[str, Any]:
        config = self.state.config or {}
        return {
            "path": str(self.state.path),
            "exists": self.state.exists,
            "current": self.current,  # written by this version for this interpreter
            "runs_at_startup": self.runs_at_startup,
            "applies": self.applies(backport_id),
            "only": None if config.get("only") is None else list(config["only"]),
            "strict": bool(config.get("strict", False)),
        }


def _site_dir(args: argparse.Namespace) -> Path:
    site_dir = Path(args.site_dir) if args.site_dir else hook_file.default_site_dir()
    if not site_dir.is_dir():
        what = "is not a folder" if site_dir.exists() else "does not exist"
        raise BackportError(f"site dir {site_dir} {what}")
    return site_dir


def _site_warning(site_dir: Path) -> list[str]:
    if hook_file.is_site_dir(site_dir):
        return []
    return [
        f"note: {site_dir} is not a site-packages folder of {sys.executable}: its .pth files "
        "run only in interpreters that add it as a site dir"
    ]


def _hook_installs_when(report: Report) -> str:
    """Which import installs ``report``'s backport in a new process (not ``import megatron``:
    the trigger patches when the module that defines each target is imported)."""
    targets = report.evidence.get("targets") or [report.evidence.get("target") or {}]
    modules = list(dict.fromkeys(str(t["module"]) for t in targets if t.get("module")))
    if not modules:
        return "the start-up hook installs it in each new process"
    if len(modules) == 1:
        return f"the start-up hook installs it in each new process that imports {modules[0]}"
    return (
        "the start-up hook installs it in each new process once it has imported "
        f"{', '.join(modules[:-1])} and {modules[-1]}"
    )


def _with_hook(report: Report, hook: _Hook) -> Report:
    """``report`` with the hook's state in its evidence, and in its action where it applies."""
    evidence = {**report.evidence, "hook": hook.evidence(report.id)}
    if report.action is Action.WOULD_INSTALL and hook.applies(report.id):
        reason = f"{report.reason}; {_hook_installs_when(report)}"
        return replace(report, action=Action.ACTIVE_VIA_HOOK, reason=reason, evidence=evidence)
    return replace(report, evidence=evidence)


def _only(args: argparse.Namespace) -> tuple[str, ...] | None:
    return tuple(dict.fromkeys(args.only)) if args.only else None


# ---- the commands --------------------------------------------------------------------------


def _status_note(hook: _Hook, site_dir: Path) -> str:
    path = hook.state.path
    if not hook.state.exists:
        return f"hook: none in {site_dir}: `backports apply` activates the backports at job start"
    if not hook.current:
        return f"hook: {path} is stale or not ours: rerun `backports apply` to refresh it"
    only = (hook.state.config or {}).get("only")
    which = "the backports" if only is None else ", ".join(only)
    return f"hook: {path} activates {which} in every new interpreter"


def _cmd_status(args: argparse.Namespace) -> int:
    site_dir = _site_dir(args)
    hook = _Hook.read(site_dir)
    reports = [_with_hook(report, hook) for report in status(_only(args))]
    _emit(args, reports, [_status_note(hook, site_dir), *_site_warning(site_dir)])
    incompatible = any(r.verdict is Verdict.INCOMPATIBLE for r in reports)
    return _CHECK_FAILED if args.strict and incompatible else _OK


def _hook_selection(only: tuple[str, ...] | None) -> tuple[bool, tuple[str, ...] | None, str]:
    """(write a hook?, its ``only``, why it differs from the command's selection).

    The switches this command runs under are meant for the environment too: the ids that
    ``MEGATRON_BACKPORTS_SKIP`` names are left out of the hook, and under
    ``MEGATRON_BACKPORTS=0`` (or a skip of every selected id) no hook is written.
    """
    if not switches.enabled():
        return False, None, f"{switches.ENABLE}={os.environ[switches.ENABLE].strip()} is set"
    ids = [spec.id for spec in select(only)]
    left_out = [i for i in ids if i in switches.skipped_ids()]
    if not left_out:
        return True, only, ""
    kept = tuple(i for i in ids if i not in left_out)
    return bool(kept), kept, f"{switches.SKIP} names {', '.join(left_out)}"


def _write_hook(args: argparse.Namespace, site_dir: Path) -> tuple[list[str], _Hook]:
    """Write the hook as this command's arguments and switches ask: notes on what it did,
    and the hook as it now is (the file is read once)."""
    write, hook_only, why = _hook_selection(_only(args))
    if not write:
        hook = _Hook.read(site_dir)
        note = f"hook: not written: every backport asked for is off ({why})"
        if hook.state.exists:
            note += (
                f"; {hook.state.path} from an earlier apply stays (`backports revert` removes it)"
            )
        return [note], hook
    state, changed = job_start.write_hook(site_dir, hook_only, args.strict)
    notes = [f"hook: {'wrote' if changed else 'unchanged:'} {state.path}"]
    if why:
        notes.append(
            f"hook: leaves out what {why}: later processes do not apply it "
            "(to include it, rerun `backports apply` without the variable)"
        )
    # What write_hook wrote (or found equal) is the current text: no second read.
    hook = _Hook(state, True, hook_file.is_site_dir(site_dir))
    return notes + _site_warning(site_dir), hook


def _process_only_notes() -> list[str]:
    if not switches.upstream_only():
        return []
    value = os.environ[switches.UPSTREAM_ONLY].strip()
    return [
        f"note: {switches.UPSTREAM_ONLY}={value} holds for this process only: the hook does "
        "not record it; set it in the job's environment too"
    ]


def _cmd_apply(args: argparse.Namespace) -> int:
    site_dir = _site_dir(args)  # before any work: a mistyped folder is a usage error
    only = _only(args)
    # Imported first, the targets are probed once and installed now instead of deferred:
    # this table (apply's own reports) is the truth for this environment.
    load_targets(only)
    try:
        reports = apply(only, strict=args.strict)
    except BackportError as exc:
        if not args.strict:
            raise
        print(f"backports: {exc}; hook not written", file=sys.stderr)
        return _CHECK_FAILED
    hook_notes, hook = _write_hook(args, site_dir)
    notes = hook_notes + _process_only_notes()
    reports = [replace(r, evidence={**r.evidence, "hook": hook.evidence(r.id)}) for r in reports]
    _emit(args, reports, notes)
    return _OK


def _hook_applied(removed: hook_file.HookState, backport_id: str) -> bool:
    """Whether the removed hook applied ``backport_id`` (a file we cannot read: say yes)."""
    if removed.config is None:
        return True
    only = removed.config.get("only")
    return only is None or backport_id in only


def _reverted(report: Report, here: Report, removed: hook_file.HookState | None) -> Report:
    """``report`` saying what revert did for its backport: the hook, and this process."""
    hook_applied = removed is not None and _hook_applied(removed, report.id)
    done = []
    if removed is not None and hook_applied:
        done.append(f"removed the start-up hook {removed.path}: new processes do not apply it")
    elif removed is not None:
        done.append(f"the removed hook {removed.path} did not apply it")
    if here.action is Action.REVERTED:
        done.append(f"in this process: {here.reason}")
    reverted = hook_applied or here.action is Action.REVERTED
    reason = "; ".join(done) or "nothing to revert: no start-up hook, nothing installed here"
    hook = {"path": None if removed is None else str(removed.path), "removed": hook_applied}
    return replace(
        report,
        action=Action.REVERTED if reverted else Action.NOT_INSTALLED,
        reason=reason,
        evidence={**report.evidence, "hook": hook},
    )


def _cmd_revert(args: argparse.Namespace) -> int:
    site_dir = _site_dir(args)
    here = {r.id: r for r in revert()}
    state, removed = hook_file.remove_hook(site_dir)
    # The table shows what was done; --json adds each backport's verdict and evidence,
    # which takes a probe (as `status --json`): revert itself decides nothing.
    reports = status() if args.json else list(here.values())
    reports = [_reverted(r, here[r.id], state if removed else None) for r in reports]
    note = f"hook: removed {state.path}" if removed else f"hook: none at {state.path}"
    _emit(args, reports, [note], (_ID, _ACTION, _REASON))
    return _OK


def _cmd_audit(args: argparse.Namespace) -> int:
    wheel = Path(args.wheel) if args.wheel else None
    folder = Path(args.dir) if args.dir else None
    with candidate_dir(wheel, folder) as candidate:
        label = str(wheel or folder)
        reports = audit(candidate, _only(args), label=label, verbose=args.verbose)
    _emit(args, reports, [], _AUDIT_COLUMNS, json_extra=(_OUTCOME,))
    landed = [r.id for r in reports if r.verdict is Verdict.UPSTREAM]
    if landed and args.fail_on_landed:
        print(f"backports: landed in the candidate, delete: {', '.join(landed)}", file=sys.stderr)
        return _CHECK_FAILED
    return _OK


def _with_probe_anyway(report: Report, anyway: Report | None) -> Report:
    if anyway is None:
        return report
    found = {"verdict": str(anyway.verdict), "reason": anyway.reason}
    return replace(report, evidence={**report.evidence, "probed_while_disabled": found})


def _cmd_check(args: argparse.Namespace) -> int:
    only = _only(args)
    probed = status(only)  # imports the targets, so the apply below installs now
    # The same action words as `status`: a backport the environment's hook installs says so.
    hook = _Hook.read(hook_file.default_site_dir())
    probed = [_with_hook(report, hook) for report in probed]
    probing_warnings = len(args.warning_notes)  # a bad switch value, an unknown skipped id
    with applied(only) as done:  # and reverts on exit: check changes nothing
        installed = {r.id: r for r in done}
    del args.warning_notes[probing_warnings:]  # apply's repeat what the "why" column says
    specs = {spec.id: spec for spec in entries()}  # a withheld plugin has none
    anyway = {
        r.id: probe_ignoring_switches(specs[r.id])
        for r in probed
        if r.verdict is Verdict.DISABLED and r.id in specs
    }
    probed = [_with_probe_anyway(r, anyway.get(r.id)) for r in probed]
    verdicts = {
        r.id: judge(specs.get(r.id), r, installed.get(r.id), anyway.get(r.id)) for r in probed
    }

    def check_cell(report: Report) -> str:
        return "ok" if verdicts[report.id].ok else "FAIL"

    def why_cell(report: Report) -> str:
        return verdicts[report.id].why

    failed = [r.id for r in probed if not verdicts[r.id].ok]
    summary = (
        f"check: {len(failed)} of {len(probed)} failed: {', '.join(failed)}"
        if failed
        else f"check: all {len(probed)} backports ok"
    )
    columns = (_ID, _VERDICT, ("check", check_cell), ("why", why_cell))
    totals = {"ok": not failed, "failed": failed}
    extra = (("check", _check_json(verdicts)),)
    _emit(args, probed, [summary], columns, json_extra=extra, summary=totals)
    return _CHECK_FAILED if failed else _OK


def _cmd_new(args: argparse.Namespace) -> int:
    if args.from_pr is not None:  # derived from a pull request: its own command
        from .authoring.from_pr import run

        return run(args)
    missing = [f"--{n}" for n in ("id", "pr", "repo", "target", "dest") if getattr(args, n) is None]
    if missing:
        raise BackportError(f"new needs {', '.join(missing)} (or --from-pr N --repo CLONE)")
    from . import scaffold  # reads the installed target: only this command needs it

    target = scaffold.read_target(args.target)
    plan = scaffold.Scaffold(
        args.id,
        args.pr,
        args.repo,
        Path(args.dest),
        target,
        args.sha,
        args.package,
        args.since,
        args.allow_builtin_prefix,
    )
    written = scaffold.create(plan)
    print(f"wrote {plan.distribution} in {plan.dest}:")
    for path in written:
        print(f"  {path.relative_to(plan.dest)}")
    print(
        f"target {target.module}.{target.attribute}{target.signature_text} from "
        f"{target.distribution} {target.version}"
        + (f", compiled with {target.decorator}" if target.decorator else "")
    )
    if target.holders:
        print(f"held by name in: {', '.join(target.holders)}")
    print(f"next: write the sniff and the replacement (see {plan.dest / 'README.md'})")
    return _OK


def _check_json(verdicts: dict[str, Judgement]) -> Callable[[Report], Any]:
    return lambda report: verdicts[report.id].to_dict()


# ---- the parser ----------------------------------------------------------------------------


def _version() -> str:
    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run from a source tree)"


def _two_columns(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(left) for left, _ in rows)
    return "\n".join(f"  {left.ljust(width)}  {right}" for left, right in rows)


def _titled(backport_id: str, title: str) -> str:
    where = source(backport_id)
    return title if where == "builtin" else f"{title} [{where}]"


def _epilog() -> str:
    backports = _two_columns([(spec.id, _titled(spec.id, spec.title)) for spec in entries()])
    environment = _two_columns(
        [
            (f"{switches.ENABLE}=0", "every backport off (also: false, off, no)"),
            (f"{switches.SKIP}=ID,...", "these backports off"),
            (f"{switches.UPSTREAM_ONLY}=1", "upstream's code alone (also: true, on, yes)"),
            (f"{switches.SKIP_PLUGINS}=DIST,...", "these plugin distributions not loaded"),
            ("MEGATRON_BACKPORTS_CACHE=0", "probe in every process: no verdict cache"),
            ("MEGATRON_BACKPORTS_CACHE_DIR=DIR", "where the verdict cache is kept"),
        ]
    )
    return (
        f"backports (the ids --only takes):\n{backports}\n\n"
        f"environment (read by each process, the start-up hook's included):\n{environment}\n\n"
        "exit status: 0 done; 1 a check failed (check, --strict, --fail-on-landed);\n"
        "  2 the command could not run"
    )


_VERBOSE_HELP = "also show other packages' import notices (no CUDA, Transformer Engine, ...)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backports",
        description="Carry upstream Megatron-LM fixes on a pinned megatron-core.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{_DISTRIBUTION} {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _report_parsers(commands)
    _new_parser(commands)
    _sync_parser(commands)
    _upstream_tests_parser(commands)
    return parser


def _report_command(
    commands: Any, name: str, help_text: str, run: Callable[[argparse.Namespace], int]
) -> Any:
    """A subcommand that prints reports: its output formats and its own ``-v``."""
    sub = commands.add_parser(name, help=help_text, description=help_text)
    sub.set_defaults(run=run)
    formats = sub.add_mutually_exclusive_group()
    formats.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="print the reports as a JSON list (the same as --format json)",
    )
    formats.add_argument(
        "--format",
        choices=_FORMATS,
        help="table (default: fitted to a terminal), json (a list of reports), or "
        "json-object (schema_version, summary, reports, notes, warnings)",
    )
    # SUPPRESS: `backports -v status` must not be reset by the subcommand's default.
    sub.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP
    )
    return sub


def _only_option(sub: Any) -> None:
    sub.add_argument("--only", action="append", metavar="ID", help="this backport only")


def _site_dir_option(sub: Any) -> None:
    sub.add_argument(
        "--site-dir",
        metavar="DIR",
        help="where the hook file lives (default: this interpreter's site-packages)",
    )


def _report_parsers(commands: Any) -> None:
    """status, apply, revert, audit and check: the commands that print reports."""
    sub = _report_command(
        commands, "status", "probe each backport; say what apply would do", _cmd_status
    )
    _only_option(sub)
    _site_dir_option(sub)
    sub.add_argument("--strict", action="store_true", help="exit 1 if any is incompatible")

    sub = _report_command(
        commands, "apply", "apply now and at every later interpreter start", _cmd_apply
    )
    _only_option(sub)
    _site_dir_option(sub)
    sub.add_argument("--strict", action="store_true", help="fail on incompatible, also later")

    sub = _report_command(
        commands, "revert", "remove the start-up hook and revert in this process", _cmd_revert
    )
    _site_dir_option(sub)

    sub = _report_command(
        commands, "audit", "probe a candidate megatron-core without installing it", _cmd_audit
    )
    _only_option(sub)
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("--wheel", metavar="PATH", help="a megatron-core wheel")
    where.add_argument("--dir", metavar="SITE_PACKAGES", help="a folder holding megatron/")
    sub.add_argument(
        "--fail-on-landed", action="store_true", help="exit 1 if a backport has landed there"
    )

    gate = "CI gate: exit 1 if a backport is incompatible, landed, or fails to apply"
    _only_option(_report_command(commands, "check", gate, _cmd_check))


_NEW_EXAMPLE = """\
example:
  backports new --id acme-9999 --pr 9999 \\
      --repo https://github.com/NVIDIA/Megatron-LM.git \\
      --target megatron.core.utils:divide --dest ./acme-9999-backport
  cd acme-9999-backport && pip install -e . && python -m pytest   # fails until written

--target is MODULE:function or MODULE:Class.method of the installed distribution; DIR
must not exist. See docs/adding-a-backport.md."""


def _release(text: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(text))
    except InvalidVersion:
        raise argparse.ArgumentTypeError(f"not a version: {text!r}") from None


def _new_parser(commands: Any) -> None:
    help_text = "scaffold a plugin distribution that carries one upstream fix"
    sub = commands.add_parser(
        "new",
        help=help_text,
        description=help_text,
        epilog=_NEW_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.set_defaults(run=_cmd_new, format="table")
    sub.add_argument("--id", help="backport id, e.g. acme-9999")
    sub.add_argument("--pr", type=int, help="upstream pull-request number")
    sub.add_argument("--repo", metavar="URL", help="upstream repository (--from-pr: a clone)")
    sub.add_argument("--target", metavar="MODULE:QUALNAME", help="what to patch")
    sub.add_argument("--dest", metavar="DIR", help="where to write (new folder)")
    sub.add_argument(
        "--from-pr",
        type=int,
        metavar="N",
        help="derive and prove the whole plugin from pull request N of the --repo clone "
        "(see docs/from-pr.md); --id and --dest are then optional",
    )
    sub.add_argument(
        "--keep-unfinished",
        action="store_true",
        help="with --from-pr: write the plugin even when it cannot be proven (check fails)",
    )
    sub.add_argument("--sha", help="the pull request's head commit (else set it later)")
    sub.add_argument("--package", help="import name (default: <id>_backport)")
    sub.add_argument(
        "--since",
        metavar="VERSION",
        type=_release,
        help="the first release of the distribution that has the target (default: none "
        "written, the probe and the sniff decide; never the installed version)",
    )
    sub.add_argument(
        "--allow-builtin-prefix",
        action="store_true",
        help="let --id start with megatron-lm- (loading it then needs "
        "MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS=<distribution>)",
    )


def _cmd_upstream_tests(args: argparse.Namespace) -> int:
    from . import upstream_tests  # git and a child pytest: only this command needs them

    notes: list[str] = []
    rows = upstream_tests.run_upstream_tests(args.id, Path(args.repo), args.sha, notes)
    table = [("test", "stock / backport")]
    print(_two_columns(table + [(row.test, f"{row.stock} / {row.backport}") for row in rows]))
    for note in notes:
        print(f"note: {note}")
    code, summary = upstream_tests.verdict(rows)
    print(f"{args.id}: {summary}")
    return code


def _upstream_tests_parser(commands: Any) -> None:
    help_text = "run upstream's own tests of a fix, stock and with the backport"
    sub = commands.add_parser("upstream-tests", help=help_text, description=help_text)
    sub.set_defaults(run=_cmd_upstream_tests, json=False)
    sub.add_argument("id", metavar="ID", help="backport id, e.g. megatron-lm-6114")
    sub.add_argument("--repo", required=True, metavar="PATH", help="a Megatron-LM git clone")
    sub.add_argument("--sha", help="take the tests from this commit (default: the recorded)")


def _sync_parser(commands: Any) -> None:
    from .sync import cli as sync_cli  # light: git and tomlkit load only when a sync runs

    help_text = "refresh vendor/<id>/ from an upstream commit, or check it for drift"
    sub = commands.add_parser(
        "sync", help=help_text, description=sync_cli.DESCRIPTION, epilog=sync_cli.EPILOG
    )
    sync_cli.add_arguments(sub)
    sub.set_defaults(run=lambda args: sync_cli.run(sub, args), json=False)


# ---- main ----------------------------------------------------------------------------------


@contextmanager
def _warnings_as_notes(notes: list[str]) -> Iterator[None]:
    """Collect each ``BackportWarning`` as a ``warning:`` note; others show as usual."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", BackportWarning)  # the api warns once by itself
        show = warnings.showwarning

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if issubclass(category, BackportWarning):
                notes.append(f"warning: {message}")
            else:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        yield


class _ReaderGoneProof:
    """stdout for one command: once the reader hangs up (EPIPE), what is written is dropped.

    `backports check | true` or `check --json | head -1`: the reader has what it wanted, and
    the command runs on to its own exit status; a BrokenPipeError raised from a print in
    the middle of the command would otherwise decide it. The stream's file descriptor is
    pointed at /dev/null, so the interpreter's last flush at exit has nowhere to fail.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._hang_up()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._hang_up()

    def _hang_up(self) -> None:
        self.reader_gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no file descriptor (a test's capture): nothing to do
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _stdout_outliving_its_reader() -> Iterator[None]:
    stream = sys.stdout
    if stream is None:  # no stdout at all (pythonw): print() writes nothing already
        yield
        return
    sys.stdout = _ReaderGoneProof(stream)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()  # here, while a closed pipe is still dropped
        finally:
            sys.stdout = stream


def _run(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    args.format = getattr(args, "format", None) or "table"  # `new`, `sync`: no --json
    args.json = args.format != "table"  # machine-readable: stdout holds the JSON alone
    args.warning_notes = []
    # This process decides explicitly; the environment's hook must not apply on its own.
    start_up.deactivate()
    quiet = nullcontext() if args.verbose else import_notices.hidden()
    with quiet, _warnings_as_notes(args.warning_notes):
        try:
            code = int(args.run(args))
            sys.stdout.flush()  # a full disk is the command's error (a gone reader is not)
            return code
        except (BackportError, OSError) as exc:
            print(f"backports: {exc}", file=sys.stderr)
            return _CANNOT_RUN


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit status: its own, whether or not the reader of stdout hung up."""
    with _stdout_outliving_its_reader():
        return _run(argv)
