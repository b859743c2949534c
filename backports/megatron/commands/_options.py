"""Options more than one command takes, spelled once, and the types of numeric options.

A numeric option is checked where it is parsed, by its ``type``: a bad value is one line
(``main_parser``: argparse's usage errors are one line) and exit 2, before anything runs.
"""

import argparse
import math

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


MAX_SECONDS = 24 * 3600.0  # a time limit beyond a day is a typo (or "inf"), not a limit


def seconds(text: str) -> float:
    """A time limit: a finite number of seconds above 0 and at most ``MAX_SECONDS``.
    ``float()`` alone takes ``nan`` (every comparison with it false: no limit at all),
    ``inf``, ``0`` and ``-1``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_SECONDS):  # false for nan too
        raise argparse.ArgumentTypeError(
            f"expected seconds, a number above 0 and at most {MAX_SECONDS:.0f}: got {text!r}"
        )
    return value


def pull_request(text: str) -> int:
    """A pull-request number: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a pull-request number (a whole number above 0): got {text!r}"
        )
    return value
