"""``--check`` (the vendored files against UPSTREAM.toml, as CI runs it) and ``--rehash``
(a handwritten folder recorded as it is).

The upstream each test builds: tests/sync/upstreams.py; the fixtures (the tool run in this
process): tests/sync/conftest.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.sync.upstreams import (
    BACKPORT,
    FOLDERS,
    Tool,
    Upstream,
    expect_error,
    folder_digest,
    manifest,
    sync_pr_head,
    vendored_text,
)

pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")


def test_check_passes_on_a_clean_sync_and_names_a_hand_edit(
    tool: Tool, upstream: Upstream, vendor: Path
) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    clean = tool("--check")
    assert clean.code == 0 and f"ok: {FOLDERS} vendored folder(s)" in clean.out
    path = vendor / "megatron_lm_7617" / "tilelang_dsa.py"
    path.write_text(path.read_text().replace("return None  # no TileLang", "return None  #"))
    edited = tool("--check")
    assert edited.code == 1
    assert "drifted: vendored " in edited.out
    assert "vendor/megatron_lm_7617/tilelang_dsa.py has sha256 " in edited.out
    assert f"backports sync --backport {BACKPORT} --sha SHA" in edited.out  # synced: re-sync


@pytest.mark.parametrize("name", ["__init__.py", "extra.py"])
def test_check_covers_every_py_file_of_the_folder(tool: Tool, vendor: Path, name: str) -> None:
    """An edit to a module the loader may import, other than the named file, is drift."""
    assert tool("--check").code == 0
    path = vendor / "megatron_lm_7617" / name
    path.write_text((path.read_text() if path.exists() else "") + "# edited\n")
    run = tool("--check")
    assert run.code == 1
    assert "drifted: vendored folder " in run.out
    assert "vendor/megatron_lm_7617 has files_sha256 " in run.out
    assert "tilelang_dsa.py has sha256" not in run.out
    assert f"backports sync --backport {BACKPORT} --rehash" in run.out  # handwritten


def test_check_refuses_a_file_key_pointed_at_another_file(tool: Tool, vendor: Path) -> None:
    """``file`` at __init__.py with that file's hash, tilelang_dsa.py edited: drift."""
    folder = vendor / "megatron_lm_7617"
    path = folder / "UPSTREAM.toml"
    init_hash = hashlib.sha256((folder / "__init__.py").read_bytes()).hexdigest()
    text = path.read_text().replace('file = "tilelang_dsa.py"', 'file = "__init__.py"')
    path.write_text(text.replace(manifest(vendor)["sha256"], init_hash))
    (folder / "tilelang_dsa.py").write_text(vendored_text(vendor) + "# edited\n")
    run = tool("--check")
    assert run.code == 1 and "vendor/megatron_lm_7617 has files_sha256 " in run.out


def test_check_names_a_manifest_without_files_sha256(tool: Tool, vendor: Path) -> None:
    path = vendor / "megatron_lm_7617" / "UPSTREAM.toml"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if not line.startswith("files_sha256")))
    run = tool("--check")
    assert run.code == 1 and "has no files_sha256" in run.out


def test_check_names_a_missing_vendored_file(tool: Tool, vendor: Path) -> None:
    (vendor / "megatron_lm_7617" / "tilelang_dsa.py").unlink()
    run = tool("--check", "--backport", BACKPORT)
    says = "vendor/megatron_lm_7617/tilelang_dsa.py cannot be read (No such file or directory)"
    assert run.code == 1 and says in run.out


def test_check_on_this_repository_as_ci_runs_it() -> None:
    run = subprocess.run(
        [sys.executable, "tools/sync_upstream.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"ok: {FOLDERS} vendored folder(s) match their UPSTREAM.toml" in run.stdout


def test_the_script_reports_an_error_with_status_2(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "sync_upstream.py"),
            "--backport",
            BACKPORT,
            "--sha",
            "not-hex",
            "--vendor-dir",
            str(ROOT / "vendor"),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert run.returncode == 2
    assert "sync_upstream.py: error: --sha must be 4 to 40 hex digits" in run.stderr


def test_rehash_records_a_handwritten_folder_as_it_is(tool: Tool, vendor: Path) -> None:
    folder = vendor / "megatron_lm_7617"
    assert tool("--backport", BACKPORT, "--rehash").out.endswith("nothing written\n")
    init = folder / "__init__.py"
    init.write_text(init.read_text() + "# a docstring fix\n")
    (folder / "tilelang_dsa.py").write_text(vendored_text(vendor) + "# reworded\n")
    assert tool("--check").code == 1
    before = manifest(vendor)
    dry = tool("--backport", BACKPORT, "--rehash", "--dry-run")
    assert dry.code == 0 and "+files_sha256 = " in dry.out and manifest(vendor) == before
    run = tool("--backport", BACKPORT, "--rehash")
    assert run.code == 0, run.err
    assert "wrote UPSTREAM.toml in vendor/megatron_lm_7617/" in run.out
    after = manifest(vendor)
    assert after["sha256"] == hashlib.sha256((folder / "tilelang_dsa.py").read_bytes()).hexdigest()
    assert after["files_sha256"] == folder_digest(folder)
    changed = {key for key in after if after[key] != before[key]}
    assert changed == {"sha256", "files_sha256"}  # nothing else: not a sync
    assert tool("--check").code == 0


def test_this_repositorys_handwritten_folder_is_rehashed() -> None:
    """The committed hashes are what the tool records (no hand-edited hash)."""
    data = tomllib.loads((ROOT / "vendor" / "megatron_lm_7617" / "UPSTREAM.toml").read_text())
    assert data["origin"] == "handwritten"
    assert data["files_sha256"] == folder_digest(ROOT / "vendor" / "megatron_lm_7617")


def test_rehash_refuses_synced_code(tool: Tool, upstream: Upstream, vendor: Path) -> None:
    assert sync_pr_head(tool, upstream).code == 0
    path = vendor / "megatron_lm_7617" / "tilelang_dsa.py"
    path.write_text(path.read_text() + "# a local tweak\n")
    expect_error(tool, vendor, "--backport", BACKPORT, "--rehash", says="re-sync synced code")
