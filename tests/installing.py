"""The installer as the tests drive it: replacements named by (target, resolved, function)."""

from collections.abc import Sequence
from typing import Any

from backports.megatron.kinds.install import Replacement, Request, install_all
from backports.megatron.model import WITH_LOCAL_CHANGES, Target


def request(
    backport_id: str,
    parts: Sequence[tuple[Target, Any, Any]],
    markers: dict[str, Any] | None = None,
) -> Request:
    """One backport to install in the default mode: each (target, resolved, replacement)."""
    replacements = [Replacement(target, resolved, made) for target, resolved, made in parts]
    return Request(backport_id, WITH_LOCAL_CHANGES, replacements, markers or {})


def install(
    backport_id: str,
    parts: Sequence[tuple[Target, Any, Any]],
    markers: dict[str, Any] | None = None,
) -> tuple[Any, bool]:
    """``install_all`` for one backport: (installation, fresh), or what it raised."""
    (outcome,) = install_all([request(backport_id, parts, markers)])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome
