"""Bad values on the ``backports`` command line: one line on stderr and exit 2, before
anything runs (argparse's usage block would run to five lines and more)."""

from pathlib import Path

import pytest

from backports.megatron import cli
from backports.megatron.commands import _options

# ---- bad values on the command line: one line, exit 2 ------------------------------------------


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    assert (exit_.value.code, out) == (2, "") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e9", "soon", ""])
def test_a_time_limit_is_a_finite_number_of_seconds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    # --timeout=VALUE: as a separate word, argparse takes "-inf" for an option
    argv = ("upstream-tests", "megatron-lm-6114", "--repo", str(tmp_path), f"--timeout={value}")
    err = _usage_error(capsys, *argv)
    assert err == (
        "backports upstream-tests: error: argument --timeout: expected seconds, a number "
        f"above 0 and at most 86400: got {value!r} (see backports upstream-tests --help)\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["0.5", "600", "86400"])
def test_a_time_limit_within_bounds_is_taken(value: str) -> None:
    assert _options.seconds(value) == float(value)


@pytest.mark.parametrize(
    "argv",
    [
        ("new", "--from-pr", "-5"),
        ("new", "--from-pr", "abc"),
        ("new", "--id", "acme-1", "--pr", "0"),
    ],
)
def test_a_pull_request_number_is_a_whole_number_above_zero(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    err = _usage_error(capsys, *argv)
    assert err.startswith("backports new: error: argument --") and "usage:" not in err
    assert "expected a pull-request number (a whole number above 0): got " in err


@pytest.mark.parametrize(
    "argv, says",
    [
        ((), "backports: error: the following arguments are required: COMMAND"),
        (("status", "--format", "xml"), "backports status: error: argument --format: invalid"),
        (("sync", "--check", "--dry-run"), "backports sync: error: --check takes only --backport"),
        (("stauts",), "backports: error: argument COMMAND: invalid choice: 'stauts'"),
    ],
)
def test_every_usage_error_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], says: str
) -> None:
    err = _usage_error(capsys, *argv)
    assert err.startswith(says) and "usage:" not in err
    assert err.endswith("--help)\n")
