"""The sync tests' fixtures: an upstream repository built here (tests/sync/upstreams.py), a
copy of vendor/ to sync into, the tool run in this process. ``cache_home`` and
``sniff_in_process`` are opted into per file (``pytestmark``): tests/sync/test_sync_child.py
needs the real child."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))

import sync_upstream  # the thin wrapper users call

from backports.megatron.sync import verify as sync_verify
from tests.sync.upstreams import Run, Tool, Upstream, build_upstream


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    return build_upstream(tmp_path / "Megatron-LM")


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache clone goes under a temporary XDG_CACHE_HOME; the real home is never used.
    (A test that patches more keeps those patches in its own ``MonkeyPatch.context()``:
    ``monkeypatch.undo()`` would undo this one too.)"""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "cache"


@pytest.fixture
def sniff_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sniff a sync runs in a child interpreter (``verify.sniff_file``: ~5 s there, to
    import torch and megatron) runs in this process instead; the parent's side (what the
    result proves, the sha256 of the bytes sniffed) is the real one. The child itself is
    tests/sync/test_sync_child.py's (slow)."""
    monkeypatch.setattr(sync_verify, "_sniff_in_child", sync_verify.sniff_file)


@pytest.fixture
def vendor(tmp_path: Path) -> Path:
    """A copy of this repository's vendor/ to sync into."""
    copy = tmp_path / "vendor"
    shutil.copytree(ROOT / "vendor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.fixture
def tool(vendor: Path, capsys: pytest.CaptureFixture[str]) -> Tool:
    def run(*args: str) -> Run:
        try:
            code = sync_upstream.main([*args, "--vendor-dir", str(vendor)])
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run
