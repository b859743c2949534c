"""The ``backports`` argument parser: every command listed, only the one asked for built.

A command's options come from its own module, imported only when it is the one on the
command line: ``backports --help``, ``--version``, ``new --help`` and ``sync --check`` load
no other command, no catalog entry and no plugin. The backport ids that ``--help`` lists
are read without importing an entry: the builtins from the catalog folder's file names
(``catalog/megatron_lm_7617.py`` is ``megatron-lm-7617``), the plugins from their entry
points' metadata.
"""

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from . import COMMANDS, load
from ._options import VERBOSE_HELP
from .output import two_columns

_DISTRIBUTION = "megatron-backports"
_PLUGIN_GROUP = "megatron_backports"  # plugins.GROUP, not imported: it loads the model
_GLOBAL_FLAGS = ("-h", "--help", "--version", "-v", "--verbose")  # none takes a value
# The switches each process reads (switches.py, verdict_cache.py: imported, they would load
# the catalog; tests/commands/test_commands_wing.py holds these names to theirs).
_ENVIRONMENT = (
    ("MEGATRON_BACKPORTS=0", "every backport off (also: false, off, no)"),
    ("MEGATRON_BACKPORTS_SKIP=ID,...", "these backports off"),
    ("MEGATRON_BACKPORTS_UPSTREAM_ONLY=1", "upstream's code alone (also: true, on, yes)"),
    ("MEGATRON_BACKPORTS_SKIP_PLUGINS=DIST,...", "these plugin distributions not loaded"),
    ("MEGATRON_BACKPORTS_CACHE=0", "probe in every process: no verdict cache"),
    ("MEGATRON_BACKPORTS_CACHE_DIR=DIR", "where the verdict cache is kept"),
)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed, with ``run`` (the command's) set; argparse exits on ``--help``,
    ``--version`` and a usage error, as ever."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return _parser(argv).parse_args(argv)


def _asked_for(argv: list[str]) -> tuple[str | None, bool]:
    """(the command named on the line: the first word after the global flags, if any;
    whether those flags ask for the help, which argparse then gives before the command's)."""
    flags: list[str] = []
    for arg in argv:
        if arg not in _GLOBAL_FLAGS:
            return (arg if arg in COMMANDS else None), bool({"-h", "--help"} & set(flags))
        flags.append(arg)
    return None, bool({"-h", "--help"} & set(flags))


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    name, wants_help = _asked_for(argv)
    parser = _OneLineErrors(
        prog="backports",
        description="Carry upstream Megatron-LM fixes on a pinned megatron-core.",
        epilog=_epilog() if wants_help else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command, info in COMMANDS.items():
        sub = commands.add_parser(command, help=info.summary, description=info.summary)
        if command == name:
            module = load(command)
            module.add_arguments(sub)
            sub.set_defaults(run=module.run)
    return parser


class _OneLineErrors(argparse.ArgumentParser):
    """A usage error as one line and exit 2, its command's and every subcommand's (argparse
    makes the subparsers of this class): argparse's usage block before it runs to five
    lines and more and buries the one that says what was wrong. ``--help`` has the rest."""

    def error(self, message: str) -> NoReturn:
        said = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {said} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """``--version``, reading the installed version only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        import importlib.metadata

        try:
            version = importlib.metadata.version(_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            version = "(not installed: run from a source tree)"
        print(f"{_DISTRIBUTION} {version}")
        parser.exit()


# ---- the ids --help lists ------------------------------------------------------------------


def _number_first(name: str) -> list[tuple[int, str]]:
    """Sort key: the numbers in a name compared as numbers, highest first (newest PR)."""
    return [(-int(part), "") if part.isdigit() else (0, part) for part in re.split(r"(\d+)", name)]


def _first_docstring_line(path: str) -> str:
    """What a builtin's module says of itself, read as text: its docstring's first line
    without the ``NVIDIA/Megatron-LM#N:`` that the id already says."""
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.readline().strip()
    except OSError:
        return ""
    if not first.startswith('"""'):
        return ""
    text = first.strip('"').strip().rstrip(".").replace("``", "")
    return re.sub(r"^\S+#\d+:\s*", "", text)


def _builtins() -> list[tuple[str, str]]:
    spec = importlib.util.find_spec("backports.megatron.catalog")  # found, not executed
    folders = list(spec.submodule_search_locations or []) if spec else []
    found = {
        entry.name.removesuffix(".py"): entry.path
        for folder in folders
        for entry in os.scandir(folder)
        if re.fullmatch(r"megatron_lm_\d+\.py", entry.name)
    }
    return [
        (name.replace("_", "-"), _first_docstring_line(found[name]))
        for name in sorted(found, key=_number_first)
    ]


def _plugins() -> list[tuple[str, str]]:
    import importlib.metadata

    listed = []
    for point in importlib.metadata.entry_points(group=_PLUGIN_GROUP):
        dist = point.dist
        source = f"{dist.name} {dist.version}" if dist is not None else point.value
        listed.append((point.name, f"plugin [{source}]"))  # as its reports name it
    return list(dict.fromkeys(listed))


def backport_ids() -> list[tuple[str, str]]:
    """(id, what it is) of every builtin, then every plugin entry point, importing none."""
    return _builtins() + _plugins()


def _epilog() -> str:
    return (
        "backports (the ids --only takes; a plugin's entry point may hold several):\n"
        f"{two_columns(backport_ids())}\n\n"
        "environment (read by each process, the start-up hook's included):\n"
        f"{two_columns(_ENVIRONMENT)}\n\n"
        "exit status: 0 done; 1 a check failed (check, --strict, --fail-on-landed, a sync\n"
        "  refused or drifted); 2 the command could not run; 130 interrupted (Ctrl-C)"
    )
