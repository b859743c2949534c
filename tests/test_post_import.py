"""The post-import hook: callbacks run once a watched module has executed, never before."""

import importlib
import sys
import textwrap

import pytest

from backports.megatron import post_import


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("hooked_pkg")]:
        del sys.modules[name]
    post_import.unregister("test")
    post_import.unregister("test-other")


def _write_package(root):
    (root / "hooked_pkg").mkdir()
    (root / "hooked_pkg" / "__init__.py").write_text("")
    (root / "hooked_pkg" / "target.py").write_text(
        textwrap.dedent(
            """
            '''docstring'''
            VALUE = 41
            def answer():
                return VALUE + 1
            """
        )
    )


def test_callback_runs_after_the_module_executed(module_dir):
    _write_package(module_dir)
    seen = []
    post_import.register("hooked_pkg.target", "test", lambda m: seen.append(m.answer()))
    assert seen == []
    module = importlib.import_module("hooked_pkg.target")
    assert seen == [42]
    import inspect

    assert "VALUE + 1" in inspect.getsource(module.answer)  # loader still serves source


def test_unregister_removes_the_finder(module_dir):
    post_import.register("hooked_pkg.target", "test", lambda m: None)
    assert post_import._FINDER in sys.meta_path
    assert post_import.registered("test") == ["hooked_pkg.target"]
    post_import.unregister("test")
    assert post_import._FINDER not in sys.meta_path
    assert post_import.registered("test") == []


def test_failing_callback_never_breaks_the_import(module_dir, caplog):
    _write_package(module_dir)

    def broken(module):
        raise ValueError("boom")

    post_import.register("hooked_pkg.target", "test", broken)
    module = importlib.import_module("hooked_pkg.target")
    assert module.answer() == 42
    assert "boom" in caplog.text


def test_fatal_callback_fails_the_import(module_dir):
    _write_package(module_dir)

    class Fatal(RuntimeError):
        fatal_on_import = True

    def strict(module):
        raise Fatal("strict")

    post_import.register("hooked_pkg.target", "test", strict)
    with pytest.raises(Fatal):
        importlib.import_module("hooked_pkg.target")


def test_unwatched_modules_are_untouched(module_dir):
    _write_package(module_dir)
    post_import.register("hooked_pkg.other", "test", lambda m: None)
    module = importlib.import_module("hooked_pkg.target")
    assert type(module.__loader__).__name__ != "_NotifyingLoader"


def test_a_callback_under_several_keys_runs_once_per_import(module_dir):
    """One callback may serve several keys (the api's, one per backport): it runs once per
    import, and stays registered until its last key is dropped."""
    _write_package(module_dir)
    seen = []

    def callback(module):
        seen.append(module.answer())

    post_import.register("hooked_pkg.target", "test", callback)
    post_import.register("hooked_pkg.target", "test-other", callback)
    module = importlib.import_module("hooked_pkg.target")
    assert seen == [42]
    post_import.unregister("test")
    importlib.reload(module)
    assert seen == [42, 42]
    post_import.unregister("test-other")
    importlib.reload(module)
    assert seen == [42, 42]


def test_callbacks_are_told_apart_by_identity_alone(module_dir):
    """An unhashable callable (a class with ``__eq__``), and two that compare equal, each
    run: the import never hashes or compares them."""
    _write_package(module_dir)
    seen = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __eq__(self, other):
            return isinstance(other, Recorder)  # every Recorder "equals" every other

        def __call__(self, module):
            seen.append(self.name)

    post_import.register("hooked_pkg.target", "test", Recorder("first"))
    post_import.register("hooked_pkg.target", "test-other", Recorder("second"))
    importlib.import_module("hooked_pkg.target")
    assert seen == ["first", "second"]
