"""The start-up hook file and its trigger, in this process (subprocess tests: test_job_start)."""

import ast
import io
import logging
import subprocess
import sys
from contextlib import redirect_stderr

import pytest

from backports.megatron import BackportError, activation, api
from backports.megatron.catalog import CATALOG
from tests.conftest import BACKPORT_ID


def _hook_line(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("import")]
    return line


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Record trigger firings instead of running apply(); drop triggers afterwards."""
    calls: list[dict] = []
    monkeypatch.setattr(activation, "fire", calls.append)
    # As in a fresh interpreter: megatron not imported yet (an earlier test may have), or
    # the hook fires at once, as it should where megatron is already there.
    monkeypatch.delitem(sys.modules, "megatron", raising=False)
    yield calls
    activation.deactivate()


def _run_hook_as_site_does(text: str) -> None:
    # site.addpackage: `exec(line)` for each line that starts with "import".
    exec(_hook_line(text))


def test_watches_megatron_for_every_catalog_target():
    modules = {m for spec in CATALOG for target in spec.targets for m in target.modules}
    assert set(activation.target_modules()) == modules
    assert activation.watched_packages() == ("megatron",)


# A fresh interpreter of this environment (site has run, as at any start-up), which runs
# the hook line as site would and reports the modules that appeared meanwhile.
_FRESH_INTERPRETER = """
import sys
before = set(sys.modules)
exec(sys.argv[1])
new = sorted(set(sys.modules) - before)
armed = any(getattr(f, "__megatron_backports_trigger__", False) for f in sys.meta_path)
print(repr((new, armed)))
"""


def test_the_hook_line_imports_nothing_at_start_up():
    """It runs in every interpreter: any import here is paid by every `python -c pass`."""
    line = _hook_line(activation.hook_text())
    done = subprocess.run(
        [sys.executable, "-I", "-c", _FRESH_INTERPRETER, line],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert ast.literal_eval(done.stdout.strip()) == ([], True), done.stderr


@pytest.mark.parametrize(
    ("value", "armed"),
    [("0", False), ("false", False), (" OFF ", False), ("no", False), ("1", True), ("", True)],
)
def test_the_hook_line_obeys_the_api_switch(fired, monkeypatch, value, armed):
    monkeypatch.setenv(api.ENV_ENABLE, value)
    _run_hook_as_site_does(activation.hook_text())
    assert bool(activation.triggers()) is armed


def test_hook_installs_a_trigger_that_fires_once_on_megatron(fired):
    _run_hook_as_site_does(activation.hook_text(strict=True))
    (trigger,) = activation.triggers()
    assert sys.meta_path[0] is trigger and activation.active()
    assert trigger.find_spec("numpy", None, None) is None and fired == []
    assert trigger.find_spec("megatron", None, None) is None
    assert trigger.find_spec("megatron", None, None) is None
    assert fired == [{"strict": True, "only": None}]
    assert not activation.active() and activation.triggers() == [trigger]  # inert, in place


def test_running_the_hook_twice_keeps_one_trigger(fired):
    _run_hook_as_site_does(activation.hook_text())
    _run_hook_as_site_does(activation.hook_text())
    assert len(activation.triggers()) == 1


def test_trigger_after_the_package_is_gone_is_silent(fired, monkeypatch):
    _run_hook_as_site_does(activation.hook_text())
    # What `import backports.megatron.activation` does once the package is uninstalled.
    monkeypatch.setitem(sys.modules, "backports.megatron.activation", None)
    (trigger,) = activation.triggers()
    assert trigger.find_spec("megatron", None, None) is None
    assert fired == []


def test_hook_for_another_bytecode_version_says_so_and_runs_nothing(fired):
    line = _hook_line(activation.hook_text())
    magic = repr(activation.importlib.util.MAGIC_NUMBER)
    foreign = line.replace(f"e.MAGIC_NUMBER == {magic}", "e.MAGIC_NUMBER == b'\\x00\\x00\\r\\n'")
    assert foreign != line
    err = io.StringIO()
    with redirect_stderr(err):
        exec(foreign)
    assert activation.triggers() == []
    assert "rerun `backports apply`" in err.getvalue()


def test_fire_applies_with_the_hook_config(monkeypatch):
    seen = []
    monkeypatch.setattr(api, "apply", lambda only, strict: seen.append((only, strict)))
    activation.fire({"strict": False, "only": [BACKPORT_ID]})
    assert seen == [((BACKPORT_ID,), False)]


def test_fire_never_breaks_the_import_unless_strict(monkeypatch, caplog):
    def broken(only, strict):
        raise BackportError("megatron-lm-7617 is incompatible: ...")

    monkeypatch.setattr(api, "apply", broken)
    with caplog.at_level(logging.ERROR, logger="backports.megatron"):
        activation.fire({"strict": False, "only": None})
    assert "job-start apply() failed" in caplog.text
    with pytest.raises(BackportError):
        activation.fire({"strict": True, "only": None})


def test_write_read_remove_are_idempotent(tmp_path):
    state, changed = activation.write_hook(tmp_path)
    assert changed and state.exists and state.current
    assert state.path == tmp_path / activation.HOOK_FILE
    assert state.config == {"strict": False, "only": None}
    assert activation.write_hook(tmp_path) == (state, False)
    strict, changed = activation.write_hook(tmp_path, (BACKPORT_ID,), strict=True)
    assert changed and strict.config == {"strict": True, "only": (BACKPORT_ID,)}
    assert [p.name for p in tmp_path.iterdir()] == [activation.HOOK_FILE]  # no temp files
    removed, did = activation.remove_hook(tmp_path)
    assert did and removed.exists and not (tmp_path / activation.HOOK_FILE).exists()
    again, did = activation.remove_hook(tmp_path)
    assert not did and not again.exists


def test_edited_or_foreign_hook_file_is_not_current(tmp_path):
    path = tmp_path / activation.HOOK_FILE
    path.write_text("import something_else\n")
    assert activation.read_hook(tmp_path).exists
    assert not activation.read_hook(tmp_path).current
    activation.write_hook(tmp_path)
    path.write_text(path.read_text().replace("source sha256: ", "source sha256: 0"))
    assert not activation.read_hook(tmp_path).current


def test_only_must_name_known_backports(tmp_path):
    with pytest.raises(BackportError, match="unknown backport"):
        activation.write_hook(tmp_path, ("megatron-lm-1",))


def test_a_temp_folder_is_not_a_site_dir(tmp_path):
    assert not activation.is_site_dir(tmp_path)
    assert activation.is_site_dir(activation.default_site_dir())
