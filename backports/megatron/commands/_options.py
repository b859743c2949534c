"""Options more than one command takes, spelled once."""

import argparse

from .output import FORMATS

VERBOSE_HELP = "also show other packages' import notices (no CUDA, Transformer Engine, ...)"


def add_report_formats(parser: argparse.ArgumentParser) -> None:
    """What a command that prints reports takes: its output format, and its own ``-v``."""
    formats = parser.add_mutually_exclusive_group()
    formats.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="print the reports as a JSON list (the same as --format json)",
    )
    formats.add_argument(
        "--format",
        choices=FORMATS,
        help="table (default: fitted to a terminal), json (a list of reports), or "
        "json-object (schema_version, summary, reports, notes, warnings)",
    )
    # SUPPRESS: `backports -v status` must not be reset by the subcommand's default.
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
    )


def add_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", metavar="ID", help="this backport only")


def add_site_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--site-dir",
        metavar="DIR",
        help="where the hook files live (default: this interpreter's site-packages)",
    )


def only(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--only`` ids, each once, in the order given; None: every backport."""
    return tuple(dict.fromkeys(args.only)) if args.only else None
