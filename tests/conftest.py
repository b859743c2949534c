"""Shared fixtures: the real megatron-core 0.19.2 module, a fake kernel, clean state."""

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

from backports.megatron import revert
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
    yield
    revert()


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[list[object]]:
    """Each scan for aliases the patcher makes, as the objects it looked for."""
    from backports.megatron import patcher

    seen: list[list[object]] = []
    real = patcher._bindings_of_each

    def counting(objs):  # type: ignore[no-untyped-def]
        seen.append(list(objs))
        return real(objs)

    monkeypatch.setattr(patcher, "_bindings_of_each", counting)
    return seen


def ids_installed_by_importing(module: str) -> list[str]:
    """The catalog ids a process installs when its only megatron import is ``module``:
    every entry whose targets are all defined in modules that import brings in. (An entry
    with a target elsewhere, as #6793's recompute / DSA pair, waits for its modules.)"""
    import subprocess
    import sys

    script = (
        f"import sys, {module}\n"
        "from backports.megatron.catalog import CATALOG\n"
        "print(' '.join(s.id for s in CATALOG if all("
        "any(m in sys.modules for m in t.modules) for t in s.targets)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    return sorted(done.stdout.split())
