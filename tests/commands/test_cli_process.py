"""The ``backports`` command as a user runs it: a fresh interpreter, a real terminal's pipes.

The import notices must come from a real first import of megatron-core, which this test
process has done long ago; so does a reader that hangs up early.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TILELANG_DSA

pytestmark = pytest.mark.slow

_SCRUBBED = ("MEGATRON_BACKPORTS", "MEGATRON_BACKPORTS_SKIP", "MEGATRON_BACKPORTS_UPSTREAM_ONLY")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    return {**env, **extra}


def _backports(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backports.megatron", *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _notice_lines(text: str) -> list[str]:
    """The lines that say something (not `warnings.warn(` source echoes)."""
    return [line for line in text.splitlines() if line.strip() and "warnings.warn(" not in line]


@pytest.fixture(scope="module")
def import_notices() -> list[str]:
    """What a plain first import of megatron's target prints here, whatever the machine."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {TILELANG_DSA}"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return _notice_lines(done.stdout + done.stderr)


def _messages(lines: list[str]) -> list[str]:
    # "path:line: UserWarning: text" and torch's "W1203 ... file.py:183] text": the text.
    return [line.split("Warning: ", 1)[-1].split("] ", 1)[-1] for line in lines]


def test_status_prints_its_own_words_and_v_adds_the_notices(import_notices, tmp_path: Path):
    quiet = _backports("status", "--site-dir", str(tmp_path))
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert quiet.stdout.startswith("id ")
    for message in _messages(import_notices):
        assert message not in quiet.stdout
    verbose = _backports("status", "-v", "--site-dir", str(tmp_path))
    assert verbose.returncode == 0 and verbose.stdout == quiet.stdout
    for message in _messages(import_notices):
        assert message in verbose.stderr


def test_a_reader_that_hangs_up_early_is_no_error(tmp_path: Path):
    """`backports status | head -1`: exit 0, nothing on stderr (no Broken pipe)."""
    command = [sys.executable, "-m", "backports.megatron", "status", "--site-dir", str(tmp_path)]
    # MEGATRON_BACKPORTS=0: the table without a probe, so the test need not import megatron.
    child = subprocess.Popen(
        command,
        env=_env(MEGATRON_BACKPORTS="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the child writes anything: its first write hits EPIPE
    err = child.stderr.read()
    assert child.wait(timeout=120) == 0 and err == ""
