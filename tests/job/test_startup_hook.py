"""The start-up hook file and its trigger, in this process (subprocess tests: test_start_up)."""

import ast
import importlib.abc
import importlib.util
import io
import logging
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest

import backports.megatron
from backports.megatron import Action, BackportError, api
from backports.megatron.catalog import CATALOG
from backports.megatron.interpreter import import_hooks as post_import
from backports.megatron.job import hook_file, start_up
from backports.megatron.job import startup_hook as job_start
from backports.megatron.job.hook_file import START_FILE
from backports.megatron.kinds import install
from tests.conftest import BACKPORT_ID

PACKAGE_INIT = Path(backports.megatron.__file__)  # the package the hook line imports


def _hook_line(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("import")]
    return line


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Record trigger firings instead of running apply(); drop triggers afterwards."""
    calls: list[dict] = []
    # What the trigger's hook calls, by name, once megatron has executed.
    monkeypatch.setattr(
        backports.megatron, "_job_start", lambda module, **config: calls.append(config)
    )
    # The environment running the tests may carry the hook (`tools/run-job` leaves it in
    # .venv): its trigger is in this process already. Each test starts without one.
    start_up.deactivate()
    # As in a fresh interpreter: no watched package imported yet (an earlier test may have
    # imported megatron, or megatron_fsdp through #5976's sniff), or the hook fires at once,
    # as it should where one is already there.
    for package in job_start.watched_packages():
        monkeypatch.delitem(sys.modules, package, raising=False)
    yield calls
    start_up.deactivate()


def _run_hook_as_site_does(text: str) -> None:
    # site.addpackage: `exec(line)` for each line that starts with "import".
    exec(_hook_line(text))


def test_watches_megatron_for_every_catalog_target():
    modules = {m for spec in CATALOG for target in spec.targets for m in target.modules}
    assert set(job_start.target_modules()) == modules
    # megatron-lm-5976 also carries the megatron-fsdp wheel's own copy (import megatron_fsdp).
    assert job_start.watched_packages() == ("megatron", "megatron_fsdp")


# A fresh interpreter of this environment (site has run, as at any start-up), which runs
# the hook line as site would and reports the modules that appeared meanwhile. If this
# environment carries the hook already (`tools/run-job` leaves it in .venv), what it
# imported and armed is dropped first, as in an interpreter without it.
_FRESH_INTERPRETER = """
import sys
for name in [n for n in sys.modules if n == "backports" or n.startswith("backports.")]:
    del sys.modules[name]
sys.meta_path[:] = [
    f for f in sys.meta_path if not getattr(f, "__megatron_backports_trigger__", False)
]
before = set(sys.modules)
exec(sys.argv[1])
new = sorted(set(sys.modules) - before)
armed = any(getattr(f, "__megatron_backports_trigger__", False) for f in sys.meta_path)
print(repr((new, armed)))
"""


def test_the_hook_line_imports_nothing_at_start_up():
    """It runs in every interpreter: any import here is paid by every `python -c pass`.
    Our package itself is the one import (a readable line), and it brings nothing else."""
    line = _hook_line(job_start.hook_text())
    done = subprocess.run(
        [sys.executable, "-I", "-c", _FRESH_INTERPRETER, line],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    new, armed = ast.literal_eval(done.stdout.strip())
    assert (new, armed) == (["backports", "backports.megatron"], True), done.stderr


@pytest.mark.parametrize(
    ("value", "armed"),
    [("0", False), ("false", False), (" OFF ", False), ("no", False), ("1", True), ("", True)],
)
def test_the_hook_line_obeys_the_api_switch(fired, monkeypatch, value, armed):
    monkeypatch.setenv(api.ENV_ENABLE, value)
    _run_hook_as_site_does(job_start.hook_text())
    assert bool(start_up.triggers()) is armed


def test_hook_installs_a_trigger_that_fires_once_on_megatron(fired):
    _run_hook_as_site_does(job_start.hook_text(strict=True))
    (trigger,) = start_up.triggers()
    assert sys.meta_path[0] is trigger and start_up.active()
    assert trigger.find_spec("numpy", None, None) is None and fired == []
    spec = trigger.find_spec("megatron", None, None)
    assert spec.name == "megatron" and spec.submodule_search_locations  # megatron's own
    assert trigger.find_spec("megatron", None, None) is None
    assert fired == []  # not inside the import system's lookup: once megatron has executed
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert fired == [{"strict": True, "only": None}]
    spec.loader.exec_module(module)  # a re-import does not apply again
    assert fired == [{"strict": True, "only": None}]
    # The one hook has fired: nothing of ours acts any more (the trigger stays, inert).
    assert not start_up.active() and start_up.triggers() == [trigger]
    assert _our_finders() == []


def _our_finders() -> list[object]:
    """Our finders that still act: a fired start-up trigger answers nothing any more."""
    return [
        f
        for f in sys.meta_path
        if type(f).__module__.startswith("backports.megatron")
        and not getattr(f, "fired", False)
        and not getattr(f, "__megatron_backports_namespace__", False)  # finds no module of ours
    ]


def test_one_finder_serves_the_trigger_the_import_guards_and_the_post_import_hooks(fired):
    """The start-up hook fires at megatron's first lookup; apply() then installs
    megatron-lm-6964's import guard, and other backports wait for their targets' import:
    one finder of ours in ``sys.meta_path`` serves them all, never two in series."""
    assert post_import._FINDER not in sys.meta_path  # conftest reverted what tests left
    _run_hook_as_site_does(job_start.hook_text())
    (trigger,) = start_up.triggers()
    assert _our_finders() == [trigger]
    assert trigger.find_spec("megatron", None, None) is not None  # the finder comes first
    try:
        (report,) = api.apply(("megatron-lm-6964",))
        assert report.action is Action.INSTALLED
        assert install.installed("megatron-lm-6964") is not None
        post_import.register("megatron_not_imported_yet.target", "another backport", print)
        assert _our_finders() == [post_import._FINDER]  # the trigger fired: it answers nothing
        assert post_import.registered("import-guard:megatron-lm-6964") == [
            "megatron.core.transformer.attention"
        ]
    finally:
        post_import.unregister("another backport")
        api.revert(("megatron-lm-6964",))
        start_up.deactivate()
    assert _our_finders() == []


def test_the_trigger_marker_is_the_packages():
    # activation imports nothing from the package above it: the marker is spelled twice.
    assert start_up.MARKER == backports.megatron._TRIGGER


def test_running_the_hook_twice_keeps_one_trigger(fired):
    _run_hook_as_site_does(job_start.hook_text())
    _run_hook_as_site_does(job_start.hook_text())
    assert len(start_up.triggers()) == 1


def test_hook_line_is_one_short_readable_import():
    """No payload a reviewer cannot read: one guarded import of our package."""
    line = _hook_line(job_start.hook_text(strict=True))
    # The paths it checks are data whose length depends on where the venv and the checkout
    # live (an editable install adds its site dir): the code around them stays short.
    code = re.sub(r"'/[^']*'", "''", line)
    assert len(code) < 400
    for opaque in ("exec", "eval", "marshal", "compile", "base64", "codecs", "\\x"):
        assert opaque not in line
    assert "__import__('backports.megatron', fromlist=['_start_up'])._start_up((" in line
    assert f"os.path.isfile({str(PACKAGE_INIT)!r})" in line


def test_hook_line_does_nothing_once_the_package_is_gone(fired, monkeypatch):
    line = _hook_line(job_start.hook_text())
    # After `pip uninstall megatron-backports`, the file the line checks for is gone.
    gone = line.replace(repr(str(PACKAGE_INIT)), repr(str(PACKAGE_INIT) + ".uninstalled"))
    assert gone != line
    calls: list[tuple] = []
    monkeypatch.setattr(backports.megatron, "_start_up", lambda *args: calls.append(args))
    exec(gone)
    assert calls == []
    exec(line)  # the control: with the file there, the line starts the trigger
    assert calls == [(("megatron", "megatron_fsdp"), {"strict": False, "only": None})]


class _Broken(importlib.abc.MetaPathFinder):
    """What a corrupted install looks like to the import system: the module raises."""

    def __init__(self, name: str, error: Exception) -> None:
        self.name, self.error = name, error

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            raise self.error
        return None


def _break_activation(monkeypatch, error: Exception) -> None:
    """``backports.megatron.job.start_up`` (what the trigger imports at megatron's first
    lookup) fails to import, as after a half-done upgrade."""
    import backports.megatron.job.start_up  # noqa: F401  (there to be taken away)

    monkeypatch.delitem(sys.modules, "backports.megatron.job.start_up")
    monkeypatch.delattr(sys.modules["backports.megatron.job"], "start_up")
    finder = _Broken("backports.megatron.job.start_up", error)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delenv("MEGATRON_BACKPORTS_SAID", raising=False)


_SYNTAX_ERROR = SyntaxError("invalid syntax", ("start_up.py", 3, 5, "def (\n"))


@pytest.mark.parametrize(
    "error", [_SYNTAX_ERROR, ImportError("gone")], ids=["syntax-error", "import-error"]
)
def test_a_broken_install_is_said_in_one_line_and_megatron_imports(fired, monkeypatch, error):
    _break_activation(monkeypatch, error)
    _run_hook_as_site_does(job_start.hook_text())
    (trigger,) = start_up.triggers()
    err = io.StringIO()
    with redirect_stderr(err):
        assert trigger.find_spec("megatron", None, None) is None  # the import goes on
    (line,) = err.getvalue().splitlines()
    assert line.startswith("megatron-backports: the start-up hook failed (")
    assert type(error).__name__ in line and "`backports revert`" in line
    assert fired == []


def test_a_broken_install_is_said_once_per_job(fired, monkeypatch):
    _break_activation(monkeypatch, _SYNTAX_ERROR)
    _run_hook_as_site_does(job_start.hook_text())
    err = io.StringIO()
    with redirect_stderr(err):
        start_up.triggers()[0].find_spec("megatron", None, None)
        # A spawn child of this process: a new trigger, the parent's environment.
        _run_hook_as_site_does(job_start.hook_text())
        start_up.triggers()[0].find_spec("megatron", None, None)
    assert len(err.getvalue().splitlines()) == 1


def test_a_broken_install_fails_the_import_in_strict_mode(fired, monkeypatch):
    _break_activation(monkeypatch, _SYNTAX_ERROR)
    _run_hook_as_site_does(job_start.hook_text(strict=True))
    (trigger,) = start_up.triggers()
    with pytest.raises(SyntaxError):
        trigger.find_spec("megatron", None, None)


def test_fire_applies_with_the_hook_config(monkeypatch):
    seen = []
    monkeypatch.setattr(api, "apply_in_job", lambda only, strict: seen.append((only, strict)))
    backports.megatron._job_start(None, strict=False, only=[BACKPORT_ID])
    assert seen == [((BACKPORT_ID,), False)]


def test_fire_never_breaks_the_import_unless_strict(monkeypatch, caplog):
    def broken(only, strict):
        raise BackportError("megatron-lm-7617 is incompatible: ...")

    monkeypatch.setattr(api, "apply_in_job", broken)
    with caplog.at_level(logging.ERROR, logger="backports.megatron"):
        backports.megatron._job_start(None, strict=False, only=None)
    assert "job-start apply() failed" in caplog.text
    with pytest.raises(BackportError):
        backports.megatron._job_start(None, strict=True, only=None)


def test_fire_says_a_failure_once_per_job(monkeypatch, caplog):
    def broken(only, strict):
        raise RuntimeError("a bug")

    monkeypatch.setattr(api, "apply_in_job", broken)
    with caplog.at_level(logging.DEBUG, logger="backports.megatron"):
        backports.megatron._job_start(None, strict=False, only=None)
        # a child: the parent's environment
        backports.megatron._job_start(None, strict=False, only=None)
    levels = [r.levelno for r in caplog.records if "job-start apply() failed" in r.getMessage()]
    assert levels == [logging.ERROR, logging.DEBUG]


def test_write_read_remove_are_idempotent(tmp_path):
    state, changed = job_start.write_hook(tmp_path)
    assert changed and state.exists and state.current
    assert state.path == tmp_path / hook_file.HOOK_FILE
    assert state.config == {"strict": False, "only": None}
    assert job_start.write_hook(tmp_path) == (state, False)
    strict, changed = job_start.write_hook(tmp_path, (BACKPORT_ID,), strict=True)
    assert changed and strict.config == {"strict": True, "only": (BACKPORT_ID,)}
    # The .pth file and its PEP 829 twin, and no temp files.
    assert sorted(p.name for p in tmp_path.iterdir()) == [hook_file.HOOK_FILE, START_FILE]
    removed, did = hook_file.remove_hook(tmp_path)
    assert did and removed.exists and list(tmp_path.iterdir()) == []
    again, did = hook_file.remove_hook(tmp_path)
    assert not did and not again.exists


def test_edited_or_foreign_hook_file_is_not_current(tmp_path):
    path = tmp_path / hook_file.HOOK_FILE
    path.write_text("import something_else\n")
    assert job_start.read_hook(tmp_path).exists
    assert not job_start.read_hook(tmp_path).current
    job_start.write_hook(tmp_path)
    text = path.read_text()
    path.write_text(text.replace("_start_up(('megatron', ", "_start_up(('other', "))
    assert path.read_text() != text
    assert not job_start.read_hook(tmp_path).current


def test_only_must_name_known_backports(tmp_path):
    with pytest.raises(BackportError, match="unknown backport"):
        job_start.write_hook(tmp_path, ("megatron-lm-1",))


def test_a_temp_folder_is_not_a_site_dir(tmp_path):
    assert not hook_file.is_site_dir(tmp_path)
    assert hook_file.is_site_dir(hook_file.default_site_dir())


_PLUGIN_IMPORTING_MEGATRON = """
import sys, textwrap
sys.path.insert(0, {root!r})
import backports.megatron
backports.megatron._start_up(("megatron",), {{"strict": False, "only": None}})
import megatron.core
from backports.megatron import catalog
assert "plug_imports_megatron" in sys.modules, catalog.withheld()
print("parallel_state:", megatron.core.parallel_state.__name__)
one = sys.modules["megatron"] is megatron and megatron.core is sys.modules["megatron.core"]
print("one megatron:", one)
from backports.megatron.kinds import import_guard as import_guards
from backports.megatron.kinds.install import installed
print("guard installed:", installed("megatron-lm-6964") is not None)
ours = [f for f in sys.meta_path if type(f).__module__.startswith("backports.megatron")]
ours = [f for f in ours if not getattr(f, "__megatron_backports_namespace__", False)]
print("acting finders:", [type(f).__module__ for f in ours if not getattr(f, "fired", False)])
"""


@pytest.mark.slow
def test_a_plugin_that_imports_megatron_at_module_level_leaves_one_megatron(tmp_path):
    """The trigger runs apply() (and so loads the plugins) only once megatron's own import
    has finished: a plugin's ``import megatron.core...`` must not leave a second, empty
    ``megatron`` namespace module in ``sys.modules``."""
    root = tmp_path / "plugin"
    (root / "plug_imports_megatron").mkdir(parents=True)
    (root / "plug_imports_megatron" / "__init__.py").write_text(
        "import megatron.core.parallel_state  # at module level, as a plugin may\nVALUE = ()\n"
    )
    info = root / "plug_imports_megatron-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: plug-imports-megatron\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[megatron_backports]\nplug = plug_imports_megatron:VALUE\n"
    )
    script = _PLUGIN_IMPORTING_MEGATRON.format(root=str(root))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    # No proof store: this process proves #6964 itself (a job's process with the store on
    # proves it once per node: tests/interpreter/test_isolation.py), and writes none.
    env["MEGATRON_BACKPORTS_CACHE"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "parallel_state: megatron.core.parallel_state" in done.stdout
    assert "one megatron: True" in done.stdout
    # One finder of ours acts: the import finder, first; it also serves #6964's import
    # guard (installed before megatron's modules run). The fired trigger stays, inert.
    assert "guard installed: True" in done.stdout
    assert "acting finders: ['backports.megatron.interpreter.import_hooks']" in done.stdout


def test_the_hook_line_is_silent_where_our_package_cannot_be_imported(tmp_path):
    """Another interpreter reading the site folder (here ``-I -S``, whose ``sys.path`` does
    not reach this install, then ``site.addsitedir``): our ``__init__.py`` still exists,
    but ``backports.megatron`` cannot be imported there. Start-up must stay silent."""
    job_start.write_hook(tmp_path)
    script = (
        "import site, sys; site.addsitedir(sys.argv[1]); "
        "print(any(getattr(f, '__megatron_backports_trigger__', False) for f in sys.meta_path))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "False\n", "")
