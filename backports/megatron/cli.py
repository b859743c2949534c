"""The ``backports`` command (console script, ``python -m backports.megatron``).

    backports status | apply | revert | check | audit | new | sync | upstream-tests

A thin face: the commands live in ``backports.megatron.commands``, one module each, and
``main`` is theirs. This address stays: the console script, and the tests ``backports new``
scaffolds, call ``backports.megatron.cli.main``; ``console`` is ``main`` as a process ends
with it.
"""

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

from .commands.main import main
from .interpreter import forked_zygote

__all__ = ["console", "main"]


def console() -> NoReturn:
    """``main()``, then the process ends with its exit status, skipping the interpreter's
    teardown where nothing still needs it: a process that imported torch and megatron
    spends a second or two of CPU destroying their modules, after the command is done.
    The ``atexit`` handlers still run (the zygote stopped, temporary folders removed, logs
    flushed) and the standard streams are flushed first; a thread other than this one
    still running gets the ordinary exit, which waits for it."""
    forked_zygote.allow()  # this process ends with its command: it may fork the zygote
    code = main()
    if any(t is not threading.current_thread() and not t.daemon for t in threading.enumerate()):
        raise SystemExit(code)
    _flush_streams()
    atexit._run_exitfuncs()
    _flush_streams()
    os._exit(code)


def _flush_streams() -> None:
    """What the interpreter's own exit flushes; a stream gone (a closed stdout, a reader that
    hung up) was already said by ``main``, and changes no exit status."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
