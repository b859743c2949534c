"""Shared fixtures: the real megatron-core 0.19.2 module, a fake kernel, clean state."""

import functools
import importlib
import importlib.metadata
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from backports.megatron import revert
from backports.megatron.session import SESSION
from backports.megatron.testing.fake_kernel import FakeSparseMLA

TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
BACKPORT_ID = "megatron-lm-7617"


@pytest.fixture(scope="session")
def tilelang_dsa() -> ModuleType:
    """The real, installed megatron-core module (imported once: it takes seconds)."""
    return importlib.import_module(TILELANG_DSA)


@pytest.fixture
def fake_kernel(tilelang_dsa: ModuleType, monkeypatch: pytest.MonkeyPatch) -> FakeSparseMLA:
    """Replace only the TileLang kernel; everything else is the real megatron-core."""
    kernel = FakeSparseMLA()
    monkeypatch.setattr(tilelang_dsa, "SparseMLA", kernel)
    return kernel


@functools.cache
def environment_plugins() -> frozenset[str]:
    """Distributions installed in this environment that register catalog entries: a user's
    plugin (``backports new`` tells its author to install it into the job's venv)."""
    from packaging.utils import canonicalize_name

    from backports.megatron.catalog._plugins import GROUP

    return frozenset(
        canonicalize_name(ep.dist.name)
        for ep in importlib.metadata.entry_points(group=GROUP)
        if ep.dist is not None
    )


@pytest.fixture(scope="session")
def _environment_plugins() -> frozenset[str]:
    return environment_plugins()


def _skip_switch(plugins: frozenset[str]) -> tuple[str, str]:
    from backports.megatron.switches import SKIP_PLUGINS

    return SKIP_PLUGINS, ",".join(sorted(plugins))


def skip_environment_plugins() -> dict[str, str]:
    """For a child process whose environment a test writes itself: the switch that leaves
    the plugins installed in this environment unimported ({} when there are none). Its
    skipped distributions still show as ``disabled`` rows: compare builtin rows only."""
    plugins = environment_plugins()
    return dict([_skip_switch(plugins)]) if plugins else {}


def builtin_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``--json`` rows of builtin entries (a user's plugin in the venv adds its own)."""
    return [row for row in rows if row.get("source") == "builtin"]


@pytest.fixture(autouse=True)
def _builtins_and_the_tests_own_plugins(
    monkeypatch: pytest.MonkeyPatch, _environment_plugins: frozenset[str]
) -> Iterator[None]:
    """The catalog of each test: the builtins and the plugins the test makes itself.

    The tests assert what the builtin entries do; a user's plugin installed in the same
    venv (its stub sniff says ``incompatible``, its warnings add lines) is not theirs to
    judge, so its entry points are hidden from them. tests/test_plugins.py builds its own.
    """
    if not _environment_plugins:
        yield
        return
    # The processes a test starts inherit this: they leave the user's plugin unimported too
    # (a test writing its child's environment from scratch adds skip_environment_plugins()).
    monkeypatch.setenv(*_skip_switch(_environment_plugins))
    from packaging.utils import canonicalize_name

    from backports.megatron import catalog
    from backports.megatron.catalog._plugins import GROUP

    real = importlib.metadata.entry_points

    def entry_points(**params: Any) -> importlib.metadata.EntryPoints:
        found = real(**params)
        if params.get("group") != GROUP:
            return found
        return importlib.metadata.EntryPoints(
            ep
            for ep in found
            if ep.dist is None or canonicalize_name(ep.dist.name) not in _environment_plugins
        )

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    catalog.reload()
    yield
    catalog.reload()


@pytest.fixture(autouse=True)
def _no_backport_leaks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends with nothing installed and no pending hook."""
    monkeypatch.delenv("MEGATRON_BACKPORTS", raising=False)
    monkeypatch.delenv("MEGATRON_BACKPORTS_SKIP", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    # Warnings an earlier test gave would silence this test's as a parent's would a child's.
    monkeypatch.setenv("MEGATRON_BACKPORTS_SAID", "")
    # Tests swap functions and sniffs in memory; the verdict cache has its own tests.
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "0")
    monkeypatch.delenv("MEGATRON_BACKPORTS_SAID")
    revert()
    SESSION.reset()  # a new session per test: nothing installed, watched, said or loaded
    yield
    revert()
    SESSION.reset()


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[list[object]]:
    """Each scan for aliases the patcher makes, as the objects it looked for."""
    from backports.megatron.kinds import install

    seen: list[list[object]] = []
    real = install.bindings_of_each

    def counting(objs):  # type: ignore[no-untyped-def]
        seen.append(list(objs))
        return real(objs)

    monkeypatch.setattr(install, "bindings_of_each", counting)
    return seen


def ids_installed_by_importing(module: str) -> list[str]:
    """The catalog ids a process installs when its only megatron import is ``module``:
    every entry whose targets are all defined in modules that import brings in, and every
    import guard (installed before any megatron module runs). (An entry with a target
    elsewhere, as #6793's recompute / DSA pair, waits for its modules.)"""
    import subprocess
    import sys

    script = (
        f"import sys, {module}\n"
        "from backports.megatron.catalog import CATALOG\n"
        "from backports.megatron.kinds import kind_of\n"
        "print(' '.join(s.id for s in CATALOG if all(kind_of(t).before_import or "
        "any(m in sys.modules for m in t.modules) for t in s.targets)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    return sorted(done.stdout.split())


# ---- what the default selection leaves out (tools/run-tests without --all) -------------------

_DESELECTED_SLOW: list[pytest.Item] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _DESELECTED_SLOW.extend(item for item in items if item.get_closest_marker("slow"))


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    """Name the slow tests a ``-m "not slow"`` run left out, file by file: what was not run
    is said, not hidden in a count."""
    if not _DESELECTED_SLOW:
        return
    by_file: dict[str, list[str]] = {}
    for item in _DESELECTED_SLOW:
        path, _, name = item.nodeid.partition("::")
        by_file.setdefault(path, []).append(name)
    write = terminalreporter.write_line
    write(f"not run: {len(_DESELECTED_SLOW)} slow tests (tools/run-tests --all runs them):")
    for path, names in by_file.items():
        write(f"  {path} ({len(names)}): {', '.join(names)}")
