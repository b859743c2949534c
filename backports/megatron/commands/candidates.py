"""``backports candidates``: upstream merges since the installed release's branch point,
ranked: what each changes, whether the release has it, who carries it, and what
``backports new --from-pr`` would say (see docs/candidates.md)."""

import argparse
import sys

from .. import exit_status


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repo", metavar="CLONE", help="a local Megatron-LM clone (a plain clone is enough)"
    )
    parser.add_argument(
        "--since",
        metavar="REF",
        help="look at main's merges after REF (default: the installed release's branch point)",
    )
    parser.add_argument(
        "--json", dest="format", action="store_const", const="json", help="every field, as JSON"
    )
    parser.add_argument(
        "--derive",
        type=_count,
        metavar="K",
        help="run `backports new --from-pr` on the top K carryable candidates not yet carried",
    )


def run(args: argparse.Namespace) -> int:
    """0: the clone and the installed release were read (else ``CannotRead``: exit 2)."""
    from ..authoring.candidates import listing

    print(listing(args, _progress))
    return exit_status.DONE


def _progress(line: str) -> None:
    """``--derive``'s line before each child: on stderr, as it comes."""
    print(line, file=sys.stderr, flush=True)
