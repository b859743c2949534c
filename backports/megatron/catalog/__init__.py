"""Every backport this package carries, one module per upstream pull request."""

from collections.abc import Iterable

from ..errors import BackportError
from .megatron_lm_6114 import SPEC as MEGATRON_LM_6114
from .megatron_lm_6793 import SPEC as MEGATRON_LM_6793
from .megatron_lm_7091 import SPEC as MEGATRON_LM_7091
from .megatron_lm_7617 import SPEC as MEGATRON_LM_7617
from .spec import BackportSpec, SniffResult, Target, VendoredRef

__all__ = ["CATALOG", "BackportSpec", "SniffResult", "Target", "VendoredRef", "by_id", "select"]

CATALOG: tuple[BackportSpec, ...] = (
    MEGATRON_LM_7617,
    MEGATRON_LM_7091,
    MEGATRON_LM_6114,
    MEGATRON_LM_6793,
)


def by_id(backport_id: str) -> BackportSpec:
    """The catalog entry with this id; ``KeyError`` names the known ids."""
    for spec in CATALOG:
        if spec.id == backport_id:
            return spec
    known = ", ".join(spec.id for spec in CATALOG)
    raise KeyError(f"unknown backport {backport_id!r}; known: {known}")


def select(only: str | Iterable[str] | None) -> list[BackportSpec]:
    """The entries named by ``only`` (an id or ids; None: all), each once, in the order given.

    An unknown id is the caller's mistake, so it raises ``BackportError`` naming the known ids.
    """
    if only is None:
        return list(CATALOG)
    ids = [only] if isinstance(only, str) else list(only)
    try:
        return [by_id(backport_id) for backport_id in dict.fromkeys(ids)]
    except KeyError as exc:
        raise BackportError(exc.args[0]) from None
