"""tools/sync_upstream.py on a plugin's vendored folder (``backports new`` lays it out).

The plugin is scaffolded for megatron-core 0.19.2's ``megatron.core.utils.divide``; its
upstream is a repository the test writes with gitpython (its ``divide`` is written here,
not copied): the base commit asserts, the pull request's head raises a ValueError that
names both numbers and reads a module global (``_NOT_DIVISIBLE``) at call time. A sync
writes only what the plugin's own sniff proved: before the plugin is installed here it
cannot run, so the sync is refused (or forced); installed, it proves the head and refuses
the base.
"""

import hashlib
import importlib
import os
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

from backports.megatron import catalog, cli
from tests.authoring.test_plugin_install import OBSERVE
from tests.paths import ROOT
from tests.sync.upstreams import (
    commit_files,
    load_module,
    snapshot,
)
from tests.vendored.test_vendored import documented_digest

sys.path.insert(0, str(ROOT / "tools"))

import sync_upstream

# Clones under a temporary cache, off $HOME; the sniff in-process (tests/sync/conftest.py).
pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")

ID = "acme-9999"
PR = "9999"
PATH = "megatron/core/utils.py"

BASE = '''\
"""Test stand-in for upstream's megatron/core/utils.py (written for these tests)."""


def ensure_divisibility(numerator, denominator):
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"


def divide(numerator, denominator):
    ensure_divisibility(numerator, denominator)
    return numerator // denominator
'''

FIXED = '''\
"""Test stand-in for upstream's megatron/core/utils.py (written for these tests)."""

_NOT_DIVISIBLE = "{} is not divisible by {}"


def ensure_divisibility(numerator, denominator):
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"


def divide(numerator, denominator):
    """Raise ValueError, not AssertionError (asserts vanish under python -O)."""
    if denominator == 0 or numerator % denominator:
        raise ValueError(_NOT_DIVISIBLE.format(numerator, denominator))
    return numerator // denominator
'''


@dataclass(frozen=True)
class Plugin:
    root: Path
    vendor: Path  # what --vendor-dir takes
    folder: Path  # the backport's vendored folder
    upstream: Path
    base: str
    head: str


@pytest.fixture
def plugin(tmp_path: Path) -> Plugin:
    upstream = tmp_path / "upstream"
    repo = git.Repo.init(upstream)
    base = commit_files(repo, {PATH: BASE}, "base", None)
    head = commit_files(repo, {PATH: FIXED}, "divide: ValueError", base)
    git.Reference.create(repo, f"refs/pull/{PR}/head", head)
    root = tmp_path / "acme-plugin"
    args = ["--id", ID, "--pr", PR, "--repo", str(upstream), "--sha", head]
    assert (
        cli.main(["new", *args, "--target", "megatron.core.utils:divide", "--dest", str(root)]) == 0
    )
    vendor = root / "acme_9999_backport" / "vendor"
    return Plugin(root, vendor, vendor / "acme_9999", upstream, base, head)


Tool = Callable[..., tuple[int, str, str]]


@pytest.fixture
def tool(plugin: Plugin, capsys: pytest.CaptureFixture[str]) -> Tool:
    capsys.readouterr()

    def run(*args: str) -> tuple[int, str, str]:
        code = sync_upstream.main([*args, "--vendor-dir", str(plugin.vendor)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def manifest(plugin: Plugin) -> dict[str, object]:
    return tomllib.loads((plugin.folder / "UPSTREAM.toml").read_text())


@pytest.fixture
def installed(plugin: Plugin) -> Iterator[Plugin]:
    """The plugin with its sniff written (as tests/authoring/test_plugin_install.py writes it),
    registered as an installed distribution is: a dist-info with its entry point, on
    sys.path, where this process's catalog (and so the sniff of a sync) finds it."""
    entry = plugin.root / "acme_9999_backport" / "entry.py"
    text = entry.read_text()
    start, end = text.index("def _observe("), text.index("def _sniff(")
    entry.write_text(text[:start] + OBSERVE + "\n\n" + text[end:])
    info = plugin.root / "acme_9999_backport-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-9999-backport\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        f"[megatron_backports]\n{ID} = acme_9999_backport.entry:SPEC\n"
    )
    sys.path.insert(0, str(plugin.root))
    importlib.invalidate_caches()
    catalog.reload()
    yield plugin
    sys.path.remove(str(plugin.root))
    importlib.invalidate_caches()
    catalog.reload()
    for name in [n for n in sys.modules if n.split(".")[0] == "acme_9999_backport"]:
        del sys.modules[name]


def test_the_scaffolded_folder_passes_check_as_written(plugin: Plugin, tool: Tool) -> None:
    code, out, _ = tool("--check")
    assert code == 0 and "ok: 1 vendored folder" in out


def test_a_plugin_not_installed_here_is_refused_not_synced_unsniffed(
    plugin: Plugin, tool: Tool
) -> None:
    """docs/adding-a-backport.md installs the plugin before its first sync: without it, the
    sniff cannot run here, and code nobody proved is never written (issue 33, item 5)."""
    before = snapshot(plugin.folder)
    code, out, err = tool("--backport", ID, "--pr", PR)
    assert code == 1, (out, err)
    assert "+++ b/vendor/acme_9999/utils.py" in out  # the diff, shown first
    assert f"{ID} is not in this environment's catalog" in err
    assert "install it first, or --force" in err and "nothing written" in err
    assert err.count("\n") == 1
    assert snapshot(plugin.folder) == before


def test_force_writes_a_plugin_not_installed_here_saying_so(plugin: Plugin, tool: Tool) -> None:
    code, out, err = tool("--backport", ID, "--pr", PR, "--force")
    assert code == 0, err
    assert "warning: not sniffed:" in out and "writing it anyway (--force)" in out
    assert manifest(plugin)["synced_sha"] == plugin.head
    assert tool("--check")[0] == 0


def test_a_sync_refreshes_the_installed_plugins_folder_from_its_own_repo(
    installed: Plugin, tool: Tool, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = installed
    # The head reads a module global 0.19.2 lacks (its Target would list it in helpers):
    # here the live target module has it, as a release with the helper would.
    import megatron.core.utils

    monkeypatch.setattr(megatron.core.utils, "_NOT_DIVISIBLE", "{} / {}", raising=False)
    code, out, err = tool("--backport", ID, "--pr", PR)  # repo: the manifest's, no --repo
    assert code == 0, err
    assert f"{ID}: the sniff shows the fix at {plugin.head}" in out
    text = (plugin.folder / "utils.py").read_text()
    assert "raise ValueError(_live_target()._NOT_DIVISIBLE.format(numerator, denominator))" in text
    data = manifest(plugin)
    assert data["origin"] == "synced" and data["synced_sha"] == plugin.head
    assert data["reads"] == ["_NOT_DIVISIBLE"]
    assert data["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert data["files_sha256"] == documented_digest(plugin.folder)
    assert "synced_repo" not in data  # it came from the repo the manifest names
    assert f"{ID}: the catalog declares no local changes" in out  # installed: it knows
    # The scaffold's comments in UPSTREAM.toml survive (tomlkit).
    assert "--rehash" in (plugin.folder / "UPSTREAM.toml").read_text()
    # The synced function runs, reading the live target module's global.
    module = load_module(plugin.folder / "utils.py", "acme_synced_utils")
    sys.modules["acme_live_target"] = type(sys)("acme_live_target")
    sys.modules["acme_live_target"]._NOT_DIVISIBLE = "live {} / {}"  # type: ignore[attr-defined]
    module.__target_module__ = "acme_live_target"
    try:
        with pytest.raises(ValueError, match="live 7 / 2"):
            module.divide(7, 2)
        assert module.divide(8, 2) == 4
    finally:
        del sys.modules["acme_live_target"]
    assert tool("--check")[0] == 0


def test_the_installed_plugins_sniff_refuses_the_commit_before_the_fix(
    installed: Plugin, tool: Tool
) -> None:
    before = snapshot(installed.folder)
    code, _, err = tool("--backport", ID, "--sha", installed.base)
    assert code == 1 and "would not carry the fix; the sniff saw:" in err, err
    assert snapshot(installed.folder) == before


def test_check_names_a_hand_edit_of_the_plugins_file(plugin: Plugin, tool: Tool) -> None:
    stub = plugin.folder / "utils.py"
    stub.write_text(stub.read_text() + "# edited\n")
    code, out, _ = tool("--check")
    assert code == 1 and "drifted: vendored " in out
    assert "vendor/acme_9999/utils.py has sha256 " in out
    assert f"backports sync --backport {ID} --rehash" in out  # handwritten: the fix, named


def test_rehash_records_the_plugins_handwritten_replacement(plugin: Plugin, tool: Tool) -> None:
    stub = plugin.folder / "utils.py"
    stub.write_text(stub.read_text().replace("raise NotImplementedError", "return 0  #"))
    assert tool("--check")[0] == 1
    code, _, err = tool("--backport", ID, "--rehash")
    assert code == 0, err
    assert manifest(plugin)["sha256"] == hashlib.sha256(stub.read_bytes()).hexdigest()
    assert tool("--check")[0] == 0


def test_a_failed_swap_leaves_the_plugins_old_pair(
    plugin: Plugin, tool: Tool, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(plugin.folder)
    real = os.rename
    calls: list[str] = []

    def second_rename_fails(src: object, dst: object) -> None:
        calls.append(str(dst))
        if len(calls) == 2:  # the staged copy into the folder's place
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", second_rename_fails)
    code, _, err = tool("--backport", ID, "--pr", PR, "--force")
    assert code == 2 and "No space left on device" in err and err.count("\n") == 1
    monkeypatch.setattr(os, "rename", real)
    assert snapshot(plugin.folder) == before
    assert sorted(p.name for p in plugin.vendor.iterdir() if p.name.startswith(".")) == []
    assert tool("--check")[0] == 0


def test_a_killed_sync_is_put_right_in_the_plugins_folder(plugin: Plugin, tool: Tool) -> None:
    before = snapshot(plugin.folder)
    os.rename(plugin.folder, plugin.vendor / ".acme_9999.sync-old")  # killed after step one
    code, out, _ = tool("--check")
    assert code == 1 and "leftover: .acme_9999.sync-old" in out
    code, out, err = tool("--backport", ID, "--sha", plugin.head, "--force")
    assert code == 0, err
    assert "put acme_9999/ back" in out
    assert manifest(plugin)["synced_sha"] == plugin.head
    assert set(snapshot(plugin.folder)) == set(before)
