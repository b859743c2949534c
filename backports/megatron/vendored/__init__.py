"""A vendored folder (``vendor/<id>/``): its ``UPSTREAM.toml`` (``manifest``: the typed model,
the one reader and the one writer), where it is and what it holds (``folder``), whether it is
what the manifest records (``integrity``: the hashes and the one drift message), and its code
loaded from the hashed source (``loading``).

The probe, the applier, the contract kit, ``backports sync`` and ``backports new`` all read
a vendored folder through these names.
"""

from .folder import VendoredFolder, check_integrity, folder_of, folders_under, locate, read_upstream
from .integrity import Integrity, drift_reason, python_files_digest
from .loading import load_replacement, replacement_functions, vendored_module
from .manifest import (
    ManifestError,
    UpstreamToml,
    parse_upstream,
    render_upstream,
    symbols,
    upstream_name,
)

__all__ = [
    "Integrity",
    "ManifestError",
    "UpstreamToml",
    "VendoredFolder",
    "check_integrity",
    "drift_reason",
    "folder_of",
    "folders_under",
    "load_replacement",
    "locate",
    "parse_upstream",
    "python_files_digest",
    "read_upstream",
    "render_upstream",
    "replacement_functions",
    "symbols",
    "upstream_name",
    "vendored_module",
]
