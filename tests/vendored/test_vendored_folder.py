"""backports/megatron/vendored/: one model of a vendored folder.

The code that runs is the code the hash covers: a ``.pyc`` left in ``__pycache__`` (an
unchecked-hash one, which the import system never compares with its source) or an
extension module named like a vendored file would be imported in its place; the loader runs
the hashed ``.py`` bytes instead (issue 33, item 13). One drift message names the installed
command; the one writer writes a new manifest without tomlkit and edits one with it.
"""

import dataclasses
import importlib
import importlib.machinery
import py_compile
import shutil
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from backports.megatron import Action, Verdict, apply, catalog
from backports.megatron.catalog import MEGATRON_LM_7617, BackportSpec
from backports.megatron.testing.fake_kernel import FakeSparseMLA
from backports.megatron.vendored import (
    Integrity,
    ManifestError,
    VendoredFolder,
    check_integrity,
    drift_reason,
    parse_upstream,
    read_upstream,
    render_upstream,
    vendored_module,
)
from tests.conftest import BACKPORT_ID
from tests.paths import ROOT
from tests.reports import report_for
from tests.vendored.test_vendored import documented_digest

MODULE = "tilelang_dsa"
# What the planted files say instead of the vendored source.
PLANTED_SOURCE = "PLANTED = True\nfused_sparse_mla_absorbed = 'the planted bytecode'\n"


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for copies of vendor/ (each its own importable package)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("planted_")]:
        del sys.modules[name]


def copy_of_7617(packages: Path, name: str) -> Path:
    """vendor/ copied to ``<packages>/<name>``; its #7617 folder, no ``__pycache__``."""
    shutil.copytree(ROOT / "vendor", packages / name, ignore=shutil.ignore_patterns("__pycache__"))
    importlib.invalidate_caches()
    return packages / name / "megatron_lm_7617"


def plant_pyc(folder: Path, module: str) -> None:
    """An unchecked-hash ``.pyc`` of other code where an import of ``module`` looks first."""
    other = folder.parent / f"{module}-other.py"
    other.write_text(PLANTED_SOURCE)
    cached = importlib.util.cache_from_source(str(folder / f"{module}.py"))
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    py_compile.compile(str(other), cfile=cached, doraise=True, invalidation_mode=mode)
    other.unlink()


def plant_extension(folder: Path, module: str) -> Path:
    """A file named as the extension module an import of ``module`` prefers to its ``.py``."""
    path = folder / f"{module}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    path.write_bytes(b"not an ELF file: whoever imports it fails\n")
    return path


def ref_of(folder: Path) -> catalog.VendoredRef:
    return dataclasses.replace(
        MEGATRON_LM_7617.vendored, package=f"{folder.parent.name}.{folder.name}"
    )


def test_a_planted_unchecked_pyc_is_what_a_plain_import_would_run(packages: Path) -> None:
    """The control: the plant works, so what the loader does below is what guards it."""
    folder = copy_of_7617(packages, "planted_control")
    plant_pyc(folder, MODULE)
    plant_pyc(folder, "__init__")
    module = importlib.import_module(f"planted_control.megatron_lm_7617.{MODULE}")
    assert module.fused_sparse_mla_absorbed == "the planted bytecode"
    assert sys.modules["planted_control.megatron_lm_7617"].PLANTED is True


def test_the_loader_runs_the_hashed_source_not_a_planted_pyc(packages: Path) -> None:
    folder = copy_of_7617(packages, "planted_pyc")
    plant_pyc(folder, MODULE)
    plant_pyc(folder, "__init__")
    ref = ref_of(folder)
    assert check_integrity(ref, read_upstream(ref)).ok  # the recorded hashes stay valid
    module = vendored_module(ref)
    assert callable(module.fused_sparse_mla_absorbed)
    assert not hasattr(module, "PLANTED")
    assert not hasattr(sys.modules[ref.package], "PLANTED")  # the package's own __init__
    assert module.__file__ == str(folder / f"{MODULE}.py")


def test_an_extension_module_named_like_a_vendored_file_is_never_loaded(packages: Path) -> None:
    control = copy_of_7617(packages, "planted_so_control")
    plant_extension(control, MODULE)
    with pytest.raises(ImportError):  # a plain import takes the extension first
        importlib.import_module(f"planted_so_control.megatron_lm_7617.{MODULE}")
    folder = copy_of_7617(packages, "planted_so")
    plant_extension(folder, MODULE)
    plant_extension(folder, "__init__")
    ref = ref_of(folder)
    assert check_integrity(ref, read_upstream(ref)).ok
    assert callable(vendored_module(ref).fused_sparse_mla_absorbed)


def test_the_loader_writes_nothing_beside_the_vendored_files(packages: Path) -> None:
    folder = copy_of_7617(packages, "planted_clean")
    before = sorted(p.name for p in folder.iterdir())
    vendored_module(ref_of(folder))
    assert sorted(p.name for p in folder.iterdir()) == before  # no __pycache__


def test_apply_installs_the_hashed_source_beside_a_planted_pyc(
    packages: Path,
    tilelang_dsa: object,
    fake_kernel: FakeSparseMLA,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = copy_of_7617(packages, "planted_apply")
    plant_pyc(folder, MODULE)
    entry: BackportSpec = dataclasses.replace(MEGATRON_LM_7617, vendored=ref_of(folder))
    monkeypatch.setattr(catalog, "CATALOG", (entry,))
    report = report_for(apply(upstream_only=True), BACKPORT_ID)
    assert report.verdict is Verdict.NEEDED and report.action is Action.INSTALLED, report.reason
    installed = sys.modules[f"planted_apply.megatron_lm_7617.{MODULE}"]
    assert not hasattr(installed, "PLANTED")


# ---- one drift message ----------------------------------------------------------------------

OK = Integrity("f.py", "a" * 64, "a" * 64, "/v/vendor/x", "b" * 64, "b" * 64)


@pytest.mark.parametrize(
    "integrity, says",
    [
        (dataclasses.replace(OK, actual="c" * 64), "vendored /v/vendor/x/f.py has sha256 cccc"),
        (dataclasses.replace(OK, actual="", file_error="No such file"), "cannot be read"),
        (dataclasses.replace(OK, expected=""), "has no sha256 for f.py"),
        (dataclasses.replace(OK, files_expected=""), "has no files_sha256"),
        (dataclasses.replace(OK, files_actual="d" * 64), "has files_sha256 dddd"),
    ],
)
@pytest.mark.parametrize(
    "origin, fix",
    [
        ("handwritten", "backports sync --backport acme-1 --rehash"),
        ("synced", "re-sync it (backports sync --backport acme-1 --sha SHA)"),
    ],
)
def test_one_drift_message_names_the_installed_command(
    integrity: Integrity, says: str, origin: str, fix: str
) -> None:
    reason = drift_reason(integrity, "acme-1", origin)
    assert reason is not None and says in reason and fix in reason
    assert "tools/" not in reason and "\n" not in reason


def test_no_drift_no_message() -> None:
    assert drift_reason(OK, "acme-1", "synced") is None


# ---- the folder model and the one writer ----------------------------------------------------


def test_a_folder_reads_as_the_probe_and_the_sync_read_it() -> None:
    folder = VendoredFolder.read(ROOT / "vendor" / "megatron_lm_7617")
    assert folder.id == "megatron-lm-7617" and folder.file.name == "tilelang_dsa.py"
    assert folder.shown("x.py") == "vendor/megatron_lm_7617/x.py"
    assert folder.integrity().files_actual == documented_digest(folder.path)
    assert folder.manifest == read_upstream(MEGATRON_LM_7617.vendored)


VALID = {
    "id": "acme-1",
    "repo": "https://github.com/o/r.git",
    "pr": 1,
    "head_sha": "a" * 40,
    "path": "megatron/core/x.py",
    "symbol": ["f", "C.m"],
    "file": "x.py",
    "sha256": "0" * 64,
    "origin": "handwritten",
    "origin_note": 'quotes " and \\ and `backticks` {braces}',
    "head_unknown": True,
    "decorators": {"C.m": ["jit_fuser"]},
    "symbol_paths": {"C.m": "megatron/core/y.py"},
    "files_sha256": "1" * 64,
}


def test_a_new_manifest_is_written_without_tomlkit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tomlkit", None)  # `import tomlkit` raises ImportError
    text = render_upstream("# a comment head\n", VALID)  # type: ignore[arg-type]
    assert text.startswith("# a comment head\nid = ")
    assert tomllib.loads(text) == VALID
    assert parse_upstream(text, "t") == VALID
    with pytest.raises(ManifestError, match="needs tomlkit"):
        render_upstream(text, {**VALID, "pr": 2})  # type: ignore[arg-type]


def test_an_edit_keeps_comments_and_order() -> None:
    text = render_upstream("# a comment head\n", VALID)  # type: ignore[arg-type]
    commented = text.replace("pr = 1", "pr = 1  # the PR")
    edited = render_upstream(commented, {**VALID, "pr": 2})  # type: ignore[arg-type]
    assert "pr = 2  # the PR\n" in edited and edited.startswith("# a comment head\nid = ")
    assert list(tomllib.loads(edited)) == list(tomllib.loads(text))  # tables last, kept so
    assert tomllib.loads(edited) == {**VALID, "pr": 2}


def test_the_writer_refuses_what_the_schema_refuses() -> None:
    with pytest.raises(ManifestError, match="pr must be a positive integer"):
        render_upstream("", {**VALID, "pr": "1"})  # type: ignore[arg-type]
