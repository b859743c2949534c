"""What this process runs, as a JSON-serialisable dict for logs and checkpoint metadata."""

import importlib.metadata
from typing import Any

from . import api
from .catalog import entries, source, withheld
from .model import BackportSpec
from .versions import installed_version

__all__ = ["manifest"]

_DISTRIBUTION = "megatron-backports"


def _package_version() -> str | None:
    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None  # a source tree on sys.path


def _entry(spec: BackportSpec) -> dict[str, Any]:
    verdict, action, evidence = api.in_force(spec)
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
    return {
        "megatron_backports": _package_version(),
        "megatron_core": None if core is None else str(core),
        "backports": {**{spec.id: _entry(spec) for spec in entries()}, **_withheld()},
    }
