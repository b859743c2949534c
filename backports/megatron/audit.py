"""Probe a candidate megatron-core (a wheel or a site-packages folder) without installing it.

The probe runs in a child interpreter with the candidate first on ``sys.path``: this
process may have imported the installed megatron-core already, and a module cannot be
imported twice. The child loads this package before it puts the candidate on the path,
so a candidate folder that holds another megatron-backports cannot replace the tool.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .errors import BackportError
from .report import Action, Report, Verdict

__all__ = ["audit", "candidate_dir", "outcome"]

_CHILD = """
import json, sys
out, ours, candidate, *only = sys.argv[1:]
sys.path.insert(0, ours)  # this very copy of the tool, whatever the child finds first
from backports.megatron import activation
activation.deactivate()  # the environment's hook file must not patch the candidate
from backports.megatron.api import status
sys.path.insert(0, candidate)
reports = status(only or None)
with open(out, "w", encoding="utf-8") as handle:
    json.dump([report.to_dict() for report in reports], handle)
"""

# The user's switches say what to run here, not what the candidate needs.
_CLEARED_ENV = ("MEGATRON_BACKPORTS", "MEGATRON_BACKPORTS_SKIP")


def _extract_wheel(wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(into)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BackportError(f"cannot read wheel {wheel}: {exc}") from exc
    # A wheel's <name>.data/{purelib,platlib} install into site-packages itself.
    for data in into.glob("*.data"):
        for scheme in ("purelib", "platlib"):
            for item in (data / scheme).glob("*") if (data / scheme).is_dir() else ():
                shutil.move(str(item), str(into / item.name))
    return into


@contextmanager
def candidate_dir(wheel: Path | None = None, site_dir: Path | None = None) -> Iterator[Path]:
    """The folder to put first on ``sys.path``: ``site_dir``, or ``wheel`` extracted."""
    if (wheel is None) == (site_dir is None):
        raise BackportError("give exactly one of a wheel or a site-packages folder")
    if site_dir is not None:
        if not site_dir.is_dir():
            raise BackportError(f"{site_dir} is not a folder")
        yield site_dir.resolve()
        return
    assert wheel is not None
    with tempfile.TemporaryDirectory(prefix="backports-audit-") as tmp:
        yield _extract_wheel(wheel, Path(tmp))


def audit(
    candidate: Path, only: Sequence[str] | None = None, *, timeout: float = 600
) -> list[Report]:
    """``status()`` as it would be with ``candidate`` installed."""
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
    with tempfile.TemporaryDirectory(prefix="backports-audit-out-") as tmp:
        out = Path(tmp) / "reports.json"
        ours = Path(__file__).resolve().parents[2]  # the folder holding backports/
        command = [sys.executable, "-c", _CHILD, str(out), str(ours), str(candidate)]
        try:
            done = subprocess.run(
                [*command, *(only or ())],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackportError(f"probing {candidate} took over {timeout:.0f} s") from exc
        if done.returncode != 0 or not out.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise BackportError(f"probing {candidate} failed (exit {done.returncode}):\n{tail}")
        data = json.loads(out.read_text(encoding="utf-8"))
    return [
        Report(d["id"], Verdict(d["verdict"]), Action(d["action"]), d["reason"], d["evidence"])
        for d in data
    ]


def outcome(report: Report) -> str:
    """What a candidate's verdict means for the backport."""
    return {
        Verdict.NEEDED: "still needed",
        Verdict.UPSTREAM: "landed: delete it",
        Verdict.ABSENT: "target absent: not needed",
        Verdict.INCOMPATIBLE: "does not fit: update or delete",
        Verdict.DISABLED: "disabled",
    }[report.verdict]
