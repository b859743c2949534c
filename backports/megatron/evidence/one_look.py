"""One look at the installation per ``apply()``, ``status()`` or target import.

Each of those reads the installed distributions several times over: every catalog entry's
version evidence comes from megatron-core's METADATA and RECORD, and each verdict-cache key
hashes RECORD again (~0.5-1.5 ms a read, in every process that imports megatron). Inside a
``one_look()`` block a read is made once and remembered; outside, every call reads afresh,
since a process may install another release between two calls.
"""

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any


class _Reads(dict[Hashable, Any]):
    """The reads of one block; ``open`` until the block exits. A context copied inside the
    block (an asyncio task, ``copy_context().run``) keeps this object past the exit: it
    must then read afresh too."""

    open = True


# Per thread and task: a block never serves reads made outside it.
_LOOK: ContextVar[_Reads | None] = ContextVar("megatron_backports_look", default=None)


@contextmanager
def one_look() -> Iterator[None]:
    """Remember reads until the outermost block exits (nested blocks share it)."""
    outer = _LOOK.get()
    if outer is not None and outer.open:
        yield
        return
    reads = _Reads()
    token = _LOOK.set(reads)
    try:
        yield
    finally:
        reads.open = False
        _LOOK.reset(token)


def remembered[T](key: Hashable, read: Callable[[], T]) -> T:
    """``read()``, made once per ``key`` inside a block; every time outside one."""
    look = _LOOK.get()
    if look is None or not look.open:
        return read()
    if key not in look:
        look[key] = read()
    value: T = look[key]
    return value
