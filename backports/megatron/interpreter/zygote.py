"""One child interpreter that imports torch once, forking a fresh interpreter per sniff.

Each sniff child (#6964's import of the attention module under a guard, #6890's kernels
under ``TRITON_INTERPRET=1``) spent seconds of CPU importing torch and the parts of it
megatron pulls in before it asked its question. The zygote (``_zygote_child.py``, started
``-I`` in a private folder with the backports off, as every child is) imports those once,
then forks one grandchild per request: a fresh process that takes the request's
environment, ``sys.path``, ``argv`` and a private empty folder, and imports megatron (or
whatever it judges) itself. ``run`` answers as ``subprocess.run`` would, or None where the
zygote cannot stand for a plain child (another environment, a path that finds another torch,
a triton that reads ``TRITON_INTERPRET`` only at its import, the zygote gone): the caller
then starts a plain one. ``start()`` starts it ahead of need, beside other work; in the
``backports`` command it is forked from the command itself (``forked_zygote``: torch imported
once for the command and its sniff children), elsewhere started.
"""

import atexit
import contextlib
import importlib.machinery
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import forked_zygote

_SERVER = Path(__file__).with_name("_zygote_child.py")
_PATH_VARIABLE = "MEGATRON_BACKPORTS_CHILD_PATH"
# What differs between requests and decides nothing of the zygote's own imports (gloo reads
# GLOO_SOCKET_IFNAME when a process group is made, in a grandchild).
_PER_REQUEST = ("TRITON_INTERPRET", "PYTEST_CURRENT_TEST", "GLOO_SOCKET_IFNAME", _PATH_VARIABLE)
_OFF = "MEGATRON_BACKPORTS"


def _relevant(env: Mapping[str, str]) -> dict[str, str]:
    """The environment as the zygote's imports see it: the switches of this project are
    read by no module it imports (and are off there), per-request values are the request's,
    and a default torch wrote into this process's environment is no change."""
    return {
        name: value
        for name, value in env.items()
        if name not in _PER_REQUEST
        and not name.startswith(_OFF)
        and not _torch_default(name, value)
    }


def _torch_default(name: str, value: str) -> bool:
    """Whether ``name=value`` is what torch sets in ``os.environ`` on first use when it is
    unset: ``TORCHINDUCTOR_CACHE_DIR`` (its default folder, written by
    ``cache_dir_utils.cache_dir()``, which a megatron import in the caller reaches). Read
    from torch as imported here; where it is not imported, torch wrote nothing here."""
    if name != "TORCHINDUCTOR_CACHE_DIR":
        return False
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    default = getattr(utils, "default_cache_dir", None)
    if default is None:
        return False
    try:
        return os.path.abspath(str(default())) == value
    except Exception:  # torch's own lookup failing decides nothing: the value counts
        return False


class Zygote:
    """A started zygote: requests go in as JSON lines, answers come back on a reader thread."""

    def __init__(self, env: Mapping[str, str], path: Sequence[str], fork: bool = False) -> None:
        self.relevant = _relevant(env)
        self.folder = tempfile.TemporaryDirectory(prefix="megatron-backports-zygote-")
        environ = {**env, _PATH_VARIABLE: json.dumps(list(path)), _OFF: "0"}
        # Forked from this process where it may (torch imported once for both), else started.
        forked = forked_zygote.fork(environ, self.folder.name) if fork else None
        self.process: subprocess.Popen[str] | forked_zygote.Forked = forked or subprocess.Popen(
            [sys.executable, "-I", str(_SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.folder.name,
            env=environ,
            text=True,
        )
        self.hello: dict[str, Any] | None = None
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.answers: dict[int, dict[str, Any]] = {}
        self.events: dict[int, threading.Event] = {}
        self.pids: dict[int, int] = {}
        self.pid_known: dict[int, threading.Event] = {}
        self.next_id = 0
        self.served: dict[tuple[str, ...], bool] = {}
        threading.Thread(target=self._read, name="backports-zygote", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("ZYGOTE "):
                self.hello = json.loads(line[len("ZYGOTE ") :])
                self.ready.set()
                continue
            message = json.loads(line)
            with self.lock:
                if "pid" in message:
                    self.pids[message["id"]] = message["pid"]
                    known = self.pid_known.get(message["id"])
                    if known is not None:
                        known.set()
                    continue
                self.answers[message["id"]] = message
                event = self.events.get(message["id"])
            if event is not None:
                event.set()
        with self.lock:  # gone: every waiting request is told
            self.ready.set()
            for event in [*self.events.values(), *self.pid_known.values()]:
                event.set()

    def alive(self) -> bool:
        return self.process.poll() is None

    def in_flight(self) -> bool:
        with self.lock:
            return any(i not in self.answers for i in self.events)

    def serves(self, path: Sequence[str], env: Mapping[str, str], timeout: float) -> bool:
        """Whether a grandchild here is what a plain child would be for this request."""
        if _relevant(env) != self.relevant or not self.ready.wait(timeout):
            return False
        hello = self.hello
        if hello is None or not self.alive():
            return False
        if env.get("TRITON_INTERPRET") and not hello.get("interpret_live"):
            return False
        key = tuple(path)
        if key not in self.served:
            self.served[key] = _finds_the_same(hello.get("origins"), path)
        return self.served[key]

    def submit(self, request: dict[str, Any]) -> int | None:
        """Send ``request``: its id, or None where the zygote is gone."""
        with self.lock:
            request_id = self.next_id
            self.next_id += 1
            self.events[request_id] = threading.Event()
            self.pid_known[request_id] = threading.Event()
        try:
            assert self.process.stdin is not None
            with self.lock:
                self.process.stdin.write(json.dumps({**request, "id": request_id}) + "\n")
                self.process.stdin.flush()
        except (OSError, ValueError):
            return None
        return request_id

    def answered(self, request_id: int) -> bool:
        """Whether the request ended (or the zygote did): ``answer`` no longer waits."""
        event = self.events.get(request_id)
        return event is None or event.is_set()

    def answer(self, request_id: int) -> dict[str, Any] | None:
        """The request's exit status and output, forgotten here; None where the zygote
        went away first."""
        with self.lock:
            answer = self.answers.pop(request_id, None)
            self.events.pop(request_id, None)
            self.pid_known.pop(request_id, None)
            self.pids.pop(request_id, None)
        return answer

    def kill_group(self, request_id: int, wait: float = 5.0) -> None:
        """SIGKILL to the request's process group (its grandchild leads one: ``"group"``),
        once the zygote has said its pid; the answer (-9) still comes."""
        known = self.pid_known.get(request_id)
        if known is not None:
            known.wait(wait)
        with self.lock:
            pid = self.pids.get(request_id)
        if pid is not None:
            kill_group(pid)

    def run(
        self, request: dict[str, Any], timeout: float
    ) -> "subprocess.CompletedProcess[str] | None":
        request_id = self.submit(request)
        if request_id is None:
            return None
        event = self.events[request_id]
        argv = [sys.executable, "-I", str(request["argv0"]), *map(str, request["args"])]
        if not event.wait(timeout):
            self._kill(request_id)
            raise subprocess.TimeoutExpired(argv, timeout)
        answer = self.answer(request_id)
        if answer is None:  # the zygote went away
            return None
        return subprocess.CompletedProcess(
            argv, int(answer["returncode"]), str(answer["stdout"]), str(answer["stderr"])
        )

    def _kill(self, request_id: int) -> None:
        with self.lock:
            pid = self.pids.pop(request_id, None)
            self.events.pop(request_id, None)
            self.pid_known.pop(request_id, None)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stdin closed: the zygote kills what it still runs and exits (at once if it is
        still importing: nobody waits for it)."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.process.wait(timeout=2 if self.ready.is_set() else 0)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.folder.cleanup()


def kill_group(pid: int) -> None:
    """SIGKILL to the process group ``pid`` leads (what it started too), else to ``pid``."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class Spawned:
    """A request running in a grandchild of the zygote, in a process group of its own: what
    a caller that runs several at once uses of ``subprocess.Popen`` (``poll``, ``wait``,
    ``kill``: the whole group), and once it has ended its ``stdout`` and ``stderr``."""

    def __init__(self, zygote: Zygote, request_id: int) -> None:
        self._zygote, self._id = zygote, request_id
        self.returncode: int | None = None
        self.stdout = self.stderr = ""

    def poll(self) -> int | None:
        if self.returncode is None and self._zygote.answered(self._id):
            answer = self._zygote.answer(self._id)
            if answer is None:  # the zygote went away: the grandchild with it
                self.returncode, self.stderr = -9, "the zygote ended"
            else:
                self.returncode = int(answer["returncode"])
                self.stdout, self.stderr = str(answer["stdout"]), str(answer["stderr"])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        event = self._zygote.events.get(self._id)
        if self.returncode is None and event is not None:
            event.wait(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(["zygote request"], timeout or 0)
        return code

    def kill(self) -> None:
        if self.returncode is None:
            self._zygote.kill_group(self._id)


def _finds_the_same(origins: object, path: Sequence[str]) -> bool:
    """Whether ``path`` finds each module the zygote imported at the file it came from."""
    if not isinstance(origins, dict):
        return False
    for name, origin in origins.items():
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, list(path))
        except (ImportError, ValueError):
            return False
        if spec is None or not spec.origin or os.path.realpath(spec.origin) != origin:
            return False
    return True


_LOCK = threading.Lock()
_CURRENT: list[Zygote] = []


def _zygote(env: Mapping[str, str], path: Sequence[str], fork: bool = False) -> Zygote | None:
    """The running zygote for this environment, started if there is none; None while one
    for another environment is busy."""
    with _LOCK:
        current = _CURRENT[0] if _CURRENT else None
        if current is not None and current.alive() and current.relevant == _relevant(env):
            return current
        if current is not None:
            if current.alive() and current.in_flight():
                return None
            current.stop()
            _CURRENT.clear()
        started = Zygote(env, path, fork)
        _CURRENT.append(started)
        return started


# The interpreter floor imports nothing of ours: switches.FALSE spelt out
# (tests/api/test_switches.py keeps the two in step), as the start-up trigger in __init__.py does.
_FALSE = frozenset({"0", "false", "off", "no"})


def _off() -> bool:
    """``MEGATRON_BACKPORTS_ZYGOTE=0``: every sniff child is a fresh interpreter."""
    return os.environ.get("MEGATRON_BACKPORTS_ZYGOTE", "").strip().lower() in _FALSE


def start(path: Sequence[str]) -> None:
    """Start the zygote now (its imports take seconds), for sniffs asked later."""
    if _off():
        return
    environ = dict(os.environ)
    environ[_OFF] = "0"
    _zygote(environ, path, fork=True)


def run(
    source: str,
    filename: str,
    argv0: str,
    args: Sequence[str],
    *,
    path: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    base_path: Sequence[str],
) -> "subprocess.CompletedProcess[str] | None":
    """``source`` (read from ``filename``, or ``"<string>"``) run as ``__main__`` in a
    grandchild of the zygote, ``sys.argv`` being ``[argv0, *args]``, ``sys.path`` ``path``,
    its environment ``env``: as ``subprocess.run`` answers; None where the zygote cannot
    stand for a plain ``python -I`` child. ``base_path``: where a zygote started now finds
    torch (the caller's path, without what one request puts first). Raises
    ``subprocess.TimeoutExpired``."""
    if _off():
        return None
    zygote = _zygote(env, base_path)
    if zygote is None or not zygote.serves(path, env, timeout):
        return None
    request = {
        "source": source,
        "filename": filename,
        "argv0": argv0,
        "args": list(args),
        "path": list(path),
        "env": dict(env),
    }
    return zygote.run(request, timeout)


def spawn(
    source: str,
    filename: str,
    argv: Sequence[str],
    *,
    path: Sequence[str],
    env: Mapping[str, str],
    ready_within: float,
) -> Spawned | None:
    """``source`` started as ``__main__`` in a grandchild of the running zygote that leads
    a process group of its own (``sys.argv`` ``argv``, as ``run`` says), without waiting for
    it; None where no zygote runs (none is started here) or it cannot stand for a plain
    ``python -I`` child. ``ready_within``: how long one still importing may take."""
    if _off():
        return None
    with _LOCK:
        zygote = _CURRENT[0] if _CURRENT else None
    if zygote is None or not zygote.alive() or not zygote.serves(path, env, ready_within):
        return None
    request = {
        "source": source,
        "filename": filename,
        "argv0": argv[0],
        "args": list(argv[1:]),
        "path": list(path),
        "env": dict(env),
        "group": True,
    }
    request_id = zygote.submit(request)
    return None if request_id is None else Spawned(zygote, request_id)


@atexit.register
def _stop() -> None:
    with _LOCK:
        for zygote in _CURRENT:
            zygote.stop()
        _CURRENT.clear()
