"""What this process runs, as a JSON-serialisable dict for logs and checkpoint metadata."""

import importlib.metadata
from typing import Any

from .. import switches
from ..catalog import entries, origin, source, withheld
from ..decision import decide
from ..decision.early import early_evidence
from ..evidence.one_look import one_look
from ..evidence.versions import installed_version
from ..kinds.install import installed
from ..model import BackportSpec, mode_name
from ..report import Verdict
from ..session import SESSION
from .deferred import is_deferred

_DISTRIBUTION = "megatron-backports"


def _package_version() -> str | None:
    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None  # a source tree on sys.path


def in_force(spec: BackportSpec) -> tuple[Verdict | None, str, dict[str, Any]]:
    """What this process runs for ``spec``: (verdict, action, the early evidence), importing
    nothing megatron has not imported yet and starting no child.

    ``action``: "installed"; "skipped" (``apply()`` decided not to, or it is disabled);
    "deferred" (installs when megatron's target is imported); "not-applied" (``apply()``
    was not called). The verdict is None while nothing decided it and the target is not
    imported: deciding would import it.
    """
    early = early_evidence(spec)
    last = SESSION.last.get(spec.id)
    if installed(spec.id) is not None:
        return (last.verdict if last else Verdict.NEEDED), "installed", early.evidence
    if last is not None:
        return last.verdict, "skipped", early.evidence
    if switches.disabled_reason(spec.id) is not None:
        return Verdict.DISABLED, "skipped", early.evidence
    if early.verdict is not None:
        return early.verdict, "not-applied", early.evidence
    mode = mode_name(switches.upstream_only())
    decision = decide(spec, mode, importing=False, child_sniffs=False, plugin=origin(spec.id))
    sniffed = decision.evidence.get("behaviour", {}).get("sniffed", True)
    if decision.verdict is not None and sniffed:
        return decision.verdict, "not-applied", early.evidence
    return None, "deferred" if is_deferred(spec.id) else "not-applied", early.evidence


def _entry(spec: BackportSpec) -> dict[str, Any]:
    verdict, action, evidence = in_force(spec)
    upstream = evidence.get("upstream", {})
    return {
        "verdict": None if verdict is None else str(verdict),
        "action": action,
        "upstream": {key: upstream.get(key) for key in ("repo", "pr", "head_sha", "merge_sha")},
        "vendored_sha256": evidence.get("vendored", {}).get("sha256"),
        "source": source(spec.id),
    }


def _withheld() -> dict[str, dict[str, Any]]:
    """Plugins (or ids) the catalog withheld: nothing of theirs runs in this process."""
    return {
        w.id: {"verdict": str(w.verdict), "action": "skipped", "source": w.source}
        for w in withheld()
    }


def manifest() -> dict[str, Any]:
    """Package and megatron-core versions, and per backport id what this process runs.

    Per id: ``verdict`` (None while nothing was decided and the target is not imported),
    ``action`` ("installed"; "skipped"; "deferred": installs when megatron's target is
    imported; "not-applied": ``apply()`` was not called), the upstream PR and SHAs, and
    the sha256 of the vendored file, and ``source`` ("builtin" or the plugin distribution
    and version). A withheld plugin has only verdict, action and source. Never imports
    megatron.
    """
    core = installed_version("megatron-core").version
    with one_look():
        backports = {spec.id: _entry(spec) for spec in entries()}
    return {
        "megatron_backports": _package_version(),
        "megatron_core": None if core is None else str(core),
        "backports": {**backports, **_withheld()},
    }
