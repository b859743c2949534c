"""Probe a candidate megatron-core (a wheel or a site-packages folder) without installing it.

The probe runs in a child interpreter with the candidate first on ``sys.path``: this
process may have imported the installed megatron-core already, and a module cannot be
imported twice. The child loads this package before it puts the candidate on the path,
so a candidate folder that holds another megatron-backports cannot replace the tool.

A candidate is megatron-core only if megatron.core is imported from it: the child checks
that before it probes (another project's wheel or an empty folder would otherwise probe
the installed copy and pass), and ``audit`` checks the module the probe imported.
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
from typing import Any

from . import switches
from .catalog import select
from .decision import verdict_cache
from .errors import BackportError
from .report import Action, Report, Verdict

__all__ = ["audit", "candidate_dir", "outcome"]

_CHILD = """
import importlib.util, json, sys
from pathlib import Path
out, ours, candidate, verbose, *only = sys.argv[1:]
sys.path.insert(0, ours)  # this very copy of the tool, whatever the child finds first
from backports.megatron import import_notices
from backports.megatron.job.start_up import deactivate
deactivate()  # the environment's hook file must not patch the candidate
from backports.megatron.api import status


def core_file():
    # Where megatron.core comes from, imported (status imports it) or about to be.
    module = sys.modules.get("megatron.core")
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec("megatron.core")
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


def write(result):
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


def from_candidate(path):
    return path is not None and Path(path).resolve().is_relative_to(Path(candidate).resolve())


sys.path.insert(0, candidate)
if not from_candidate(core_file()):  # before the probe: no need to import someone else's
    write({"megatron_core_file": core_file(), "reports": None})
    raise SystemExit(0)
if verbose == "1":
    reports = status(only or None)
else:
    with import_notices.hidden():
        reports = status(only or None)
write({"megatron_core_file": core_file(), "reports": [r.to_dict() for r in reports]})
"""

# The user's switches say what to run here, not what the candidate needs.
_CLEARED_ENV = (switches.ENABLE, switches.SKIP)


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
    candidate: Path,
    only: Sequence[str] | None = None,
    *,
    timeout: float = 600,
    label: str | None = None,
    verbose: bool = False,
) -> list[Report]:
    """``status()`` as it would be with ``candidate`` installed.

    ``BackportError`` when megatron.core would not be imported from ``candidate`` (a wheel
    of another project, an empty folder): probing the installed copy instead would answer
    a question nobody asked. ``label`` names the candidate in that error (the wheel's path,
    not the folder it was extracted to); ``verbose`` passes the child's stderr through.
    """
    select(only)  # an unknown id: the same one-line error as status(), before any child
    result = _run_child(candidate, only or (), timeout, verbose)
    core_file = result["megatron_core_file"]
    # Checked here too, on the module the probe imported: that is what the reports describe.
    if result["reports"] is None or not _inside(core_file, candidate):
        found = f"megatron.core would come from {core_file}" if core_file else "no megatron.core"
        raise BackportError(
            f"{label or candidate} is not a megatron-core candidate: it holds no "
            f"megatron/core ({found})"
        )
    return [
        Report(
            d["id"],
            Verdict(d["verdict"]),
            Action(d["action"]),
            d["reason"],
            d["evidence"],
            d.get("source", "builtin"),
        )
        for d in result["reports"]
    ]


def _inside(path: str | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder.resolve())


def _run_child(
    candidate: Path, only: Sequence[str], timeout: float, verbose: bool
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
    # A candidate's verdict is not this environment's: kept in the cache (one file per
    # backport), it would displace the one `status` reuses.
    env[verdict_cache.CACHE] = "0"
    with tempfile.TemporaryDirectory(prefix="backports-audit-out-") as tmp:
        out = Path(tmp) / "result.json"
        ours = Path(__file__).resolve().parents[2]  # the folder holding backports/
        command = [sys.executable, "-c", _CHILD, str(out), str(ours), str(candidate)]
        try:
            done = subprocess.run(
                [*command, "1" if verbose else "0", *only],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackportError(f"probing {candidate} took over {timeout:.0f} s") from exc
        if verbose:
            sys.stderr.write(done.stderr)
        if done.returncode != 0 or not out.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise BackportError(f"probing {candidate} failed (exit {done.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def outcome(report: Report) -> str:
    """What a candidate's verdict means for the backport."""
    return {
        Verdict.NEEDED: "still needed",
        Verdict.UPSTREAM: "landed: delete it",
        Verdict.ABSENT: "target absent: not needed",
        Verdict.INCOMPATIBLE: "does not fit: update or delete",
        Verdict.DISABLED: "disabled",
    }[report.verdict]
