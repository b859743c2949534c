"""Builtin entries the catalog leaves out until the tool carries their target kinds.

Each is complete and tested on its own (``tests/test_megatron_lm_<N>.py``); its catalog
module defines ``ENTRY`` and ``SPEC = None`` for now (``catalog._pending_kinds``). Tests of the
whole catalog (its files, the README) count them; the tests that need one installed skip with
``skip_reason``.
"""

import importlib

from backports.megatron.catalog import _pending_kinds
from backports.megatron.model import BackportSpec, module_name_of

__all__ = ["entry", "skip_reason", "waiting_ids"]


def waiting_ids() -> list[str]:
    return sorted(_pending_kinds.withheld())


def entry(backport_id: str) -> BackportSpec:
    """The entry as written (``ENTRY`` of its catalog module), whether carried or not."""
    module = importlib.import_module(f"backports.megatron.catalog.{module_name_of(backport_id)}")
    return module.ENTRY  # type: ignore[no-any-return]


def skip_reason(backport_id: str) -> str:
    """Why a test that installs the entry cannot run in this release ("" once it can)."""
    waiting = _pending_kinds.withheld().get(backport_id)
    if waiting is None:
        return ""
    kinds = waiting[1]
    return (
        f"needs the {' and the '.join(kinds)} target kind{'s' if len(kinds) > 1 else ''} (issue 32)"
    )
