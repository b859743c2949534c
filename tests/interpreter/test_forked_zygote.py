"""The zygote forked from the ``backports`` command (issue 43): torch imported once for the
command and every sniff child; a grandchild of it starts as a plain ``python -I`` child would,
whatever the command had set up around it."""

import json
import subprocess
import sys
import threading
from pathlib import Path

from backports.megatron.interpreter import forked_zygote

# What a child sees of its start: compared between a grandchild of the forked zygote and a
# plain ``python -I`` child.
_SEEN = """
import json, logging, os, sys, warnings
print(json.dumps({
    "ours": sorted(m for m in sys.modules if m.partition(".")[0] == "backports"),
    "megatron": "megatron" in sys.modules,
    "triggers": [
        type(f).__name__ for f in sys.meta_path if hasattr(f, "__megatron_backports_trigger__")
    ],
    "filters": [repr(f) for f in warnings.filters],
    "showwarning": warnings.showwarning.__module__,
    "root_handlers": len(logging.getLogger().handlers),
    "path": sys.path,
    "switch": os.environ.get("MEGATRON_BACKPORTS"),
    "main_file": getattr(sys.modules["__main__"], "__file__", None),
}))
"""

# A process set up as the command is while it runs (its notices hidden, warnings collected as
# notes, a handler on the root logger), forking its zygote as ``status`` does.
_COMMAND = """
import json, sys
from backports.megatron.commands import output
from backports.megatron.interpreter import children, forked_zygote, zygote
forked_zygote.allow()
notes = []
with output.import_notices_hidden(), output.warnings_as_notes(notes), \\
        output.root_logging_kept_off_stdout():
    zygote.start(children.child_path())
    kind = type(zygote._CURRENT[0].process).__name__
    forked = children.run_python(SEEN, shared_imports=True, timeout=600)
print(json.dumps({"kind": kind, "torch_here": "torch" in sys.modules,
                  "triton_here": "triton" in sys.modules,
                  "forked": json.loads(forked.stdout), "stderr": forked.stderr[-2000:]}))
"""


def test_a_grandchild_of_the_forked_zygote_starts_as_a_plain_child(tmp_path: Path) -> None:
    """The command imported torch (not triton: the zygote imports it in interpreter mode);
    the grandchild holds nothing of this project, no trigger, the warning filters, warning
    display and root handlers of a fresh interpreter, the child path and the backports off."""
    script = f"SEEN = {_SEEN!r}\n" + _COMMAND
    done = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["kind"] == "Forked" and seen["torch_here"] and not seen["triton_here"]
    plain = subprocess.run(
        [sys.executable, "-I", "-c", _SEEN],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"MEGATRON_BACKPORTS": "0", "PATH": "/usr/bin:/bin"},
    )
    expected = json.loads(plain.stdout)
    forked = seen["forked"]
    assert forked["ours"] == [] and not forked["megatron"] and forked["triggers"] == []
    for key in ("filters", "showwarning", "root_handlers", "switch", "main_file"):
        assert forked[key] == expected[key], (key, seen["stderr"])
    assert str(tmp_path) not in forked["path"]


def test_no_fork_beside_another_thread_or_unless_allowed(monkeypatch) -> None:
    """Forking a process with another Python thread running copies a lock it may hold: a
    zygote is started instead; and only the command (``cli.console``) allows the fork."""
    monkeypatch.setattr(forked_zygote, "_START", [])
    assert not forked_zygote._may_fork()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not forked_zygote._one_thread()
    finally:
        stop.set()
        thread.join()


def test_a_forked_zygote_is_waited_for_and_killed_as_a_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    forked = forked_zygote.Forked(child.pid, None, None)  # type: ignore[arg-type]
    assert forked.poll() is None
    try:
        forked.wait(timeout=0.05)
    except subprocess.TimeoutExpired:
        pass
    else:
        raise AssertionError("a sleeping process was not waited for")
    forked.kill()
    assert forked.wait(timeout=30) == -9
