"""The start-up hook as the commands report it: its state in each report's evidence, the
``active-via-hook`` action, and the notes under the table."""

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import BackportError
from ..report import Action, Report
from . import _job


@dataclass(frozen=True)
class Hook:
    """The hook files of a site dir, read once per command."""

    state: _job.HookState
    current: bool
    runs_at_startup: bool  # in a site-packages folder of this interpreter

    @classmethod
    def read(cls, site_dir: Path) -> "Hook":
        state = _job.read_hook(site_dir)
        return cls(state, state.current, _job.is_site_dir(site_dir))

    def applies(self, backport_id: str) -> bool:
        """Whether later processes apply ``backport_id`` through this hook."""
        working = self.current or self.state.working  # an earlier version's line patches too
        if not (working and self.runs_at_startup) or self.state.config is None:
            return False
        only = self.state.config.get("only")
        return only is None or backport_id in only

    def evidence(self, backport_id: str) -> dict[str, Any]:
        config = self.state.config or {}
        return {
            "path": str(self.state.path),
            "exists": self.state.exists,
            # PEP 829's twin of the .pth file (Python 3.15+), or None where there is none.
            "start_file": str(self.state.start_path) if self.state.start_exists else None,
            "current": self.current,  # written by this version for this interpreter
            "runs_at_startup": self.runs_at_startup,
            "applies": self.applies(backport_id),
            "only": None if config.get("only") is None else list(config["only"]),
            "strict": bool(config.get("strict", False)),
        }

    def files(self) -> str:
        """The hook's files, as a note names them: the .pth, and the .start beside it."""
        if not self.state.start_exists:
            return str(self.state.path)
        return f"{self.state.path} (and {self.state.start_path.name} for Python 3.15+)"


def site_dir(args: argparse.Namespace) -> Path:
    """``--site-dir``, or this interpreter's site-packages; a usage error if not a folder."""
    folder = Path(args.site_dir) if args.site_dir else _job.default_site_dir()
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise BackportError(f"site dir {folder} {what}")
    return folder


def site_warning(folder: Path) -> list[str]:
    if _job.is_site_dir(folder):
        return []
    return [
        f"note: {folder} is not a site-packages folder of {sys.executable}: its .pth files "
        "run only in interpreters that add it as a site dir"
    ]


def status_note(hook: Hook, folder: Path) -> str:
    if not hook.state.exists and not hook.state.start_exists:
        return f"hook: none in {folder}: `backports apply` activates the backports at job start"
    if not hook.current and not hook.state.working:
        return f"hook: {hook.files()} is stale or not ours: rerun `backports apply` to refresh it"
    only = (hook.state.config or {}).get("only")
    which = "the backports" if only is None else ", ".join(only)
    said = f"hook: {hook.files()} activates {which} in every new interpreter"
    if not hook.current:
        said += " (written by another version: `backports apply` refreshes it)"
    return said


def _installs_when(report: Report) -> str:
    """Which import installs ``report``'s backport in a new process (not ``import megatron``:
    the trigger patches when the module that defines each target is imported)."""
    targets = report.evidence.get("targets") or [report.evidence.get("target") or {}]
    modules = list(dict.fromkeys(str(t["module"]) for t in targets if t.get("module")))
    if not modules:
        return "the start-up hook installs it in each new process"
    if len(modules) == 1:
        return f"the start-up hook installs it in each new process that imports {modules[0]}"
    return (
        "the start-up hook installs it in each new process once it has imported "
        f"{', '.join(modules[:-1])} and {modules[-1]}"
    )


def with_hook(report: Report, hook: Hook) -> Report:
    """``report`` with the hook's state in its evidence, and in its action where it applies."""
    evidence = {**report.evidence, "hook": hook.evidence(report.id)}
    if report.action is Action.WOULD_INSTALL and hook.applies(report.id):
        reason = f"{report.reason}; {_installs_when(report)}"
        return replace(report, action=Action.ACTIVE_VIA_HOOK, reason=reason, evidence=evidence)
    return replace(report, evidence=evidence)
