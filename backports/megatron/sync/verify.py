"""The step between staging and writing: does the candidate code carry the fix?

The entry's own sniff runs on the staged vendored file, upstream-only (the vendored code
alone: the local changes the default mode wraps around it must not mask a function that
lacks the fix). A commit from before the fix, a typo'd SHA or a regressed PR head is then
refused instead of shipped as a silent no-op that ``check`` would pass.

The candidate is code fetched from anyone's fork, so it runs only in a child interpreter
(``-I``: no ``PYTHON*`` variables, no user site, no working directory on ``sys.path``; this
package's own folder given explicitly; a private empty working directory; no ``.pyc``
written). The child reports the sha256 of the very bytes it ran: the parent writes those
bytes or nothing. ``--dry-run`` never gets here.

This module is also where a sync asks the catalog (the entries and the plugins installed
here) about an entry: its sniff, in the child, and the local changes it keeps.
"""

import hashlib
import json
import subprocess
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The bound on one sniff in the child: importing torch and megatron takes seconds.
TIMEOUT_S = 300
_RESULT = "backports-sync-sniff:"  # the child's one line of result, among whatever else
_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from backports.megatron.sync.verify import child_main; sys.exit(child_main(sys.argv[2:]))"
)
# Where this package lives: the child imports it from there, whatever else is installed.
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Sniffed:
    """What the sniff saw on the candidate. ``fixed`` is None when it could not run here
    (``summary`` says why: an entry this environment lacks, a child that failed)."""

    fixed: bool | None
    summary: str
    sha256: str = ""  # of the bytes the sniff ran
    not_here: bool = False  # the entry is not in this environment's catalog
    crashed: str = ""  # what the sniff raised on the candidate ("Type: message")


def sniff_candidate(backport_id: str, candidate: Path) -> Sniffed:
    """The entry's sniff on the file ``candidate``, in a child interpreter; never raises
    but ``KeyboardInterrupt``."""
    report = _sniff_in_child(backport_id, candidate)
    fixed = report.get("fixed")
    return Sniffed(
        fixed if isinstance(fixed, bool) else None,
        str(report.get("summary", "")),
        str(report.get("sha256", "")),
        bool(report.get("not_here", False)),
        str(report.get("crashed", "")),
    )


def _sniff_in_child(backport_id: str, candidate: Path) -> dict[str, Any]:
    command = [sys.executable, "-I", "-B", "-c", _CHILD, str(_PACKAGE_ROOT)]
    with tempfile.TemporaryDirectory(prefix="backports-sync-sniff-") as cwd:
        try:
            done = subprocess.run(
                [*command, backport_id, str(candidate)],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"summary": f"the sniff did not finish in {TIMEOUT_S} s"}
        except OSError as exc:
            return {"summary": f"the sniff's interpreter did not start: {exc}"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_RESULT):
            return dict(json.loads(line.removeprefix(_RESULT)))
    said = [line for line in done.stderr.splitlines() if line.strip()]
    last = said[-1].strip() if said else "nothing on stderr"
    return {"summary": f"the sniff's interpreter ended with status {done.returncode}: {last}"}


# ---- the child ------------------------------------------------------------------------------


def child_main(argv: list[str]) -> int:
    """In the child: sniff ``argv = [backport_id, candidate path]``, print the result line."""
    backport_id, candidate = argv
    print(_RESULT + json.dumps(sniff_file(backport_id, Path(candidate))), flush=True)
    return 0


def sniff_file(backport_id: str, candidate: Path) -> dict[str, Any]:
    """The entry's sniff on the file's bytes, as a module of its own that nothing else can
    import (what the child runs; the keys of ``Sniffed``)."""
    from ..catalog import by_id  # the entries and plugins installed in this environment
    from ..decision import sniff_vendored as sniff_replacement

    source = candidate.read_bytes()
    sha256 = hashlib.sha256(source).hexdigest()
    try:
        spec = by_id(backport_id)
    except KeyError:
        summary = f"{backport_id} is not in this environment's catalog, so its sniff cannot run"
        return {"summary": summary, "sha256": sha256, "not_here": True}
    name = f"_backports_sync_candidate_{backport_id.replace('-', '_')}"
    module = types.ModuleType(name)
    module.__file__ = str(candidate)
    sys.modules[name] = module  # dataclasses and pickling look their module up
    try:
        try:
            code = compile(source, str(candidate), "exec", dont_inherit=True)
            exec(code, module.__dict__)
        except Exception as exc:  # the candidate does not import here: not judged at all
            first = (str(exc).splitlines() or [""])[0]
            raised = f"importing the candidate raised {type(exc).__name__}: {first}"
            return {"crashed": raised, "summary": f"the probe crashed: {raised}", "sha256": sha256}
        result = sniff_replacement(spec, module, upstream_only=True)
    finally:
        sys.modules.pop(name, None)
    raised = str(result.detail.get("raised", ""))
    if raised.startswith(("ModuleNotFoundError", "ImportError")):
        # The target's own modules are missing here: no verdict on the candidate.
        return {"summary": f"it cannot run here: {result.summary}", "sha256": sha256}
    if raised:
        # The probe itself failed on the candidate: that says the code does not run as the
        # sniff calls it here (a name the entry looks for, a ctx an older forward builds),
        # not that it lacks the fix.
        return {"crashed": raised, "summary": f"the probe crashed: {raised}", "sha256": sha256}
    return {"fixed": bool(result.fixed), "summary": result.summary, "sha256": sha256}


def local_changes(backport_id: str) -> list[tuple[str, str]] | None:
    """(name, reason) of each local change the catalog entry wraps its vendored code with;
    None when this environment's catalog has no such entry (a plugin not installed here).
    Installed code only: nothing a sync fetched."""
    from ..catalog import by_id

    try:
        spec = by_id(backport_id)
    except KeyError:
        return None
    return [(change.name, change.reason) for change in spec.local_changes]


def vendored_names(backport_id: str) -> dict[str, str]:
    """Per target symbol, the name its vendored replacement must have where the catalog
    entry names one of its own (``Target.replacement``: a method ``__init__`` is vendored
    as ``layer_wise_optimizer_init``); empty for an entry this environment lacks."""
    from ..catalog import by_id

    try:
        spec = by_id(backport_id)
    except KeyError:
        return {}
    return {t.attribute: t.replacement_name for t in spec.targets if t.replacement_name != t.name}
