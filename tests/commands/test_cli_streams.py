"""What every ``backports`` command does with its streams: a stdout that is closed or
unusable, and text from upstream (commit subjects, PR titles, a plugin's reasons) that holds
terminal escapes.

The child interpreters here run ``status`` under ``MEGATRON_BACKPORTS=0``: the table and the
JSON without a probe, so that no megatron-core is imported (under a second each).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backports.megatron import cli
from backports.megatron.commands import output
from backports.megatron.report import Action, Report, Verdict

_CLOSED_LINE = "backports: stdout is closed: the output was dropped\n"


def _status_child(
    tmp_path: Path, *args: str, stdout: int | None, pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    command = [sys.executable, "-m", "backports.megatron", "status", *args]
    return subprocess.run(
        [*command, "--site-dir", str(tmp_path)],
        env={**env, "MEGATRON_BACKPORTS": "0"},
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
        pass_fds=pass_fds,
    )


def _assert_said_closed_once(done: subprocess.CompletedProcess[str]) -> None:
    """Exit 0 (status's own), no traceback, the closed stdout said once, last (with --json,
    the notes go to stderr before it)."""
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.endswith(_CLOSED_LINE) and done.stderr.count("stdout is closed") == 1


# ---- a closed stdout -------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    return {**env, "MEGATRON_BACKPORTS": "0"}


_SHELL = "/bin/sh"
_CLOSING = 'exec "$0" -m backports.megatron "$@" >&-'  # the shell closes fd 1, then runs it


@pytest.mark.parametrize("flags", [("--json",), ()], ids=["json", "table"])
def test_a_closed_stdout_is_one_line_on_stderr_and_the_commands_own_status(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """`backports status --json >&-`: the shell starts it with no file descriptor 1
    (sys.stdout is None). No traceback; one line says the output went nowhere; the exit
    status is status's own (0), as with a reader that hangs up (README: the exit status
    never depends on the pipe)."""
    done = subprocess.run(
        [_SHELL, "-c", _CLOSING, sys.executable, "status", *flags, "--site-dir", str(tmp_path)],
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )
    _assert_said_closed_once(done)


def test_a_stdout_closed_while_running_is_the_same(tmp_path: Path) -> None:
    """fd 1 closed after the interpreter started: EBADF on the first flush."""
    run = (
        "import os, runpy; os.close(1); runpy.run_module('backports.megatron', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", run, "status", "--json", "--site-dir", str(tmp_path)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )
    _assert_said_closed_once(done)


def test_a_stdout_that_cannot_be_written_is_the_same(tmp_path: Path) -> None:
    """fd 1 open for reading only (`1</dev/null`): EBADF on the first flush."""
    with open(os.devnull) as read_only:
        done = _status_child(tmp_path, "--json", stdout=read_only.fileno())
    _assert_said_closed_once(done)


def test_a_reader_that_hangs_up_stays_silent(tmp_path: Path) -> None:
    """The control: EPIPE is no closed stdout (the reader had what it wanted): no line."""
    reads, writes = os.pipe()
    os.close(reads)
    try:
        done = _status_child(tmp_path, "--json", stdout=writes)
    finally:
        os.close(writes)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "closed" not in done.stderr and "Broken pipe" not in done.stderr


def test_in_process_a_none_stdout_drops_the_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS", "0")
    monkeypatch.setattr(sys, "stdout", None)
    assert cli.main(["status", "--json", "--site-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err.endswith(_CLOSED_LINE)
    assert sys.stdout is None  # put back as it was


# ---- terminal escapes from upstream ----------------------------------------------------------

_TITLE, _CLEAR = "\x1b]0;pwned\x07", "\x1b[2J"  # retitle the terminal; clear the screen
_EVIL = f"a subject {_TITLE} then {_CLEAR} \x9b31m \u202eend"
_SHOWN = "a subject \\x1b]0;pwned\\x07 then \\x1b[2J \\x9b31m \\u202eend"


def _evil_report() -> Report:
    upstream = {"repo": f"https://github.com/NVIDIA/Megatron{_CLEAR}-LM", "pr": 1}
    return Report(
        "acme-1",
        Verdict.INCOMPATIBLE,
        Action.SKIPPED,
        f"megatron-core 0.19.2 lacks the fix: {_EVIL}",
        {"upstream": upstream},
        source=f"acme{_TITLE} 1.0",
    )


class _Terminal:
    """A stdout that says it is a terminal (colours on), keeping what is written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


@pytest.fixture
def evil_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """``status`` reports one entry whose reason, upstream and source hold escapes, and warns
    with one."""
    import warnings

    from backports.megatron import BackportWarning, api

    def status(only: object = None) -> list[Report]:
        warnings.warn(f"plugin says {_EVIL}", BackportWarning, stacklevel=2)
        return [_evil_report()]

    monkeypatch.setattr(api, "status", status)
    monkeypatch.delenv("NO_COLOR", raising=False)


@pytest.mark.usefixtures("evil_status")
def test_the_table_on_a_terminal_shows_escapes_escaped_and_keeps_its_colours(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["status", "-v", "--site-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    for text in (terminal.text, err):
        assert "\x07" not in text and "\x9b" not in text and "\u202e" not in text
    # The only ESC left on the terminal is our colour for the verdict.
    assert terminal.text.replace("\x1b[31mincompatible\x1b[0m", "").count("\x1b") == 0
    assert "\x1b[31mincompatible\x1b[0m" in terminal.text
    assert _SHOWN in terminal.text and "acme\\x1b]0;pwned\\x07 1.0" in terminal.text
    assert "NVIDIA/Megatron\\x1b[2J-LM#1" in terminal.text
    assert f"warning: plugin says {_SHOWN}" in err and "\x1b" not in err


@pytest.mark.usefixtures("evil_status")
def test_a_narrow_table_is_measured_as_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Widths count the escaped text, so the cut line fits the terminal."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    assert cli.main(["status", "--site-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    table = terminal.text.split("\n\n")[0].splitlines()[:2]
    assert all(len(line) <= 100 for line in table) and "\x1b" not in terminal.text


@pytest.mark.usefixtures("evil_status")
def test_json_carries_the_text_exactly_with_no_control_character(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["status", "--format", "json-object", "--site-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert not any(ord(c) < 0x20 and c != "\n" for c in out) and "\x9b" not in out
    (report,) = json.loads(out)["reports"]
    assert report["reason"].endswith(_EVIL) and report["source"] == f"acme{_TITLE} 1.0"
    assert "\x1b" not in err and _SHOWN in err


def test_plain_text_errors_are_shown_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What a command prints with print(), here a path it cannot use."""
    missing = tmp_path / f"dir{_CLEAR}"
    assert cli.main(["status", "--site-dir", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"backports: site dir {tmp_path}/dir\\x1b[2J does not exist\n"


def test_terminal_safe_keeps_text_tabs_newlines_and_ellipses() -> None:
    text = "id\tverdict\nreason … naïve ✓"
    assert output.terminal_safe(text) == text
    assert output.terminal_safe("\x00\x7f\r") == "\\x00\\x7f\\x0d"
