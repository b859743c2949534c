"""Deprecated: the model types under their old address. Import them from
``backports.megatron.catalog`` (plugins) instead; this module goes in a later release.

Each name warns (``DeprecationWarning``) when it is read here, not when the catalog imports
this module while it looks for entries.
"""

import warnings
from typing import Any

_MOVED = (
    "BackportSpec",
    "ImportGuard",
    "LocalChange",
    "Sniff",
    "SniffResult",
    "Target",
    "VendoredRef",
)


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"backports.megatron.catalog.spec is deprecated: import {name} from "
        "backports.megatron.catalog",
        DeprecationWarning,
        stacklevel=2,
    )
    from .. import catalog, model

    return getattr(catalog, name, None) or getattr(model, name)


def __dir__() -> list[str]:
    return sorted(_MOVED)
