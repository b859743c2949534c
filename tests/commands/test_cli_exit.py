"""``backports`` (the console script and ``python -m backports.megatron``) ends its process
with the command's exit status and without the interpreter's teardown (a process that
imported torch and megatron spent a second or two of CPU on it, after the command was done);
what the ordinary exit does that anyone sees (``atexit`` handlers, flushed streams, threads
waited for) it still does.

The children run ``--version`` or ``status`` under ``MEGATRON_BACKPORTS=0``: nothing of
megatron imported (under a second each).
"""

import os
import subprocess
import sys
from pathlib import Path

# The console script's code: an atexit handler registered before the command, a module
# finalizer that marks the interpreter's own teardown, buffered output, and the console's
# entry point as pip's script calls it.
_SCRIPT = """
import atexit, sys
class _Teardown:
    def __del__(self):
        open({marker!r}, "a").write("teardown ran\\n")
sys.modules["_teardown_marker"] = _Teardown()
atexit.register(lambda: print("atexit ran", flush=False))
{extra}
sys.argv = ["backports", *{args!r}]
from backports.megatron.cli import console
console()
"""


def _console(tmp_path: Path, *args: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    marker = tmp_path / "teardown.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    script = _SCRIPT.format(marker=str(marker), extra=extra, args=list(args))
    return subprocess.run(
        [sys.executable, "-I", "-c", script],
        env={**env, "MEGATRON_BACKPORTS": "0"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_exit_status_output_and_atexit_handlers_are_kept_the_teardown_skipped(
    tmp_path: Path,
) -> None:
    done = _console(tmp_path, "status", "--json", "--site-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("atexit ran")  # after the JSON, flushed
    assert done.stdout.lstrip().startswith("[")
    assert not (tmp_path / "teardown.txt").exists()
    refused = _console(tmp_path, "status", "--only", "no-such-entry")
    assert refused.returncode == 2 and "no-such-entry" in refused.stderr
    assert refused.stdout == "atexit ran\n"


def test_a_thread_still_running_gets_the_ordinary_exit(tmp_path: Path) -> None:
    """A non-daemon thread (a plugin's, say) is waited for, as the interpreter would."""
    thread = (
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(1), print('thread done'))).start()\n"
    )
    done = _console(tmp_path, "--version", extra=thread)
    assert done.returncode == 0, done.stderr
    assert "thread done" in done.stdout and "atexit ran" in done.stdout
    assert (tmp_path / "teardown.txt").read_text() == "teardown ran\n"
