"""A synced vendored file, fed to the probe and applier, passes the hand-written one's tests,
and the local changes survive the sync.

The function comes from a test upstream repository (tests/sync/upstreams.py builds
it, written the way the pull request writes it: F.pad, ``permute().contiguous()``,
``.to(torch.int32)``, no index hygiene) through ``tools/sync_upstream.py`` into a
temporary copy of vendor/, importable as the package ``synced_vendor``. A catalog entry
that differs from the real one only in where its vendored code lives is probed and
installed by ``apply()`` on real megatron-core 0.19.2 with the fake kernel, and then every
behaviour test written for the hand-written function, and every test of the local
changes (tests/entries/test_local_changes.py), runs again, unchanged, against the synced one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import tests.entries.test_fused_sparse_mla_absorbed as behaviour
import tests.entries.test_fused_sparse_mla_absorbed_properties as properties
import tests.entries.test_local_changes as local_changes
from backports.megatron import Action, Verdict, apply, catalog, cli
from backports.megatron.catalog import MEGATRON_LM_7617, BackportSpec
from backports.megatron.local_changes import wrap_all
from backports.megatron.testing.fake_kernel import FakeSparseMLA
from backports.megatron.vendored import load_replacement
from tests.conftest import BACKPORT_ID, TILELANG_DSA
from tests.deciding import probe
from tests.entries.test_local_changes import deterministic  # noqa: F401 (a fixture they use)
from tests.paths import ROOT
from tests.reports import report_for
from tests.sync.upstreams import BACKPORT, FIXED_LIVE, build_upstream, sync_upstream

PACKAGE = "synced_vendor"


def spec_for(package: str) -> BackportSpec:
    vendored = dataclasses.replace(MEGATRON_LM_7617.vendored, package=package)
    return dataclasses.replace(MEGATRON_LM_7617, vendored=vendored)


@pytest.fixture(scope="module")
def sync_output(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """vendor/ copied to ``<tmp>/pkgs/synced_vendor`` and synced at the PR head; what the
    tool printed."""
    root = tmp_path_factory.mktemp("synced")
    upstream = build_upstream(root / "Megatron-LM")
    vendor = root / "pkgs" / PACKAGE
    shutil.copytree(ROOT / "vendor", vendor, ignore=shutil.ignore_patterns("__pycache__"))
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(out):
        env.setenv("XDG_CACHE_HOME", str(root / "cache"))
        args = ["--sha", upstream.pr_head[:7], "--pr", "7617", "--repo", str(upstream.path)]
        assert sync_upstream.main(["--backport", BACKPORT, *args, "--vendor-dir", str(vendor)]) == 0
    yield vendor, out.getvalue()
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def synced_vendor(sync_output: tuple[Path, str]) -> Path:
    return sync_output[0]


@pytest.fixture(autouse=True)
def synced_catalog(synced_vendor: Path, monkeypatch: pytest.MonkeyPatch) -> BackportSpec:
    """``apply()`` and ``revert()`` see the synced copy in place of vendor/."""
    monkeypatch.syspath_prepend(str(synced_vendor.parent))
    spec = spec_for(f"{PACKAGE}.megatron_lm_7617")
    monkeypatch.setattr(catalog, "CATALOG", (spec,))  # what select(), so apply(), reads
    return spec


def _install_synced(tilelang_dsa: ModuleType, upstream_only: bool) -> ModuleType:
    report = report_for(apply(upstream_only=upstream_only), BACKPORT_ID)
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


@pytest.fixture
def vendored(synced_catalog: BackportSpec, tilelang_dsa: ModuleType) -> Any:
    """What the local changes' own ``vendored`` fixture gives them: here, the synced function."""
    function = load_replacement(synced_catalog.vendored, TILELANG_DSA)
    assert function.__module__ == f"{PACKAGE}.megatron_lm_7617.tilelang_dsa"
    return function


# The hand-written function's behaviour tests and the local changes' tests, collected again
# in this module: here the `installed` and `vendored` fixtures and the catalog above hand
# them the synced function.
# They run in the slow selection: the fast one runs each against the hand-written function,
# and here the synced text's own tests below (its bits equal to the vendored function's
# alone, the local changes kept) stand for it.
_THE_SAME_TESTS_ON_THE_SYNCED_COPY = pytest.mark.slow(
    reason="the behaviour and local-changes tests again, on the synced copy (~30 s of CPU); "
    "the fast selection runs them on the hand-written function and the synced copy's own "
    "bit-exactness and kept-local-changes tests here"
)


def _slow_copy(test: Any) -> Any:
    """The test function under its own name here, marked slow: a copy, so the marks of the
    module it comes from stay as they are."""
    copy = types.FunctionType(
        test.__code__, test.__globals__, test.__name__, test.__defaults__, test.__closure__
    )
    copy.__dict__.update(test.__dict__)
    copy.pytestmark = [*getattr(test, "pytestmark", []), _THE_SAME_TESTS_ON_THE_SYNCED_COPY]
    return copy


for _module in (behaviour, properties, local_changes):
    for _name in [n for n in vars(_module) if n.startswith("test_")]:
        assert _name not in globals(), _name
        globals()[_name] = _slow_copy(getattr(_module, _name))


def test_the_synced_text_is_upstreams_without_index_hygiene(synced_vendor: Path) -> None:
    """What the local changes must wrap: upstream's text, F.pad and permute included."""
    text = (synced_vendor / "megatron_lm_7617" / "tilelang_dsa.py").read_text(encoding="utf-8")
    assert text.endswith(FIXED_LIVE)
    assert "F.pad(" in text and ".permute(1, 0, 2, 3).contiguous()" in text
    assert "< sk" not in text and "sk)" not in text


def test_the_sync_said_which_local_changes_it_kept(sync_output: tuple[Path, str]) -> None:
    kept = [line for line in sync_output[1].splitlines() if line.startswith("kept local")]
    assert kept == [
        f"kept local change {change.name}: {change.reason}"
        for change in MEGATRON_LM_7617.local_changes
    ]


def test_after_a_sync_apply_installs_both_local_changes(
    tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "--json"]) == 0
    report = report_for(json.loads(capsys.readouterr().out), BACKPORT_ID)
    assert report["verdict"] == "needed" and report["evidence"]["mode"] == "local-changes"
    assert report["evidence"]["upstream"]["origin"] == "synced"
    listed = report["evidence"]["local_changes"]
    assert [(c["name"], c["active"]) for c in listed] == [
        ("index-hygiene", True),
        ("lean-copies", True),
    ]
    _install_synced(tilelang_dsa, upstream_only=False)


@pytest.mark.parametrize("bad", [-2, 11, 40, 2**31 + 3])
def test_after_a_sync_an_out_of_range_index_never_reaches_the_kernel(
    installed: ModuleType, fake_kernel: FakeSparseMLA, vendored: Any, bad: int
) -> None:
    """Upstream's text hands it on (the fake kernel refuses it); the kept hygiene stops it."""
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(4, 2, 16, 512, generator=gen).to(torch.bfloat16)
    key = torch.randn(11, 2, 1, 512, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, 11, (2, 4, 65), generator=gen)
    indices[1, 3, :3] = bad
    with pytest.raises(AssertionError, match="out-of-bounds"):
        vendored(query, key, indices, 0.0625, 512)  # the synced function alone
    out = installed.fused_sparse_mla_absorbed(query, key, indices, 0.0625, 512)
    assert out is not None and out.shape == (4, 2, 16, 512)
    call = fake_kernel.calls[-1]
    assert bool(((call.indices >= -1) & (call.indices < 11)).all())
    assert (call.indices[1, 3, 0, :3] == -1).all()


@pytest.mark.parametrize("b, heads, width, topk", [(2, 16, 512, 2051), (1, 8, 576, 65)])
def test_after_a_sync_the_output_is_bit_exact_with_the_synced_function_alone(
    installed: ModuleType,
    fake_kernel: FakeSparseMLA,
    vendored: Any,
    b: int,
    heads: int,
    width: int,
    topk: int,
) -> None:
    gen = torch.Generator().manual_seed(4)
    query = torch.randn(5, b, heads, width, generator=gen).to(torch.bfloat16)
    key = torch.randn(13, b, 1, width, generator=gen).to(torch.bfloat16)
    indices = torch.randint(-1, 13, (b, 5, topk), generator=gen)
    alone = vendored(query, key, indices, 0.0625, 512)
    wrapped = installed.fused_sparse_mla_absorbed(query, key, indices, 0.0625, 512)
    assert installed.fused_sparse_mla_absorbed is not vendored  # the local changes wrap it
    assert torch.equal(alone, wrapped)
    first, second = fake_kernel.calls[-2:]
    for name in ("q", "kv", "indices"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    both = wrap_all(vendored, MEGATRON_LM_7617.local_changes)
    assert torch.equal(both(query, key, indices, 0.0625, 512), alone)


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
    assert "edited without backports sync" in result.reason
