"""``backports sync``: refresh ``vendor/<id>/`` from an upstream commit, or check it for drift.

The sync's own command line (``sync.cli``, which ``tools/sync_upstream.py`` runs too) keeps
its options and its one-line errors; this module only seats it among the commands.
"""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..sync import cli  # light: git and tomlkit load only when a sync runs

    parser.description = cli.DESCRIPTION
    parser.epilog = cli.EPILOG
    cli.add_arguments(parser)
    parser.set_defaults(sync_parser=parser)  # its usage errors name `backports sync`


def run(args: argparse.Namespace) -> int:
    from ..sync import cli

    return cli.run(args.sync_parser, args)
