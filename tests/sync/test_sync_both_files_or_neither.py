"""Both files or neither: a sync interrupted at any step (a full disk, Ctrl-C) leaves the
old pair of the vendored file and UPSTREAM.toml, and the next run repairs a half swap.

The upstream each test builds: tests/sync/upstreams.py; the fixtures (the tool run in this
process): tests/sync/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))

import sync_upstream  # the thin wrapper users call

from backports.megatron.sync import commands as sync_commands
from tests.sync.upstreams import (
    Tool,
    Upstream,
    hidden,
    manifest,
    sync_args,
    visible,
)

pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")


@pytest.fixture
def synced_elsewhere(tmp_path: Path, upstream: Upstream, vendor: Path) -> dict[str, bytes]:
    """What vendor/ holds after an uninterrupted sync (run on a second copy of it)."""
    other = tmp_path / "vendor-uninterrupted"
    shutil.copytree(vendor, other)
    assert sync_upstream.main([*sync_args(upstream), "--vendor-dir", str(other)]) == 0
    return visible(other)


class FailAt:
    """Make the ``n``-th write or rename under ``vendor`` raise ``error`` (0-based)."""

    def __init__(self, vendor: Path, n: int, error: BaseException) -> None:
        self.vendor, self.n, self.error, self.seen = str(vendor), n, error, 0
        self.real_rename, self.real_write = os.rename, sync_commands.write_file

    def _step(self, *paths: Any) -> None:
        if any(str(path).startswith(self.vendor) for path in paths):
            self.seen += 1
            if self.seen - 1 == self.n:
                raise self.error

    def rename(self, src: Any, dst: Any) -> None:
        self._step(src, dst)
        self.real_rename(src, dst)

    def write_file(self, path: Path, text: str) -> None:
        self._step(path)
        self.real_write(path, text)


# A sync's steps under vendor/: write the staged file, write the staged UPSTREAM.toml,
# move the folder aside, move the staged copy in.
STEPS = 4


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("step", range(STEPS))
def test_an_interrupted_sync_leaves_the_old_pair(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    synced_elsewhere: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    step: int,
    error: BaseException,
) -> None:
    before = visible(vendor)
    fail = FailAt(vendor, step, error)
    with pytest.MonkeyPatch.context() as failing:  # undone alone: the cache stays redirected
        failing.setattr(os, "rename", fail.rename)
        failing.setattr(sync_commands, "write_file", fail.write_file)
        run = tool(*sync_args(upstream))
    assert fail.seen > step  # it really failed at that step
    ctrl_c = isinstance(error, KeyboardInterrupt)
    assert run.code == (130 if ctrl_c else 2) and run.err.count("\n") == 1, run.err
    assert run.err.startswith("sync_upstream.py: error: ")
    assert "Traceback" not in run.err
    assert ("interrupted" if ctrl_c else "No space left") in run.err
    assert visible(vendor) == before and hidden(vendor) == []
    assert tool(*sync_args(upstream)).code == 0
    assert visible(vendor) == synced_elsewhere


def test_a_swap_that_cannot_put_the_old_folder_back_is_repaired_by_the_next_run(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    synced_elsewhere: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Killed between the two renames, in effect: the folder is set aside, not back."""
    before = visible(vendor)
    real = os.rename
    renames: list[str] = []

    def rename(src: Any, dst: Any) -> None:
        renames.append(Path(src).name)
        if len(renames) > 1:
            raise OSError(5, "Input/output error")
        real(src, dst)

    with pytest.MonkeyPatch.context() as failing:  # undone alone: the cache stays redirected
        failing.setattr(os, "rename", rename)
        run = tool(*sync_args(upstream))
    assert run.code == 2 and run.err.count("\n") == 1, run.err
    aside = vendor / ".megatron_lm_7617.sync-old"
    assert f"it is {aside}; the next run puts it back" in run.err
    assert not (vendor / "megatron_lm_7617").exists()
    check = tool("--check")  # read-only: it names the leftover and fails
    assert check.code == 1 and "leftover: .megatron_lm_7617.sync-old" in check.out
    dry = tool(*sync_args(upstream), "--dry-run")
    assert "note: .megatron_lm_7617.sync-old is left by a killed sync" in dry.out
    assert not (vendor / "megatron_lm_7617").exists()  # a dry run writes nothing
    again = tool(*sync_args(upstream))
    assert again.code == 0, again.err
    assert "note: put megatron_lm_7617/ back from .megatron_lm_7617.sync-old" in again.out
    assert visible(vendor) == synced_elsewhere and hidden(vendor) == []
    assert before != synced_elsewhere


@pytest.mark.parametrize("leftover", [".megatron_lm_7617.sync-old", ".megatron_lm_7617.sync-new-x"])
def test_leftovers_of_a_finished_sync_are_removed(
    tool: Tool, upstream: Upstream, vendor: Path, leftover: str
) -> None:
    shutil.copytree(vendor / "megatron_lm_7617", vendor / leftover)
    assert tool(*sync_args(upstream)).code == 0
    assert hidden(vendor) == []
    assert manifest(vendor)["synced_sha"] == upstream.merge


def test_ctrl_c_during_the_swap_is_held_until_both_files_are_in(
    tool: Tool,
    upstream: Upstream,
    vendor: Path,
    synced_elsewhere: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = os.rename

    def rename(src: Any, dst: Any) -> None:
        if Path(src).name == "megatron_lm_7617":  # the folder is being set aside
            signal.raise_signal(signal.SIGINT)
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    handler = signal.getsignal(signal.SIGINT)  # SIG_IGN under nohup or `cmd &`
    run = tool(*sync_args(upstream))
    assert run.code == 130 and run.err.count("\n") == 1, run.err
    assert "interrupted after the swap: wrote tilelang_dsa.py and UPSTREAM.toml" in run.err
    assert visible(vendor) == synced_elsewhere and hidden(vendor) == []
    assert signal.getsignal(signal.SIGINT) is handler  # restored
