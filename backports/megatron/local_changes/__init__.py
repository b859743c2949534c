"""What megatron-backports adds around upstream's vendored code: named, switchable changes.

``vendor/<id>/`` holds upstream's behaviour and nothing else, so ``tools/sync_upstream.py``
may replace it with upstream's text at any time and lose nothing (as pip's ``vendoring``
keeps its ``patches/`` apart from the vendored bytes). Everything this project adds is a
``LocalChange`` here: a name, a one-line reason, and a wrapper around the vendored
function. A catalog entry lists the ones it uses, outermost first; ``apply()`` wraps the
vendored function with them unless ``upstream_only`` (``MEGATRON_BACKPORTS_UPSTREAM_ONLY=1``)
asks for upstream's code alone. A local change never changes what reaches the kernel for
valid inputs: the same layout, the same values, the same output bits.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["LocalChange", "wrap_all"]

Wrapper = Callable[[Callable[..., object]], Callable[..., object]]


@dataclass(frozen=True)
class LocalChange:
    """One thing this project adds around a vendored function, and why."""

    name: str
    reason: str  # one line: what it does and why upstream's code alone is not enough
    # inner function -> a function of the same signature that calls it
    wrap: Wrapper

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


def wrap_all(
    function: Callable[..., object], changes: Sequence[LocalChange]
) -> Callable[..., object]:
    """``changes[0]`` outermost: it sees the caller's arguments first."""
    for change in reversed(changes):
        function = change.wrap(function)
    return function
