"""backports/megatron/vendored/ and the probe's integrity check: what is loaded is checked.

``UPSTREAM.toml`` names one file (``file``, hashed as ``sha256``), while the loader imports
the vendored module by name and the package's ``__init__.py`` with it. ``files_sha256``
covers every ``.py`` file of the folder, so an edit anywhere an import can reach refuses
the backport, whichever file ``file`` names. Each test works on a copy of vendor/,
importable as its own package, and checks what ``apply()`` does with it on real
megatron-core 0.19.2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from backports.megatron import Action, BackportWarning, Verdict, apply, catalog
from backports.megatron.catalog import MEGATRON_LM_7617, BackportSpec
from backports.megatron.testing.fake_kernel import FakeSparseMLA
from backports.megatron.vendored import python_files_digest
from tests.conftest import BACKPORT_ID
from tests.deciding import early as probe_without_import
from tests.paths import ROOT
from tests.reports import report_for

PACKAGE = "integrity_vendor"


def documented_digest(folder: Path) -> str:
    """files_sha256 as documented, computed here: per ``*.py`` file directly in the folder,
    sorted by name, ``name NUL sha256-hex LF``; the sha256 of all of that."""
    lines = sorted(
        f"{path.name}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n"
        for path in folder.iterdir()
        if path.suffix == ".py" and path.is_file()
    )
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """vendor/ copied to ``<tmp>/integrity_vendor``; its backport folder."""
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT / "vendor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield copy / "megatron_lm_7617"
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


@pytest.fixture
def spec(folder: Path, monkeypatch: pytest.MonkeyPatch) -> BackportSpec:
    """The real catalog entry, reading its vendored code from the copy."""
    vendored = dataclasses.replace(MEGATRON_LM_7617.vendored, package=f"{PACKAGE}.megatron_lm_7617")
    entry = dataclasses.replace(MEGATRON_LM_7617, vendored=vendored)
    monkeypatch.setattr(catalog, "CATALOG", (entry,))
    return entry


def edit_manifest(folder: Path, old: str, new: str) -> None:
    path = folder / "UPSTREAM.toml"
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_python_files_digest_is_the_documented_one(tmp_path: Path) -> None:
    (tmp_path / "b.py").write_text("b = 1\n")
    (tmp_path / "a.py").write_text("a = 1\n")
    (tmp_path / "UPSTREAM.toml").write_text("id = 'x'\n")  # not code: not covered
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text("c = 1\n")  # not this folder's module
    digest = python_files_digest(tmp_path)
    assert digest == documented_digest(tmp_path)
    (tmp_path / "UPSTREAM.toml").write_text("id = 'y'\n")
    (tmp_path / "sub" / "c.py").write_text("c = 2\n")
    assert python_files_digest(tmp_path) == digest
    (tmp_path / "a.py").write_text("a = 2\n")
    assert python_files_digest(tmp_path) != digest


def test_this_repositorys_vendored_folder_is_intact(spec: BackportSpec, folder: Path) -> None:
    result = probe_without_import(spec)
    assert result.verdict is None  # nothing refused before the target is probed
    vendored = result.evidence["vendored"]
    assert vendored["ok"] is True
    assert vendored["files_sha256"] == documented_digest(folder)
    assert vendored["expected_files_sha256"] == vendored["files_sha256"]
    manifest = tomllib.loads((ROOT / "vendor" / "megatron_lm_7617" / "UPSTREAM.toml").read_text())
    assert manifest["files_sha256"] == documented_digest(ROOT / "vendor" / "megatron_lm_7617")


def test_an_edit_outside_the_named_file_is_refused(
    spec: BackportSpec, folder: Path, tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA
) -> None:
    """``file`` pointed at ``__init__.py`` with that file's hash, ``tilelang_dsa.py`` (the
    module the loader imports) edited: refused, and nothing installed."""
    manifest = tomllib.loads((folder / "UPSTREAM.toml").read_text())
    init_hash = hashlib.sha256((folder / "__init__.py").read_bytes()).hexdigest()
    edit_manifest(folder, 'file = "tilelang_dsa.py"', 'file = "__init__.py"')
    edit_manifest(folder, manifest["sha256"], init_hash)
    module = folder / "tilelang_dsa.py"
    module.write_text(module.read_text() + "\nEDITED = True\n")
    original = tilelang_dsa.fused_sparse_mla_absorbed

    with pytest.warns(BackportWarning, match="files_sha256"):
        report = report_for(apply(), BACKPORT_ID)

    assert report.verdict is Verdict.INCOMPATIBLE and report.action is not Action.INSTALLED
    assert f"vendored folder {folder} has files_sha256" in report.reason
    assert "a .py file in it was edited without backports sync" in report.reason
    assert report.evidence["vendored"]["ok"] is False
    assert tilelang_dsa.fused_sparse_mla_absorbed is original
    assert f"{PACKAGE}.megatron_lm_7617.tilelang_dsa" not in sys.modules  # never loaded


def test_the_same_manifest_without_the_edit_installs(
    spec: BackportSpec, folder: Path, tilelang_dsa: ModuleType, fake_kernel: FakeSparseMLA
) -> None:
    """The control: pointing ``file`` elsewhere is not itself what is refused."""
    manifest = tomllib.loads((folder / "UPSTREAM.toml").read_text())
    init_hash = hashlib.sha256((folder / "__init__.py").read_bytes()).hexdigest()
    edit_manifest(folder, 'file = "tilelang_dsa.py"', 'file = "__init__.py"')
    edit_manifest(folder, manifest["sha256"], init_hash)
    report = report_for(apply(), BACKPORT_ID)
    assert report.verdict is Verdict.NEEDED and report.action is Action.INSTALLED, report.reason


@pytest.mark.parametrize("name", ["__init__.py", "helpers.py"])
def test_an_edited_or_added_module_is_refused(spec: BackportSpec, folder: Path, name: str) -> None:
    path = folder / name
    path.write_text((path.read_text() if path.exists() else "") + "import os\n")
    result = probe_without_import(spec)
    assert result.verdict is Verdict.INCOMPATIBLE
    assert f"vendored folder {folder} has files_sha256" in result.reason


def test_a_manifest_without_files_sha256_is_refused(spec: BackportSpec, folder: Path) -> None:
    path = folder / "UPSTREAM.toml"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if not line.startswith("files_sha256")))
    result = probe_without_import(spec)
    assert result.verdict is Verdict.INCOMPATIBLE
    assert "is not a valid UPSTREAM.toml: files_sha256 is missing" in result.reason


# ---- the manifest's schema (issue 12, item 8) -----------------------------------------------


@pytest.mark.parametrize(
    "old, new, says",
    [
        ("reads = ", "reads = 5\nold_reads = ", "reads must be a list of Python names, not 5"),
        ("reads = ", 'reads = "SparseMLA"\nold_reads = ', "reads must be a list of Python names"),
        ("pr = 7617", 'pr = "7617"', "pr must be a positive integer, not '7617'"),
        ('file = "tilelang_dsa.py"', 'file = "../x.py"', "file must be a .py file name"),
        ('origin = "handwritten"', 'origin = "copied"', "origin must be one of"),
        # A merged pull request must name its head (#7617's merge SHA is unverified, so the
        # folder records none; one is given here).
        ("head_sha = ", f'merge_sha = "{"a" * 40}"\nold_head = ', "head_sha is missing"),
    ],
)
def test_a_malformed_manifest_is_one_clear_incompatible_reason(
    spec: BackportSpec, folder: Path, old: str, new: str, says: str
) -> None:
    if old == "reads = " and "reads = " not in (folder / "UPSTREAM.toml").read_text():
        path = folder / "UPSTREAM.toml"
        path.write_text(path.read_text() + 'reads = ["SparseMLA"]\n')
    edit_manifest(folder, old, new)
    with pytest.warns(BackportWarning):
        report = report_for(apply(), BACKPORT_ID)
    assert report.verdict is Verdict.INCOMPATIBLE
    assert "not a valid UPSTREAM.toml" in report.reason and says in report.reason
    assert "edited without" not in report.reason  # not blamed on the vendored file


def test_an_empty_manifest_is_called_empty(spec: BackportSpec, folder: Path) -> None:
    (folder / "UPSTREAM.toml").write_text("")
    result = probe_without_import(spec)
    assert result.verdict is Verdict.INCOMPATIBLE
    assert "not a valid UPSTREAM.toml: it is empty" in result.reason


def test_status_cli_on_a_malformed_manifest_exits_cleanly(
    spec: BackportSpec, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from backports.megatron import cli

    edit_manifest(folder, "pr = 7617", "pr = [1]")
    code = cli.main(["status"])
    out = capsys.readouterr().out
    assert code in (0, 1)  # incompatible is a verdict, not a crash
    assert "pr must be a positive integer" in out
