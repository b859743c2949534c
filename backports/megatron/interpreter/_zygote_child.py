"""The zygote: one child interpreter that imports torch once and forks a fresh one per sniff.

Run by path (``python -I FILE``) by ``interpreter.zygote``, in a private empty folder, its
``sys.path`` given in the environment as for every child. It imports what every sniff's
child imports and what decides no sniff's answer: torch and the parts of it megatron pulls
in (seconds of CPU for each child otherwise); nothing of megatron, flash-attn or this
project. It then prints one ``ZYGOTE <json>`` line (the files those imports came from, and
whether triton reads ``TRITON_INTERPRET`` when a kernel is decorated), and answers requests,
one JSON line each on stdin: it forks a grandchild that takes the request's environment,
``sys.path`` and ``argv``, starts in a private empty folder of its own with its output in
files, and runs the script as ``__main__``; the grandchild's pid, then its exit status and
output, go back as JSON lines. A request that says ``"group"`` runs in a process group of its
own (the caller kills the group: what the grandchild started too). Stdin closed: the
grandchildren still running are killed, with their groups.
This file imports nothing of megatron-backports (it runs with the backports off).
"""

import builtins
import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import traceback
import types
from typing import Any

PATH_VARIABLE = "MEGATRON_BACKPORTS_CHILD_PATH"  # as interpreter.children names it

# Imported once here: torch and what megatron's modules import of it (most of a child's
# import time). None of them looks for flash-attn or megatron.
WARM = (
    "torch",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch.distributed.tensor",
    "sympy",
)


def _warm() -> None:
    """Import ``WARM`` with ``TRITON_INTERPRET=1``: torch imports triton, whose own
    ``triton.language`` helpers are decorated at that import, and #6890's kernels run in
    triton's interpreter only where those were decorated in its mode (a kernel that calls
    ``tl.sum`` fails otherwise). Megatron's kernels are decorated in each grandchild, in the
    mode its environment asks for; an import guard's answer depends on neither."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        _import_warm()
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def _import_warm() -> None:
    for name in WARM:
        # Absent or broken here: a grandchild imports it itself, and says so.
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _origins() -> dict[str, str]:
    """Each top-level module imported here from a file (the standard library's too), by
    that file: a request whose path would find another file for one is not served here."""
    found = {}
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if "." not in name and origin and os.path.isfile(origin):
            found[name] = os.path.realpath(origin)
    return found


def _reads_interpret_live() -> bool:
    """Whether a kernel decorated later sees ``TRITON_INTERPRET`` as set then (triton's
    knobs read the environment on each use); True when triton is not imported here."""
    triton = sys.modules.get("triton")
    if triton is None:
        return True
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return False
    before = os.environ.get("TRITON_INTERPRET")
    try:
        os.environ["TRITON_INTERPRET"] = "1"
        on = getattr(runtime, "interpret", None) is True
        os.environ["TRITON_INTERPRET"] = "0"
        off = getattr(runtime, "interpret", None) is False
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before
    return on and off


def _say(message: dict[str, object], prefix: str = "") -> None:
    sys.stdout.write(prefix + json.dumps(message) + "\n")
    sys.stdout.flush()


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _grandchild(request: dict[str, Any], folder: str) -> None:
    """Become the request's interpreter: never returns."""
    code = 1
    try:
        if request.get("group"):
            os.setpgid(0, 0)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(os.path.join(folder, "stdout"), flags, 0o600), 1)
        os.dup2(os.open(os.path.join(folder, "stderr"), flags, 0o600), 2)
        work = os.path.join(folder, "cwd")
        os.mkdir(work)
        os.chdir(work)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        filename = str(request["filename"])
        sys.argv = [str(request["argv0"]), *request["args"]]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        if filename != "<string>":
            main.__file__ = filename
        sys.modules["__main__"] = main
        compiled = compile(str(request["source"]), filename, "exec")
        try:
            exec(compiled, main.__dict__)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _start(request: dict[str, Any], running: dict[int, tuple[object, str]]) -> None:
    folder = tempfile.mkdtemp(prefix="megatron-backports-child-")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _grandchild(request, folder)
    if request.get("group"):
        # Here too, so that the group exists before the caller hears the pid.
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
    running[pid] = (request["id"], folder)
    _say({"id": request["id"], "pid": pid})


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def _reap(running: dict[int, tuple[object, str]], block: bool) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in running:
            continue
        request_id, folder = running.pop(pid)
        out, err = _read(os.path.join(folder, "stdout")), _read(os.path.join(folder, "stderr"))
        shutil.rmtree(folder, ignore_errors=True)
        code = os.waitstatus_to_exitcode(status)
        _say({"id": request_id, "returncode": code, "stdout": out, "stderr": err})


def _kill_group(pid: int) -> None:
    """The process group ``pid`` leads (a ``"group"`` request's), else ``pid`` alone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _serve() -> None:
    running: dict[int, tuple[object, str]] = {}
    pending = b""
    while True:
        # Idle, it sleeps until a request (or the end) comes; while grandchildren run, it
        # looks for their exit every 20 ms.
        ready, _, _ = select.select([0], [], [], 0.02 if running else None)
        if ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                _start(json.loads(line), running)
        _reap(running, block=False)
    for pid in list(running):  # the caller is gone: nobody reads these answers
        _kill_group(pid)
    _reap(running, block=True)


def main() -> None:
    sys.path[:] = json.loads(os.environ.pop(PATH_VARIABLE))
    _warm()
    hello = {"origins": _origins(), "interpret_live": _reads_interpret_live()}
    _say(hello, "ZYGOTE ")
    _serve()
    # Nothing is left to write or clean (every answer sent, every folder removed): ended at
    # once, without the interpreter's teardown of torch (a second or so of CPU).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
