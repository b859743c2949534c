"""``backports audit``: probe a candidate megatron-core (a wheel, a site-packages folder)
without installing it, and say what each backport's verdict there means for it.

Exit 2 (and no table) when the candidate cannot be probed in this environment: a verdict
that comes from a missing torch says nothing about the backports, and a pin-bump gate must
not pass, nor tell anyone to delete a backport, on it.
"""

import argparse
import sys
from pathlib import Path

from .. import exit_status
from ..report import Report, Verdict
from . import _candidate, _options, output


def outcome(report: Report) -> str:
    """What a candidate's verdict means for the backport."""
    return {
        Verdict.NEEDED: "still needed",
        Verdict.UPSTREAM: "landed: delete it",
        Verdict.ABSENT: "target absent: not needed",
        Verdict.INCOMPATIBLE: "does not fit: update or delete",
        Verdict.DISABLED: "disabled",
    }[report.verdict]


_OUTCOME: output.Column = ("outcome", outcome)
_COLUMNS = (
    output.ID,
    output.UPSTREAM,
    ("candidate", output.core_version),
    output.VERDICT,
    _OUTCOME,
    output.REASON,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options.add_report_formats(parser)
    _options.add_only(parser)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--wheel", metavar="PATH", help="a megatron-core wheel")
    where.add_argument("--dir", metavar="SITE_PACKAGES", help="a folder holding megatron/")
    parser.add_argument(
        "--fail-on-landed", action="store_true", help="exit 1 if a backport has landed there"
    )


def run(args: argparse.Namespace) -> int:
    wheel = Path(args.wheel) if args.wheel else None
    folder = Path(args.dir) if args.dir else None
    with _candidate.candidate_dir(wheel, folder) as candidate:
        label = str(wheel or folder)
        reports = _candidate.audit(
            candidate, _options.only(args), label=label, verbose=args.verbose
        )
    output.emit(args, reports, [], _COLUMNS, json_extra=(_OUTCOME,))
    landed = [r.id for r in reports if r.verdict is Verdict.UPSTREAM]
    if landed and args.fail_on_landed:
        print(f"backports: landed in the candidate, delete: {', '.join(landed)}", file=sys.stderr)
        return exit_status.FAILED
    return exit_status.DONE
