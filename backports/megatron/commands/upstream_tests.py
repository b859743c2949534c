"""``backports upstream-tests``: run upstream's own tests of a fix, stock and with the
backport, and count a test only where it fails stock and passes with the backport."""

import argparse
from pathlib import Path

from . import output

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="backport id, e.g. megatron-lm-6114")
    parser.add_argument("--repo", required=True, metavar="PATH", help="a Megatron-LM git clone")
    parser.add_argument("--sha", help="take the tests from this commit (default: the recorded)")


def run(args: argparse.Namespace) -> int:
    from .. import upstream_tests  # git and a child pytest: only this command needs them

    notes: list[str] = []
    rows = upstream_tests.run_upstream_tests(args.id, Path(args.repo), args.sha, notes)
    table = [("test", "stock / backport")]
    print(output.two_columns(table + [(row.test, f"{row.stock} / {row.backport}") for row in rows]))
    for note in notes:
        print(f"note: {note}")
    code, summary = upstream_tests.verdict(rows)
    print(f"{args.id}: {summary}")
    return code
