"""``backports status``: probe each backport and say what ``apply`` would do; change nothing."""

import argparse

from .. import api, exit_status
from ..report import Verdict
from . import _hook, _options, output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options.add_report_formats(parser)
    _options.add_only(parser)
    _options.add_site_dir(parser)
    parser.add_argument("--strict", action="store_true", help="exit 1 if any is incompatible")


def run(args: argparse.Namespace) -> int:
    site_dir = _hook.site_dir(args)
    hook = _hook.Hook.read(site_dir)
    reports = [_hook.with_hook(report, hook) for report in api.status(_options.only(args))]
    output.emit(args, reports, [_hook.status_note(hook, site_dir), *_hook.site_warning(site_dir)])
    incompatible = any(r.verdict is Verdict.INCOMPATIBLE for r in reports)
    return exit_status.FAILED if args.strict and incompatible else exit_status.DONE
