"""``backports``: parse the line, run the one command it names, and answer for its end.

One policy for every command: its own exit status (``exit_status``); a ``BackportError`` or
an ``OSError`` is one line on stderr and exit 2; Ctrl-C is one line and exit 130, whatever
the command was doing (what it writes, it writes whole: the hook files atomically, JSON built
before it is printed); a reader of stdout that hangs up, or a closed stdout, changes nothing
(``output.command_streams``: the latter is said in one line on stderr); control characters
in what is printed are shown escaped.
"""

import sys
from collections.abc import Sequence
from contextlib import nullcontext

from .. import exit_status
from ..errors import BackportError
from . import main_parser, output


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit status: its own, whether or not the reader of stdout hung up."""
    with output.command_streams():
        try:
            return _run(argv)
        except KeyboardInterrupt:
            print("backports: interrupted", file=sys.stderr)
            return exit_status.INTERRUPTED


def _run(argv: Sequence[str] | None) -> int:
    args = main_parser.parse(argv)
    args.format = getattr(args, "format", None) or "table"  # `new`, `sync`: no --json
    args.json = args.format != "table"  # machine-readable: stdout holds the JSON alone
    args.warning_notes = []
    # This process decides explicitly; the environment's hook must not apply on its own.
    # Imported here, past the parse: --help and --version need no hook file (importlib.metadata).
    from . import _job

    _job.ignore_this_interpreters_trigger()
    quiet = nullcontext() if args.verbose else output.import_notices_hidden()
    with quiet, output.warnings_as_notes(args.warning_notes), output.root_logging_kept_off_stdout():
        try:
            code = int(args.run(args))
            sys.stdout.flush()  # a full disk is the command's error (a gone reader is not)
            return code
        except (BackportError, OSError) as exc:
            print(f"backports: {exc}", file=sys.stderr)
            return exit_status.CANNOT_RUN
