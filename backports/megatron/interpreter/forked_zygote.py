"""The zygote forked from the ``backports`` command itself, torch imported once for both.

A started zygote (``_zygote_child.py`` run ``-I``) imports torch and what megatron pulls in
of it: seconds of CPU that the command pays a second time when it imports megatron for its
own sniffs. Where the command allows it (``allow()``, called by ``cli.console``: a process
that ends with its command), on Linux, while it runs one Python thread and has imported
neither triton nor megatron, the command imports the part of torch that imports no triton
(triton decorates its helpers in the mode ``TRITON_INTERPRET`` says at its import; the
zygote imports the rest with it on, as a started one does), then forks. The fork becomes a
zygote: the request pipes as its standard streams, a private folder, the zygote's
environment, nothing of this project left in ``sys.modules`` or ``sys.meta_path``, and the
warning, logging and signal settings of the command's start; then ``_zygote_child.main()``.
What a grandchild of it runs is judged as in a started zygote's (``Zygote.serves``: the same
files for every module it holds, on the request's path); anything else, a started zygote.
"""

import contextlib
import importlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Mapping
from types import FrameType
from typing import IO, Any

from . import _zygote_child

# The part of ``_zygote_child.WARM`` that imports no triton; the command imports it anyway,
# with megatron.
IMPORTED_BEFORE = ("torch", "torch.distributed.tensor", "sympy")
_TRIGGER = "__megatron_backports_trigger__"  # backports.megatron._TRIGGER (import-free here)
_OURS = "backports"

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class _Start:
    """The process state the command changes while it runs, as it was before (``allow``)."""

    def __init__(self) -> None:
        self.filters = list(warnings.filters)
        self.showwarning = warnings.showwarning
        self.root_handlers = list(logging.getLogger().handlers)
        self.sigint: Handler = signal.getsignal(signal.SIGINT)


_START: list[_Start] = []


def allow() -> None:
    """This process may fork its zygote: it ends when its command does (``cli.console``)."""
    if not _START:
        _START.append(_Start())


def _one_thread() -> bool:
    """No other Python thread (torch's import starts one native thread of its own: a fork
    beside it is what torch's DataLoader does for its forked workers)."""
    return threading.active_count() == 1


def _may_fork() -> bool:
    return (
        bool(_START)
        and sys.platform.startswith("linux")  # where a fork after torch's import is usual
        and hasattr(os, "fork")
        and _one_thread()
        and not {"triton", "megatron"} & set(sys.modules)
    )


class Forked:
    """What ``Zygote`` uses of ``subprocess.Popen``, for the forked zygote."""

    def __init__(self, pid: int, stdin: IO[str], stdout: IO[str]) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["zygote"], timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)


def fork(environ: Mapping[str, str], folder: str) -> Forked | None:
    """The forked zygote in ``folder`` with ``environ``; None where this process may not
    fork it (then a zygote is started)."""
    if not _may_fork():
        return None
    for name in IMPORTED_BEFORE:
        try:
            importlib.import_module(name)
        except Exception:  # a started zygote, or a plain child, says what is wrong
            return None
    if "triton" in sys.modules or not _one_thread():
        return None
    requests_read, requests_write = os.pipe()
    answers_read, answers_write = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the fork; its answers are what the tests see)
        try:
            os.close(requests_write)
            os.close(answers_read)
            _become_zygote(requests_read, answers_write, environ, folder)
        finally:
            os._exit(70)
    os.close(requests_read)
    os.close(answers_write)
    stdin = open(requests_write, "w", encoding="utf-8")  # noqa: SIM115 (the zygote's, kept)
    stdout = open(answers_read, encoding="utf-8")  # noqa: SIM115
    return Forked(pid, stdin, stdout)


def _become_zygote(requests: int, answers: int, environ: Mapping[str, str], folder: str) -> None:
    """In the fork: the state of a zygote started ``-I`` in ``folder``, then its loop."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(requests, 0)
    os.dup2(answers, 1)
    os.dup2(null, 2)
    _close_from(3)
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(environ)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    _forget_the_command()
    _zygote_child.main()


def _close_from(lowest: int) -> None:
    """Close every file descriptor from ``lowest`` up (the command's files, its other pipes)."""
    try:
        open_ones = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_ones = list(range(lowest, 1024))
    for fd in open_ones:
        if fd >= lowest:
            with contextlib.suppress(OSError):
                os.close(fd)


def _forget_the_command() -> None:
    """Nothing of this project left to import from (a grandchild imports what it needs of
    it afresh, with the backports off), and the settings the command changed put back."""
    for name in [name for name in sys.modules if name.partition(".")[0] == _OURS]:
        del sys.modules[name]
    # The command's ``__main__`` (and multiprocessing's alias of it): a script's has no spec.
    sys.modules.pop("__mp_main__", None)
    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.meta_path[:] = [
        finder
        for finder in sys.meta_path
        if not getattr(finder, _TRIGGER, False) and not _ours(finder)
    ]
    sys.path_importer_cache.clear()
    start = _START[0]
    warnings.filters[:] = start.filters  # type: ignore[index]
    warnings._filters_mutated()  # type: ignore[attr-defined]
    warnings.showwarning = start.showwarning
    root = logging.getLogger()
    root.handlers[:] = start.root_handlers
    for logger in [root, *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            logger.filters = [f for f in logger.filters if not _ours(f)]
    if start.sigint is not None:
        signal.signal(signal.SIGINT, start.sigint)


def _ours(thing: object) -> bool:
    return type(thing).__module__.partition(".")[0] == _OURS
