"""A synced vendored file, fed to the probe and applier, passes the hand-written one's tests.

The function comes from a test upstream repository (tests/test_sync_upstream.py builds
it) through ``tools/sync_upstream.py`` into a temporary copy of vendor/, importable as
the package ``synced_vendor``. A catalog entry that differs from the real one only in
where its vendored code lives is probed and installed by ``apply()`` on real
megatron-core 0.19.2 with the fake kernel, and then every behaviour test written for the
hand-written function runs again, unchanged, against the synced one.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import tests.test_fused_sparse_mla_absorbed as behaviour
import tests.test_fused_sparse_mla_absorbed_properties as properties
from backports.megatron import Action, Verdict, apply, catalog
from backports.megatron.catalog import MEGATRON_LM_7617, BackportSpec
from backports.megatron.probe import probe
from tests.fake_kernel import FakeSparseMLA
from tests.test_sync_upstream import BACKPORT, ROOT, build_upstream, sync_upstream

PACKAGE = "synced_vendor"


def spec_for(package: str) -> BackportSpec:
    vendored = dataclasses.replace(MEGATRON_LM_7617.vendored, package=package)
    return dataclasses.replace(MEGATRON_LM_7617, vendored=vendored)


@pytest.fixture(scope="module")
def synced_vendor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """vendor/ copied to ``<tmp>/pkgs/synced_vendor`` and synced at the PR head."""
    root = tmp_path_factory.mktemp("synced")
    upstream = build_upstream(root / "Megatron-LM")
    vendor = root / "pkgs" / PACKAGE
    shutil.copytree(ROOT / "vendor", vendor, ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(root / "cache"))
        args = ["--sha", upstream.pr_head[:7], "--pr", "7617", "--repo", str(upstream.path)]
        assert sync_upstream.main(["--backport", BACKPORT, *args, "--vendor-dir", str(vendor)]) == 0
    yield vendor
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def synced_catalog(synced_vendor: Path, monkeypatch: pytest.MonkeyPatch) -> BackportSpec:
    """``apply()`` and ``revert()`` see the synced copy in place of vendor/."""
    monkeypatch.syspath_prepend(str(synced_vendor.parent))
    spec = spec_for(f"{PACKAGE}.megatron_lm_7617")
    monkeypatch.setattr(catalog, "CATALOG", (spec,))  # what select(), so apply(), reads
    return spec


def _install_synced(tilelang_dsa: ModuleType, upstream_only: bool) -> ModuleType:
    (report,) = apply(upstream_only=upstream_only)
    assert report.verdict is Verdict.NEEDED and report.action is Action.INSTALLED, report
    assert report.evidence["upstream"]["origin"] == "synced"
    assert report.evidence["vendored"]["ok"]
    function = tilelang_dsa.fused_sparse_mla_absorbed
    vendored = sys.modules[f"{PACKAGE}.megatron_lm_7617.tilelang_dsa"]
    # Upstream-only runs the synced function itself; by default the local changes,
    # kept across the sync, wrap it.
    assert (function.__code__ is vendored.fused_sparse_mla_absorbed.__code__) == upstream_only
    assert function.__backport__ == BACKPORT
    return tilelang_dsa


@pytest.fixture
def installed(tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA) -> ModuleType:
    """What the behaviour tests' own ``installed`` does, checking it got the synced code."""
    return _install_synced(tilelang_dsa, upstream_only=False)


@pytest.fixture(params=[False, True], ids=["local-changes", "upstream-only"])
def installed_any_mode(
    request: pytest.FixtureRequest, tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA
) -> ModuleType:
    return _install_synced(tilelang_dsa, upstream_only=request.param)


# The hand-written function's behaviour tests, collected again in this module: here the
# `installed` fixture and the catalog above hand them the synced function.
for _module in (behaviour, properties):
    for _name in [n for n in vars(_module) if n.startswith("test_")]:
        assert _name not in globals(), _name
        globals()[_name] = getattr(_module, _name)


def test_the_synced_function_is_what_apply_installs(
    installed: ModuleType, synced_vendor: Path
) -> None:
    vendored = sys.modules[f"{PACKAGE}.megatron_lm_7617.tilelang_dsa"]
    assert vendored.__target_module__ == installed.__name__
    assert vendored.__reads__ == (
        "SparseMLA",
        "_all_bfloat16",
        "_is_supported_sparse_mla_head_count",
    )
    apply(upstream_only=True)
    assert (
        installed.fused_sparse_mla_absorbed.__code__ is vendored.fused_sparse_mla_absorbed.__code__
    )


def test_the_probe_refuses_a_hand_edited_synced_file(
    tilelang_dsa: ModuleType, synced_vendor: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edited = tmp_path / "pkgs" / "synced_vendor_edited"
    shutil.copytree(synced_vendor, edited, ignore=shutil.ignore_patterns("__pycache__"))
    path = edited / "megatron_lm_7617" / "tilelang_dsa.py"
    path.write_text(path.read_text(encoding="utf-8") + "# a local tweak\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(edited.parent))
    try:
        result = probe(spec_for("synced_vendor_edited.megatron_lm_7617"))
    finally:
        for name in [n for n in sys.modules if n.startswith("synced_vendor_edited")]:
            del sys.modules[name]
    assert result.verdict is Verdict.INCOMPATIBLE
    assert "edited without tools/sync_upstream.py" in result.reason
