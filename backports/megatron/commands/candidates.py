"""``backports candidates``: upstream merges since the installed release's branch point,
ranked: what each changes, whether the release has it, who carries it, and what
``backports new --from-pr`` would say (see docs/candidates.md)."""

import argparse


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
    from ..authoring.candidates import run as candidates

    return candidates(args)
