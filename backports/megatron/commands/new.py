"""``backports new``: scaffold a plugin distribution that carries one upstream fix."""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import exit_status
from ..errors import BackportError
from . import _options

_EXAMPLE = """\
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = _EXAMPLE
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--id", help="backport id, e.g. acme-9999")
    parser.add_argument("--pr", type=_options.pull_request, help="upstream pull-request number")
    parser.add_argument("--repo", metavar="URL", help="upstream repository (--from-pr: a clone)")
    parser.add_argument("--target", metavar="MODULE:QUALNAME", help="what to patch")
    parser.add_argument("--dest", metavar="DIR", help="where to write (new folder)")
    parser.add_argument(
        "--from-pr",
        type=_options.pull_request,
        metavar="N",
        help="derive and prove the whole plugin from pull request N of the --repo clone "
        "(see docs/from-pr.md); --id and --dest are then optional",
    )
    parser.add_argument(
        "--keep-unfinished",
        action="store_true",
        help="with --from-pr: write the plugin even when it cannot be proven (check fails)",
    )
    parser.add_argument("--sha", help="the pull request's head commit (else set it later)")
    parser.add_argument("--package", help="import name (default: <id>_backport)")
    parser.add_argument(
        "--since",
        metavar="VERSION",
        type=_release,
        help="the first release of the distribution that has the target (default: none "
        "written, the probe and the sniff decide; never the installed version)",
    )
    parser.add_argument(
        "--allow-builtin-prefix",
        action="store_true",
        help="let --id start with megatron-lm- (loading it then needs "
        "MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS=<distribution>)",
    )


def run(args: argparse.Namespace) -> int:
    if args.from_pr is not None:  # derived from a pull request: its own pipeline
        return _from_pr(args)
    missing = [f"--{n}" for n in ("id", "pr", "repo", "target", "dest") if getattr(args, n) is None]
    if missing:
        raise BackportError(f"new needs {', '.join(missing)} (or --from-pr N --repo CLONE)")
    from ..authoring import scaffold  # reads the installed target: only a scaffold needs it

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
    return exit_status.DONE


def _from_pr(args: argparse.Namespace) -> int:
    """``--from-pr``: 0 written and proven, 1 not proven or refused, 2 bad input. Every error
    is one line on stderr, after the report of what was derived (a conflict shows its hunk
    after); nothing to carry (exit 0) is one line on stdout."""
    from ..authoring.from_pr import FromPrError, derive_plugin

    try:
        derived = derive_plugin(args, _say_now)
    except FromPrError as exc:
        _print_lines(exc.report)
        first, *rest = str(exc).splitlines()
        written = "" if exc.exit_code != 1 else "; nothing written"
        where = sys.stdout if exc.exit_code == 0 else sys.stderr  # nothing to do: no error
        # A refusal's named reason leads (docs/from-pr.md gives each one's next step).
        named = f"[{exc.reason.code}] " if exc.exit_code == 1 and exc.reason else ""
        print(f"backports new: {named}{first.rstrip(':')}{written}", file=where)
        for line in rest:  # a merge conflict's hunk
            print(f"  {line}", file=sys.stderr)
        return exc.exit_code
    _print_lines(derived.report)
    if derived.unfinished is not None:
        print(
            f"wrote the UNFINISHED plugin {derived.distribution} in {derived.dest} "
            f"(backports check fails on it): {derived.unfinished}",
            file=sys.stderr,
        )
        return exit_status.FAILED
    print(f"wrote {derived.distribution} in {derived.dest}: proven (contract kit, backports check)")
    return exit_status.DONE


def _say_now(line: str) -> None:
    """A notice before the children run (they take minutes): shown at once."""
    print(line, flush=True)


def _print_lines(lines: Sequence[str]) -> None:
    for line in lines:
        print(line)
