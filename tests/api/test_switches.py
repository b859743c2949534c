"""The MEGATRON_BACKPORTS* switches: the usual spellings, one warning for anything else."""

import logging
import sys
import warnings

import pytest

import backports.megatron
from backports.megatron import BackportWarning, api, apply, status, switches
from backports.megatron.catalog import CATALOG
from backports.megatron.job import start_up
from backports.megatron.report import Action, Verdict
from backports.megatron.session import SESSION
from tests.conftest import BACKPORT_ID
from tests.reports import report_for

OFF = ["0", "false", "off", "no", "FALSE", "Off", " no ", "\tfalse\n"]
ON = ["1", "true", "on", "yes", "TRUE", "On", " yes ", "\ttrue\n"]
NOT_A_SWITCH = ["2", "disable", "none", "n", "y", "0,1", "f", "nope"]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test may warn again; no switch leaks in from the environment."""
    SESSION.warned.clear()
    for name in switches.NAMES:
        monkeypatch.delenv(name, raising=False)


def _read(name: str, value: str, default: bool) -> tuple[bool, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = switches.flag(name, default, {name: value})
    return result, [str(w.message) for w in caught if w.category is BackportWarning]


def test_the_names_are_the_documented_ones() -> None:
    assert switches.NAMES == (
        "MEGATRON_BACKPORTS",
        "MEGATRON_BACKPORTS_SKIP",
        "MEGATRON_BACKPORTS_UPSTREAM_ONLY",
        "MEGATRON_BACKPORTS_SKIP_PLUGINS",
    )
    assert switches.NAMES[:3] == (api.ENV_ENABLE, api.ENV_SKIP, api.ENV_UPSTREAM_ONLY)


@pytest.mark.parametrize("value", OFF)
@pytest.mark.parametrize("default", [True, False])
def test_off_spellings(value: str, default: bool) -> None:
    assert _read("MEGATRON_BACKPORTS", value, default) == (False, [])


@pytest.mark.parametrize("value", ON)
@pytest.mark.parametrize("default", [True, False])
def test_on_spellings(value: str, default: bool) -> None:
    assert _read("MEGATRON_BACKPORTS_UPSTREAM_ONLY", value, default) == (True, [])


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("default", [True, False])
def test_empty_is_the_default_without_a_warning(value: str, default: bool) -> None:
    assert _read("MEGATRON_BACKPORTS", value, default) == (default, [])
    assert switches.flag("MEGATRON_BACKPORTS", default, {}) is default


@pytest.mark.parametrize("value", NOT_A_SWITCH)
@pytest.mark.parametrize(
    ("name", "default", "says"),
    [("MEGATRON_BACKPORTS", True, "on"), ("MEGATRON_BACKPORTS_UPSTREAM_ONLY", False, "off")],
)
def test_anything_else_warns_once_naming_variable_value_and_default(
    name: str, default: bool, says: str, value: str
) -> None:
    result, messages = _read(name, value, default)
    assert result is default
    (message,) = messages
    assert f"{name}={value!r}" in message and f"using the default, {says}" in message
    assert _read(name, value, default) == (default, [])  # once per process, not per read


def test_other_ranks_log_the_bad_value_instead(monkeypatch, caplog) -> None:
    monkeypatch.setenv("RANK", "3")
    with caplog.at_level(logging.DEBUG, logger="backports.megatron"):
        assert _read("MEGATRON_BACKPORTS", "nein", True) == (True, [])
    assert "MEGATRON_BACKPORTS='nein'" in caplog.text


def test_skip_lists_ids() -> None:
    environ = {"MEGATRON_BACKPORTS_SKIP": f" a ,,{BACKPORT_ID} ,"}
    assert switches.skipped_ids(environ) == {"a", BACKPORT_ID}
    assert switches.skipped_ids({}) == frozenset()


@pytest.mark.parametrize("value", OFF)
def test_off_disables_every_backport_in_the_api(monkeypatch, value: str) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS", value)
    for report in [*status(), *apply()]:
        assert report.verdict is Verdict.DISABLED and report.action in (
            Action.SKIPPED,
            Action.WOULD_SKIP,
        )
        assert f"MEGATRON_BACKPORTS={value.strip()} turns every backport off" == report.reason


def test_a_bad_value_warns_once_in_the_api_and_keeps_the_backports_on(
    monkeypatch, tilelang_dsa, fake_kernel
) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS", "disable")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reports = [*status(), *apply(), *status()]
    assert [r.verdict for r in reports] == [Verdict.NEEDED] * 3 * len(CATALOG)
    assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == BACKPORT_ID
    bad = [w for w in caught if "MEGATRON_BACKPORTS='disable'" in str(w.message)]
    assert len(bad) == 1 and bad[0].category is BackportWarning


def test_a_bad_value_a_parent_process_warned_about_stays_quiet(monkeypatch) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS_SAID", "MEGATRON_BACKPORTS=0%2C1")
    assert _read("MEGATRON_BACKPORTS", "0,1", True) == (True, [])
    # The same variable with another bad value is another mistake: it warns.
    assert len(_read("MEGATRON_BACKPORTS", "nope", True)[1]) == 1


@pytest.mark.parametrize("value", ["true", "ON", " yes "])
def test_upstream_only_takes_the_same_spellings(monkeypatch, tilelang_dsa, value: str) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY", value)
    report = report_for(apply(), BACKPORT_ID)
    assert report.action is Action.INSTALLED
    assert tilelang_dsa.fused_sparse_mla_absorbed.__backport_mode__ == api.UPSTREAM_ONLY


@pytest.mark.parametrize("value", [*OFF, *ON, *NOT_A_SWITCH, ""])
def test_the_start_up_trigger_agrees(monkeypatch, value: str) -> None:
    """The start-up trigger spells the off values out (it imports nothing of ours): same answers."""
    monkeypatch.setenv("MEGATRON_BACKPORTS", value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackportWarning)
        expected = switches.enabled()
    before = list(sys.meta_path)
    try:
        trigger = backports.megatron._start_up(("package_that_is_never_imported",), {})
        assert (trigger is not None) == expected
    finally:
        start_up.deactivate()
    assert sys.meta_path == before


def test_the_zygote_switch_takes_the_same_off_spellings(monkeypatch):
    """interpreter/zygote.py imports nothing of ours and spells the off values out."""
    from backports.megatron import switches
    from backports.megatron.interpreter import zygote

    assert zygote._FALSE == switches.FALSE
    for value in OFF:
        monkeypatch.setenv("MEGATRON_BACKPORTS_ZYGOTE", value)
        assert zygote._off()
    for value in ["", "1", "on", "yes"]:
        monkeypatch.setenv("MEGATRON_BACKPORTS_ZYGOTE", value)
        assert not zygote._off()
