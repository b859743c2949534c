"""The ``backports`` commands, one module each, found by name and imported only when run.

As pip's ``commands/__init__.py``: a registry of name -> (module, summary). ``backports
--help`` lists the summaries without importing a command; ``backports status`` imports the
status module alone (and what it needs), never the seven others.

Each command module holds ``add_arguments(parser)`` (its options, and its description or
epilog where the summary is not enough) and ``run(args) -> int`` (its exit status, from
``backports.megatron.exit_status``). ``main`` (``commands.main``) parses, runs, and turns
every error into one line: the command need not.
"""

import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = ["COMMANDS", "CommandInfo", "load"]


@dataclass(frozen=True)
class CommandInfo:
    module: str  # under backports.megatron.commands
    summary: str  # one line for `backports --help`


COMMANDS: dict[str, CommandInfo] = {
    "status": CommandInfo("status", "probe each backport; say what apply would do"),
    "apply": CommandInfo("apply", "apply now and at every later interpreter start"),
    "revert": CommandInfo("revert", "remove the start-up hook and revert in this process"),
    "audit": CommandInfo("audit", "probe a candidate megatron-core without installing it"),
    "check": CommandInfo(
        "check", "CI gate: exit 1 if a backport is incompatible, landed, or fails to apply"
    ),
    "new": CommandInfo("new", "scaffold a plugin distribution that carries one upstream fix"),
    "sync": CommandInfo(
        "sync", "refresh vendor/<id>/ from an upstream commit, or check it for drift"
    ),
    "candidates": CommandInfo(
        "candidates",
        "upstream fixes since the installed release: which are missing, who carries them",
    ),
    "upstream-tests": CommandInfo(
        "upstream_tests", "run upstream's own tests of a fix, stock and with the backport"
    ),
}


def load(name: str) -> ModuleType:
    """The module of command ``name`` (a key of ``COMMANDS``), imported now."""
    return importlib.import_module(f"{__name__}.{COMMANDS[name].module}")
