"""A decision made inside an import (the deferred path: the import finder calls back while the
importing thread holds the module's import lock) runs its sniffs in that thread: a sniff that
imports the module from a thread of its own would wait on that lock until its time limit.
Seen with #6890, whose vendored module's ``__getattr__`` imports the target module."""

import importlib
import sys
import textwrap
import threading
from types import SimpleNamespace

import pytest

from backports.megatron.decision import sniffing
from backports.megatron.job import deferred
from backports.megatron.model import SniffResult


def _spec_importing(module_name: str) -> SimpleNamespace:
    def sniff(targets):  # type: ignore[no-untyped-def]
        module = importlib.import_module(module_name)  # waits on the import lock if elsewhere
        return SniffResult(fixed=True, summary=f"saw {module.__name__}")

    return SimpleNamespace(id="inside-import", sniff=sniff, sniff_imports=())


@pytest.fixture
def module_sniffing_itself(tmp_path, monkeypatch):
    """A module whose body runs a sniff that imports the module (as the import callback
    does), with or without ``sniffs_in_this_thread``; it keeps what the sniff gave."""
    name = "backports_test_sniffs_itself"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            import os
            from backports.megatron.decision import sniffing
            from tests.decision.test_sniff_inside_import import _spec_importing
            spec = _spec_importing({name!r})
            if os.environ.get("INLINE") == "1":
                with sniffing.sniffs_in_this_thread():
                    OUTCOME = sniffing.run_sniffs(spec, [[]], in_child=False)
            else:
                OUTCOME = sniffing.run_sniffs(spec, [[]], in_child=False)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(sniffing.TIMEOUT, "2")
    yield name
    sys.modules.pop(name, None)


def test_a_sniff_thread_importing_the_module_being_imported_times_out(
    module_sniffing_itself, monkeypatch
):
    """The hazard itself: without ``sniffs_in_this_thread`` the sniff's thread waits."""
    monkeypatch.setenv("INLINE", "0")
    (outcome,) = importlib.import_module(module_sniffing_itself).OUTCOME
    assert "timed out" in str(outcome)
    for thread in threading.enumerate():  # the import is done: the waiting thread ends
        if thread.name == "backports-sniff-inside-import":
            thread.join(30)


def test_sniffs_in_this_thread_run_inside_the_import(module_sniffing_itself, monkeypatch):
    monkeypatch.setenv("INLINE", "1")
    (outcome,) = importlib.import_module(module_sniffing_itself).OUTCOME
    assert isinstance(outcome, SniffResult) and outcome.summary.startswith("saw ")


def test_the_import_callback_decides_with_sniffs_in_the_importing_thread(monkeypatch):
    seen: list[tuple[bool, str]] = []
    watch = SimpleNamespace(
        spec=SimpleNamespace(id="x"), mode="m", child_sniffs=False, plugin=None, on_demand=False
    )
    monkeypatch.setattr(deferred, "_due", lambda module_name: [watch])

    def deciding(*args, **kwargs):  # type: ignore[no-untyped-def]
        inline = getattr(sniffing._THIS_THREAD, "inline", False)
        seen.append((inline, threading.current_thread().name))
        return SimpleNamespace(verdict=None)

    monkeypatch.setattr(deferred, "decide", deciding)
    deferred.on_target_import(SimpleNamespace(__name__="any.module"))  # type: ignore[arg-type]
    assert seen == [(True, threading.current_thread().name)]
    assert getattr(sniffing._THIS_THREAD, "inline", False) is False  # put back after
