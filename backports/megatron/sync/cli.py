"""The flags of a sync: ``backports sync`` and ``tools/sync_upstream.py`` (its wrapper).

    backports sync --backport megatron-lm-7617 --pr 7617             # the PR's head
    backports sync --backport megatron-lm-7617 --sha SHA --repo ../Megatron-LM
    backports sync --backport megatron-lm-7617 --rehash               # handwritten folder
    backports sync --check
    backports sync --vendor-dir ../acme-backport/acme_backport/vendor --backport acme-7617 --pr 7617

Exit status: 0 done (or nothing to do), 1 refused (the commit's code does not show the
fix, or cannot be sniffed here) or ``--check`` found drift, 2 an error, 130 interrupted
(Ctrl-C, the shell's convention), each reported in one line on stderr (the vendored files
are then the old ones, unless the line says otherwise). The commands wing
(``commands/sync.py``) runs a sync and prints: this module only declares its flags.
"""

import argparse
import importlib.util
from pathlib import Path

from .. import exit_status
from .fetch import SHA_RULE

# The exit statuses of every `backports` command (exit_status), under a sync's names.
EXIT_DONE, EXIT_REFUSED, EXIT_ERROR = exit_status.DONE, exit_status.FAILED, exit_status.CANNOT_RUN
EXIT_INTERRUPTED = exit_status.INTERRUPTED
DESCRIPTION = (
    "Refresh vendor/<backport>/ (or a plugin's, --vendor-dir) from an upstream commit "
    "(--backport with --sha, --pr or both): show the diff, sniff the candidate in a child "
    "interpreter, write it only if the sniff shows the fix. Or record the hashes of a "
    "handwritten folder (--rehash), or check for drift (--check)."
)
EPILOG = (
    "exit status: 0 done, 1 refused (no fix at that commit, or not sniffable here) or drift, "
    "2 an error, 130 interrupted"
)


def default_vendor_dir() -> Path:
    """This installation's own vendored folders: ``vendor/`` of the checkout an editable
    install points at, else the installed ``backports.megatron._vendor``."""
    checkout = Path(__file__).resolve().parents[3] / "vendor"
    if checkout.is_dir():
        return checkout
    spec = importlib.util.find_spec("backports.megatron._vendor")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else checkout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backport", help="backport id, e.g. megatron-lm-7617")
    parser.add_argument(
        "--sha",
        help=f"upstream commit: {SHA_RULE} (default with --pr: the PR's head)",
    )
    parser.add_argument("--repo", help="URL or local path (default: repo in UPSTREAM.toml)")
    parser.add_argument(
        "--pr", type=int, help="fetch refs/pull/PR/head; alone, sync that head commit"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the diff; run nothing fetched (no sniff), write nothing",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write the commit's code even if its sniff does not show the fix, or cannot run "
        "here (a plugin not installed yet); the probe then judges it",
    )
    parser.add_argument(
        "--rehash",
        action="store_true",
        help="record sha256 and files_sha256 of a handwritten folder as it is",
    )
    parser.add_argument(
        "--check", action="store_true", help="verify sha256 and files_sha256 only, no network"
    )
    parser.add_argument(
        "--vendor-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the folder holding the <id>/ folders (default: this installation's vendor/; "
        "a plugin's: <package>/vendor)",
    )
