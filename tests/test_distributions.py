"""Version evidence comes from each target's own distribution (``Target.distribution``),
never from a hard-coded "megatron-core"."""

import dataclasses
import importlib.metadata
from pathlib import Path

import pytest

from backports.megatron.catalog import CATALOG, MEGATRON_LM_7091
from backports.megatron.probe import probe, probe_without_import
from backports.megatron.report import Verdict
from backports.megatron.versions import installed_version


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
