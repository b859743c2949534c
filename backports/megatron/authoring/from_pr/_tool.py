"""What ``--from-pr`` takes from the rest of ``backports.megatron``, in one place.

The package is being restructured around it: every internal it calls is imported here (and
only here), so re-pointing them is one edit. The child interpreters' scripts import these
names from this module too.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ...errors import BackportError
from ...evidence.fix_text import symbol_digests
from ...private_globals import with_globals
from ...sync.errors import SyncError
from ...sync.render import LIVE_MODULE, LIVE_TARGET, Piece, Provenance, Vendored, render
from ...vendored import UpstreamToml, parse_upstream, python_files_digest
from ...vendored import render_upstream as _render_upstream
from ...vendored.manifest import unsafe_text

__all__ = [
    "LIVE_MODULE",
    "LIVE_TARGET",
    "SYNCED_ORIGIN_LINES",
    "BackportError",
    "Piece",
    "Provenance",
    "SyncError",
    "Vendored",
    "builtin_ids",
    "builtin_prefix",
    "contract",
    "deactivate_start_up",
    "parse_upstream",
    "python_files_digest",
    "render_pieces",
    "render_upstream",
    "scaffold_texts",
    "spec_by_id",
    "symbol_digests",
    "unsafe_text",
    "with_globals",
]

# The two origin lines the sync's assembly writes into a vendored file's header (see
# sync/render.py); a derivation that merged a drifted symbol says so in their place.
SYNCED_ORIGIN_LINES = (
    "# origin: synced by backports sync: upstream's code as it is, except that the module\n"
    "#         globals it reads are looked up on the live upstream modules.\n"
)


def render_upstream(old_text: str, data: Mapping[str, Any]) -> str:
    """``UPSTREAM.toml`` for ``data`` (the one writer checks it against the schema)."""
    return _render_upstream(old_text, cast(UpstreamToml, dict(data)))


def render_pieces(
    sources: Mapping[str, str], pieces: Sequence[Piece], provenance: Provenance
) -> tuple[Vendored, dict[str, list[str]]]:
    """The vendored module holding every piece, and the decorators left off each method."""
    vendored = render(sources, pieces, provenance)
    return vendored, vendored.decorators


def contract() -> tuple[Callable[[Any], None], ...]:
    """The contract kit every entry passes (``backports.megatron.testing``)."""
    from ...testing import CONTRACT

    return CONTRACT


def spec_by_id(backport_id: str) -> Any:
    from ...catalog import by_id

    return by_id(backport_id)


def deactivate_start_up() -> None:
    """Keep an environment's start-up hook from applying on its own in this process."""
    from ...job import start_up

    start_up.deactivate()


def builtin_ids() -> set[str]:
    from ...catalog import CATALOG

    return {spec.id for spec in CATALOG}


def builtin_prefix() -> str:
    from ...catalog._plugins import BUILTIN_PREFIX

    return BUILTIN_PREFIX


def scaffold_texts() -> dict[str, str]:
    """The templates plain ``backports new`` writes its plugin from (``str.format`` texts
    keyed by file role); ``--from-pr`` writes the same layout."""
    from ..scaffold import templates as t

    return {
        "pyproject": t.PYPROJECT,
        "package_init": t.PACKAGE_INIT,
        "vendor_init": t.VENDOR_INIT,
        "vendored_init": t.VENDORED_INIT,
        "tests": t.TESTS,
    }
