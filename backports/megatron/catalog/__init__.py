"""Every backport this package carries, one module per upstream pull request."""

from .megatron_lm_7617 import SPEC as MEGATRON_LM_7617
from .spec import BackportSpec, SniffResult, Target, VendoredRef

__all__ = ["CATALOG", "BackportSpec", "SniffResult", "Target", "VendoredRef", "by_id"]

CATALOG: tuple[BackportSpec, ...] = (MEGATRON_LM_7617,)


def by_id(backport_id: str) -> BackportSpec:
    """The catalog entry with this id; ``KeyError`` names the known ids."""
    for spec in CATALOG:
        if spec.id == backport_id:
            return spec
    known = ", ".join(spec.id for spec in CATALOG)
    raise KeyError(f"unknown backport {backport_id!r}; known: {known}")
