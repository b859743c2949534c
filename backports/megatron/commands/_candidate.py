"""Probe a candidate megatron-core (a wheel or a site-packages folder) without installing it:
what ``backports audit`` reports on.

The probe runs in a child interpreter with the candidate first on ``sys.path``: this
process may have imported the installed megatron-core already, and a module cannot be
imported twice. The child loads this package before it puts the candidate on the path,
so a candidate folder that holds another megatron-backports cannot replace the tool.

Three answers, never mixed up:
- **not a candidate**: megatron.core would not be imported from it (another project's wheel,
  an empty folder would otherwise probe the installed copy and pass). The child checks that
  before it probes, and ``audit`` checks the module the probe imported.
- **cannot be probed here** (``CannotProbe``): this environment lacks what the candidate
  imports (torch in a venv without it, a target module's dependency), the wheel or folder
  cannot be read, or the child fails before it reports. That says nothing of the backports:
  no report may then call one incompatible ("update or delete").
- **reports**: ``status()`` as it would be with the candidate installed. Where a target's
  own code raises (not a module this environment lacks), that stays ``incompatible``.
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

from .. import api
from ..errors import BackportError
from ..report import Action, Report, Verdict


class CannotProbe(BackportError):
    """The candidate cannot be probed in this environment; the message names what is missing."""


_CHILD = """
import importlib, importlib.util, json, sys
from contextlib import nullcontext
from pathlib import Path
out, ours, candidate, verbose, *only = sys.argv[1:]
sys.path.insert(0, ours)  # this very copy of the tool, whatever the child finds first
from backports.megatron.job.start_up import deactivate
deactivate()  # the environment's hook file must not patch the candidate
from backports.megatron import api
from backports.megatron.commands.output import import_notices_hidden


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


def one_line(exc):
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def lacking(exc, module):
    # The module this environment lacks, when importing `module` failed for want of it: not
    # the module itself (an absent target) nor one of the candidate's own (a broken one).
    name = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not name:
        return None
    if module == name or module.startswith(name + "."):
        return None
    top = name.partition(".")[0]
    if Path(candidate, top).exists() or Path(candidate, top + ".py").exists():
        return None
    return name


def missing_here(reports):
    # {module this environment lacks: [ids whose targets import it]}, probed reports only.
    missing = {}
    for report in reports:
        if report.verdict in ("absent", "disabled"):
            continue
        for module in api.target_modules(report.id):
            try:
                importlib.import_module(module)
            except Exception as exc:
                name = lacking(exc, module)
                if name is not None:
                    missing.setdefault(name, []).append(report.id)
    return missing


sys.path.insert(0, candidate)
if not from_candidate(core_file()):  # before the probe: no need to import someone else's
    write({"megatron_core_file": core_file(), "reports": None})
    raise SystemExit(0)
with nullcontext() if verbose == "1" else import_notices_hidden():
    try:
        import megatron.core
    except Exception as exc:
        failed = {"error": one_line(exc), "lacks": lacking(exc, "megatron.core")}
        write({"megatron_core_file": core_file(), "cannot_import_core": failed})
        raise SystemExit(0)
    reports = api.status(only or None)
    missing = missing_here(reports)
write({
    "megatron_core_file": core_file(),
    "reports": [r.to_dict() for r in reports],
    "missing": missing,
})
"""

# The user's switches say what to run here, not what the candidate needs.
_CLEARED_ENV = (api.ENV_ENABLE, api.ENV_SKIP)


def _extract_wheel(wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(into)
    except (OSError, zipfile.BadZipFile) as exc:
        raise CannotProbe(f"cannot read wheel {wheel}: {exc}") from exc
    # A wheel's <name>.data/{purelib,platlib} install into site-packages itself.
    for data in into.glob("*.data"):
        for scheme in ("purelib", "platlib"):
            for item in (data / scheme).glob("*") if (data / scheme).is_dir() else ():
                shutil.move(str(item), str(into / item.name))
    return into


def _readable(folder: Path) -> Path:
    """``folder``, resolved, once it has been listed (a folder the child cannot read would
    look like one without megatron/core)."""
    if not folder.is_dir():
        raise BackportError(f"{folder} is not a folder")
    try:
        with os.scandir(folder) as entries:
            next(entries, None)
    except OSError as exc:
        raise CannotProbe(f"cannot read folder {folder}: {exc.strerror or exc}") from exc
    return folder.resolve()


@contextmanager
def candidate_dir(wheel: Path | None = None, site_dir: Path | None = None) -> Iterator[Path]:
    """The folder to put first on ``sys.path``: ``site_dir``, or ``wheel`` extracted."""
    if (wheel is None) == (site_dir is None):
        raise BackportError("give exactly one of a wheel or a site-packages folder")
    if site_dir is not None:
        yield _readable(site_dir)
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

    ``BackportError`` when megatron.core would not be imported from ``candidate``;
    ``CannotProbe`` when this environment cannot probe it. ``label`` names the candidate in
    those errors (the wheel's path, not the folder it was extracted to); ``verbose`` passes
    the child's stderr through.
    """
    api.selected_ids(only)  # an unknown id: the same one-line error as status(), before any child
    name = label or str(candidate)
    result = _run_child(candidate, only or (), timeout, verbose, name)
    core_file = result["megatron_core_file"]
    # Checked here too, on the module the probe imported: that is what the reports describe.
    if "cannot_import_core" not in result and (
        result["reports"] is None or not _inside(core_file, candidate)
    ):
        found = f"megatron.core would come from {core_file}" if core_file else "no megatron.core"
        raise BackportError(
            f"{name} is not a megatron-core candidate: it holds no megatron/core ({found})"
        )
    _raise_if_not_probed(result, name)
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


def _raise_if_not_probed(result: dict[str, Any], name: str) -> None:
    """``CannotProbe`` naming what this environment lacks, where the child found it lacking."""
    failed = result.get("cannot_import_core")
    if failed and failed["lacks"]:
        raise CannotProbe(
            f"cannot probe {name} here: this environment lacks {failed['lacks']}, which its "
            "megatron.core imports; install it (or audit from an environment that has it)"
        )
    if failed:
        raise CannotProbe(
            f"cannot probe {name} here: its megatron.core does not import in this "
            f"environment ({failed['error']})"
        )
    missing: dict[str, list[str]] = result.get("missing") or {}
    if missing:
        lacks = "; ".join(
            f"{module} (imported by the targets of {', '.join(ids)})"
            for module, ids in sorted(missing.items())
        )
        raise CannotProbe(
            f"cannot probe {name} here: this environment lacks {lacks}; install it, or "
            "leave those backports out with --only"
        )


def _inside(path: str | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder.resolve())


def _run_child(
    candidate: Path, only: Sequence[str], timeout: float, verbose: bool, name: str = ""
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
    # A candidate's verdict is not this environment's: kept in the cache (one file per
    # backport), it would displace the one `status` reuses.
    env[api.ENV_CACHE] = "0"
    name = name or str(candidate)
    with tempfile.TemporaryDirectory(prefix="backports-audit-out-") as tmp:
        out = Path(tmp) / "result.json"
        ours = Path(__file__).resolve().parents[3]  # the folder holding backports/
        # -P and a private working folder: no code from wherever the user stands.
        command = [sys.executable, "-P", "-c", _CHILD, str(out), str(ours), str(candidate)]
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
            raise CannotProbe(f"probing {name} took over {timeout:.0f} s") from exc
        if verbose:
            sys.stderr.write(done.stderr)
        if done.returncode != 0 or not out.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1].strip()
            raise CannotProbe(
                f"cannot probe {name} here: the probing interpreter failed (exit "
                f"{done.returncode}) before it reported: {last}"
            )
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result
