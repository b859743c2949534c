"""Version evidence comes from each target's own distribution (``Target.distribution``),
never from a hard-coded "megatron-core"."""

import dataclasses
import importlib.metadata
from pathlib import Path

import pytest

from backports.megatron.catalog import CATALOG, MEGATRON_LM_7091
from backports.megatron.evidence import versions
from backports.megatron.evidence.one_look import one_look
from backports.megatron.evidence.versions import installed_version
from backports.megatron.report import Verdict
from tests.deciding import early as probe_without_import
from tests.deciding import probe


def _with_distribution(spec, name):
    targets = tuple(dataclasses.replace(t, distribution=name) for t in spec.targets)
    return dataclasses.replace(spec, targets=targets)


def test_another_installed_distribution_is_found_by_its_target_modules():
    info = installed_version("packaging", ("packaging.version",))
    import packaging

    assert str(info.version) == importlib.metadata.version("packaging")
    assert info.package == "packaging" and info.source == "metadata"
    assert info.package_dir == Path(packaging.__file__).resolve().parent


def test_megatron_cores_package_comes_from_the_targets_modules():
    info = installed_version("megatron-core", MEGATRON_LM_7091.target.modules)
    assert info.package == "megatron.core" and str(info.version) == "0.19.2"


def test_the_probe_reads_the_entrys_own_distribution(tilelang_dsa):
    spec = _with_distribution(MEGATRON_LM_7091, "torch")
    result = probe(spec)
    torch_version = importlib.metadata.version("torch")
    assert result.evidence["distribution"]["name"] == "torch"
    assert result.evidence["distribution"]["version"] == torch_version
    assert result.verdict is Verdict.NEEDED
    assert result.reason.startswith(f"torch {torch_version} lacks the fix")
    assert result.evidence["git"] == {"checkout": False, "note": "torch not found on sys.path"}


def test_an_entry_whose_distribution_is_not_installed_is_absent():
    spec = _with_distribution(MEGATRON_LM_7091, "no-such-distribution")
    (target,) = spec.targets
    spec = dataclasses.replace(
        spec, targets=(dataclasses.replace(target, modules=("no_such_package.module",)),)
    )
    result = probe_without_import(spec)
    assert result.verdict is Verdict.ABSENT
    assert result.reason == "no-such-distribution is not installed"


def test_without_metadata_a_source_tree_of_the_targets_is_read():
    """Not installed, but the target modules' package is on sys.path (as a checkout on
    PYTHONPATH is): its package_info.py gives the version."""
    result = probe_without_import(_with_distribution(MEGATRON_LM_7091, "no-such-distribution"))
    info = result.evidence["distribution"]
    assert (info["source"], info["version"], info["package"]) == (
        "package_info",
        "0.19.2",
        "megatron.core",
    )


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_every_entry_reports_its_own_distribution(spec):
    early = probe_without_import(spec)
    assert early.evidence["distribution"]["name"] == spec.target.distribution
    assert early.evidence["distribution"]["package"] is not None
    assert early.evidence["vendored"]["ok"], early.evidence["vendored"]


def _fake_distribution(site: Path, name: str, record: str | None, files: str = "") -> None:
    """A dist-info (with RECORD) or an egg-info (with SOURCES.txt) for ``name`` in ``site``."""
    if record is not None:
        info = site / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "RECORD").write_text(record)
    else:
        info = site / f"{name}-1.0.egg-info"
        info.mkdir(parents=True)
        (info / "SOURCES.txt").write_text(files)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")


def test_the_packages_a_distribution_owns_come_from_its_record(tmp_path, monkeypatch):
    """Packages (folders with __init__.py) as RECORD lists them, files on disk or not, a
    quoted CSV path included; module files and a top-level __init__.py are not packages."""
    record = (
        "zpkg/__init__.py,sha256=x,1\n"
        "zpkg/sub/__init__.py,,\n"
        '"zpkg/we,ird/__init__.py",,\n'
        "zpkg/mod.py,,\n"
        "__init__.py,,\n"
        "zpkg-1.0.dist-info/RECORD,,\n"
    )
    _fake_distribution(tmp_path, "zpkg", record)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert versions._own_packages(*versions.installed_distribution("zpkg")) == [
        "zpkg",
        "zpkg.sub",
        "zpkg.we,ird",
    ]


def test_without_record_the_listed_files_are_read(tmp_path, monkeypatch):
    files = "zpkg/__init__.py\nzpkg/deep/__init__.py\nzpkg/deep/x.py\n"
    _fake_distribution(tmp_path, "zpkg", None, files)
    for name in files.split():  # importlib.metadata lists only the files that exist
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert versions._own_packages(*versions.installed_distribution("zpkg")) == ["zpkg", "zpkg.deep"]


def test_the_version_evidence_never_lists_the_installed_files(monkeypatch):
    """``Distribution.files`` stats every RECORD row (~1,100 for megatron-core, ~14 ms),
    and the probe reads the version once per target in every process that imports
    megatron: with RECORD at hand it is never needed."""

    def refuse(self):
        raise AssertionError("Distribution.files was read")

    monkeypatch.setattr(importlib.metadata.Distribution, "files", property(refuse))
    for spec in CATALOG:
        info = installed_version(spec.target.distribution, spec.target.modules)
        # The megatron-core wheel ships megatron.core and megatron.training (#6321's target).
        package = ".".join(spec.target.modules[0].split(".")[:2])
        assert package in ("megatron.core", "megatron.training")
        assert info.package == package and str(info.version) == "0.19.2"


def _count_metadata_reads(monkeypatch) -> list[str]:
    read: list[str] = []
    real = importlib.metadata.version

    def counting(name):
        read.append(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", counting)
    return read


def test_one_apply_reads_megatron_cores_metadata_once(monkeypatch):
    """Every entry's version evidence comes from megatron-core: one apply() reads its
    METADATA once (~1.5 ms a read), whichever entries it probes."""
    from backports.megatron import api

    read = _count_metadata_reads(monkeypatch)
    try:
        api.apply()
    finally:
        api.revert()
    assert read.count("megatron-core") == 1, read
    read.clear()
    api.status()
    assert read.count("megatron-core") == 1, read


def test_outside_one_look_every_call_reads_afresh(monkeypatch):
    """A process may install another release between two calls: nothing is kept past
    the block."""
    spec = CATALOG[0]
    with one_look():
        first = installed_version(spec.target.distribution, spec.target.modules)
        monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.20.0")
        assert installed_version(spec.target.distribution, spec.target.modules) == first
        with one_look():  # nested: the outer block's reads still hold
            assert installed_version(spec.target.distribution).version == first.version
    assert str(installed_version(spec.target.distribution, spec.target.modules).version) == (
        "0.20.0"
    )


def test_a_context_copied_inside_a_block_reads_afresh_after_it(monkeypatch):
    """An asyncio task or ``copy_context().run`` started inside a block keeps its context
    past the block's exit: the reads it finds there are then closed."""
    import contextvars

    spec = CATALOG[0]
    with one_look():
        installed_version(spec.target.distribution, spec.target.modules)
        copied = contextvars.copy_context()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.20.0")
    info = copied.run(installed_version, spec.target.distribution, spec.target.modules)
    assert str(info.version) == "0.20.0"
