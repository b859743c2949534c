"""The post-import hook: callbacks run once a watched module has executed, never before."""

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import textwrap

import pytest

from backports.megatron.interpreter import import_hooks as post_import


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
    assert not isinstance(module.__loader__, post_import._WatchingLoader)


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


# ---- "around" hooks: the module executes inside them (import guards) -------------------------


def _recording_around(events, name):
    @contextlib.contextmanager
    def around(module):
        events.append(f"{name} enter {module.__name__}")
        try:
            yield
        finally:
            events.append(f"{name} exit, VALUE={getattr(module, 'VALUE', None)}")

    return around


def test_the_module_executes_inside_its_arounds_then_the_callbacks_run(module_dir):
    _write_package(module_dir)
    events = []
    post_import.register_around("hooked_pkg.target", "test", _recording_around(events, "outer"))
    post_import.register_around("hooked_pkg.target", "test-other", _recording_around(events, "in"))
    post_import.register("hooked_pkg.target", "test", lambda m: events.append("callback"))
    module = importlib.import_module("hooked_pkg.target")
    assert events == [
        "outer enter hooked_pkg.target",
        "in enter hooked_pkg.target",
        "in exit, VALUE=41",  # left once the module's code has run
        "outer exit, VALUE=41",
        "callback",  # after the execution, outside every around
    ]
    import inspect

    assert "VALUE + 1" in inspect.getsource(module.answer)  # loader still serves source
    assert isinstance(module.__loader__, post_import._WatchingLoader)


def test_one_finder_serves_both_kinds_and_leaves_with_the_last_hook(module_dir):
    events = []
    post_import.register_around("hooked_pkg.target", "test", _recording_around(events, "a"))
    post_import.register("hooked_pkg.other", "test-other", lambda m: None)
    assert sys.meta_path.count(post_import._FINDER) == 1
    assert post_import.registered("test") == ["hooked_pkg.target"]
    post_import.unregister("test-other")
    assert post_import._FINDER in sys.meta_path  # the around still needs it
    post_import.unregister("test")
    assert post_import._FINDER not in sys.meta_path and post_import.registered("test") == []
    _write_package(module_dir)
    importlib.import_module("hooked_pkg.target")
    assert events == []  # unregistered: the next execution runs as it stands


def test_what_an_around_raises_fails_the_import(module_dir):
    """An around is part of the execution: its failure is the import's, as the module's own
    would be (importlib drops the half-made module)."""
    _write_package(module_dir)

    @contextlib.contextmanager
    def refusing(module):
        raise RuntimeError("guard refused")
        yield

    post_import.register_around("hooked_pkg.target", "test", refusing)
    with pytest.raises(RuntimeError, match="guard refused"):
        importlib.import_module("hooked_pkg.target")
    assert "hooked_pkg.target" not in sys.modules
    post_import.unregister("test")
    assert importlib.import_module("hooked_pkg.target").answer() == 42


class _Claiming(importlib.abc.MetaPathFinder):
    """Another library's finder (a profiler's or a type checker's import hook) that puts
    itself first and answers for the modules it likes from the path alone."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("hooked_pkg"):
            return importlib.machinery.PathFinder.find_spec(fullname, path, target)
        return None


def test_a_hook_registered_after_another_finder_came_first_still_runs(module_dir):
    """A finder inserted in front of the one finder since start-up must not take a guard's
    module past it: registering a hook brings the finder first."""
    _write_package(module_dir)
    claiming = _Claiming()
    try:
        post_import.register("some_other.module", "earlier", print)  # the finder is in
        assert sys.meta_path[0] is post_import._FINDER
        sys.meta_path.insert(0, claiming)
        events = []
        post_import.register_around("hooked_pkg.target", "test", _recording_around(events, "a"))
        assert sys.meta_path.index(post_import._FINDER) == 0
        assert sys.meta_path.count(post_import._FINDER) == 1 and claiming in sys.meta_path
        importlib.import_module("hooked_pkg.target")
        assert events == ["a enter hooked_pkg.target", "a exit, VALUE=41"]
    finally:
        post_import.unregister("earlier")
        if claiming in sys.meta_path:
            sys.meta_path.remove(claiming)


def test_a_finder_inserted_after_the_hooks_were_registered_does_not_bypass_them(module_dir):
    """typeguard's and jaxtyping's import hooks insert their finder at ``sys.meta_path[0]``
    after megatron's import, when every backport's hook is registered already: at the next
    import statement the one finder comes first again, so the watched module's hooks run."""
    _write_package(module_dir)
    claiming = _Claiming()
    events = []
    try:
        post_import.register_around("hooked_pkg.target", "test", _recording_around(events, "a"))
        sys.meta_path.insert(0, claiming)  # after the registration: nothing moved us back
        import hooked_pkg.target  # noqa: F401  (an import statement: the audit event)

        assert events == ["a enter hooked_pkg.target", "a exit, VALUE=41"]
        assert sys.meta_path[0] is post_import._FINDER
    finally:
        if claiming in sys.meta_path:
            sys.meta_path.remove(claiming)
