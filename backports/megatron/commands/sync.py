"""``backports sync``: refresh ``vendor/<id>/`` from an upstream commit, or check it for drift.

The sync's flags are ``sync.cli``'s; the sync itself (``sync.commands``) says what it does to
a ``SyncReport`` and raises a ``SyncError`` where it stops. This module alone shows the report
as it comes (stdout) and turns its end into one line on stderr and an exit status, for
``backports sync`` and for ``tools/sync_upstream.py`` (``main``, under its own name):

0 done (or nothing to do), 1 refused (the commit's code does not show the fix, or cannot be
sniffed here) or ``--check`` found drift, 2 an error, 130 interrupted (Ctrl-C, the shell's
convention), each said in one line on stderr (the vendored files are then the old ones,
unless the line says otherwise).
"""

import argparse
import sys
from collections.abc import Sequence

from .. import exit_status
from ..errors import BackportError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..sync import cli  # light: git and tomlkit load only when a sync runs

    parser.description = cli.DESCRIPTION
    parser.epilog = cli.EPILOG
    cli.add_arguments(parser)
    parser.set_defaults(sync_parser=parser)  # its usage errors name `backports sync`


def run(args: argparse.Namespace) -> int:
    return run_parsed(args.sync_parser, args)


def main(argv: Sequence[str] | None = None, prog: str = "backports sync") -> int:
    """The sync's own command line (``tools/sync_upstream.py`` passes its name as ``prog``)."""
    from ..sync import cli

    parser = argparse.ArgumentParser(prog=prog, description=cli.DESCRIPTION, epilog=cli.EPILOG)
    cli.add_arguments(parser)
    return run_parsed(parser, parser.parse_args(argv))


def run_parsed(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run parsed arguments; every failure is one line on stderr, never a traceback."""
    from ..sync.errors import Interrupted, Refused

    code = exit_status.CANNOT_RUN
    try:
        return _dispatch(parser, args)
    except Refused as exc:
        message, code = str(exc), exit_status.FAILED
    except Interrupted as exc:
        message, code = str(exc), exit_status.INTERRUPTED
    except BackportError as exc:
        message = str(exc)
    except KeyboardInterrupt:
        message, code = "interrupted; nothing written", exit_status.INTERRUPTED
    except OSError as exc:
        message = f"{exc}; nothing written"
    except Exception as exc:  # a bug: still one line, never a traceback
        message = f"unexpected {type(exc).__name__}: {exc}"
    kind = "refused" if code == exit_status.FAILED else "error"
    print(f"{parser.prog}: {kind}: {_one_line(message)}", file=sys.stderr)
    return code


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # Here, not at the top: every `backports` command builds this parser, and the steps of
    # a sync (the renderer: ~35 ms of imports) serve only a sync.
    from ..sync import commands
    from ..sync.cli import default_vendor_dir
    from ..sync.report import SyncReport

    vendor = args.vendor_dir if args.vendor_dir is not None else default_vendor_dir()
    fetching = [flag for flag in ("sha", "repo", "pr") if getattr(args, flag) is not None]
    report = SyncReport(show=sys.stdout.write)  # each line as it comes: the diff before the sniff
    if args.check:
        if fetching or args.dry_run or args.rehash or args.force:
            parser.error("--check takes only --backport")
        commands.check(vendor, args.backport, report)
    elif args.backport is None:
        parser.error("a sync needs --backport and --sha or --pr (or use --check)")
    elif args.rehash:
        if fetching or args.force:
            parser.error("--rehash takes only --backport and --dry-run")
        commands.rehash(vendor, args.backport, args.dry_run, report)
    elif args.sha is None and args.pr is None:
        parser.error("a sync needs --backport and --sha or --pr (or use --check)")
    else:
        commands.sync(
            vendor,
            args.backport,
            args.sha,
            args.repo,
            args.pr,
            args.dry_run,
            force=args.force,
            report=report,
        )
    return exit_status.FAILED if report.failed else exit_status.DONE


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
