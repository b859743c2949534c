"""What this process runs, as a JSON-serialisable dict for logs and checkpoint metadata."""

import importlib.metadata
from typing import Any

from . import api
from .catalog import entries, source, withheld
from .model import BackportSpec
from .patcher import installed
from .probe import ProbeResult, probe, probe_without_import
from .report import Verdict
from .targets import all_loaded
from .versions import installed_version

__all__ = ["manifest"]

_DISTRIBUTION = "megatron-backports"


def _package_version() -> str | None:
    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None  # a source tree on sys.path


def _decision(spec: BackportSpec, early: ProbeResult) -> tuple[Verdict | None, str]:
    """(verdict, what this process did), importing nothing megatron has not imported yet."""
    last = api.last_report(spec.id)
    if installed(spec.id) is not None:
        return (last.verdict if last else Verdict.NEEDED), "installed"
    if last is not None:
        return last.verdict, "skipped"
    if api.disabled_reason(spec) is not None:
        return Verdict.DISABLED, "skipped"
    if early.final:
        return early.verdict, "not-applied"
    if all_loaded(spec.targets, spec.id):
        return probe(spec).verdict, "not-applied"
    # Deciding now would import megatron's target module: a manifest must not cost that.
    return None, "deferred" if api.is_deferred(spec) else "not-applied"


def _entry(spec: BackportSpec) -> dict[str, Any]:
    early = probe_without_import(spec)
    verdict, action = _decision(spec, early)
    upstream = early.evidence.get("upstream", {})
    return {
        "verdict": None if verdict is None else str(verdict),
        "action": action,
        "upstream": {key: upstream.get(key) for key in ("repo", "pr", "head_sha", "merge_sha")},
        "vendored_sha256": early.evidence.get("vendored", {}).get("sha256"),
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
    return {
        "megatron_backports": _package_version(),
        "megatron_core": None if core is None else str(core),
        "backports": {**{spec.id: _entry(spec) for spec in entries()}, **_withheld()},
    }
