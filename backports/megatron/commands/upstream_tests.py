"""``backports upstream-tests``: run upstream's own tests of a fix, stock and with the
backport, and count a test only where it fails stock and passes with the backport."""

import argparse
import json
from pathlib import Path

from . import _options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="backport id, e.g. megatron-lm-6114")
    parser.add_argument("--repo", required=True, metavar="PATH", help="a Megatron-LM git clone")
    parser.add_argument("--sha", help="take the tests from this commit (default: the recorded)")
    # As every command's --json: the wing's main reads ``format`` (stdout holds the JSON alone).
    parser.add_argument(
        "--json", dest="format", action="store_const", const="json", help="print a JSON object"
    )
    parser.add_argument(
        "--timeout",
        type=_options.seconds,
        default=600.0,
        metavar="SECONDS",
        help="time limit of each run (stock, backport); unfinished tests are 'timed out' "
        f"(default: 600; at most {_options.MAX_SECONDS:.0f})",
    )
    parser.add_argument(
        "--launcher",
        choices=("python", "torchrun"),
        default="python",
        help="torchrun: each run under `torchrun --standalone --nproc_per_node 1`, for "
        "upstream's harness, which needs LOCAL_RANK and a process group (default: python)",
    )
    parser.add_argument("--log-dir", metavar="DIR", help="keep each run's pytest output here")


def run(args: argparse.Namespace) -> int:
    # git and a child pytest: only this command needs them
    from .. import upstream_tests
    from ..upstream_tests import judgement as upstream_verdict

    result = upstream_tests.run(
        args.id,
        Path(args.repo),
        args.sha,
        launcher=args.launcher,
        timeout_s=args.timeout,
        log_dir=Path(args.log_dir) if args.log_dir else None,
    )
    doc = upstream_tests.document(result)
    print(json.dumps(doc, indent=1) if args.json else upstream_verdict.text(doc))
    return int(doc["exit_status"])
