"""SIGTERM as an exception, so that every ``finally`` and ``with`` cleans up before the end.

A command that starts children or makes temporary folders (``upstream-tests``, ``new
--from-pr``) wraps its work in ``sigterm_unwinds()``: the signal raises ``Terminated``
(a ``BaseException``, like ``KeyboardInterrupt``, so no ``except Exception`` on the way
swallows it), the stack unwinds (children stopped, folders removed), then the process ends
as SIGTERM would have ended it.
"""

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Terminated(BaseException):
    """SIGTERM arrived: unwind, then end."""


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into ``Terminated`` while the body runs; then end the process as
    SIGTERM would have. Only the main thread can take signals; elsewhere, and where SIGTERM
    is ignored, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        yield
        return

    def unwind(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
        raise Terminated()

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)  # the default action ends us here
        raise SystemExit(128 + signal.SIGTERM) from None  # a handler of the caller's returned
    finally:
        signal.signal(signal.SIGTERM, previous)
