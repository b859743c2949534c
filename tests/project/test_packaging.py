"""The distribution: a PEP 420 `backports` namespace, vendored code inside our package only."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from backports.megatron.catalog import CATALOG
from tests.paths import ROOT


def _run(*args, cwd, env=None, timeout=300):
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _isolated_env(*paths):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # Build from a clean copy: setuptools reuses a build/ folder left in the source tree,
    # which would hide a package missing from pyproject.toml.
    source = tmp_path_factory.mktemp("source") / "src"
    junk = (".git", ".venv*", "build", "*.egg-info", ".whl-*", "__pycache__", ".*_cache")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*junk))
    out = tmp_path_factory.mktemp("wheel")
    _run(
        "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source, cwd=out
    )
    (path,) = out.glob("megatron_backports-*.whl")
    return path


@pytest.mark.slow
def test_wheel_ships_vendor_inside_the_package_and_no_namespace_init(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "backports/megatron/_vendor/megatron_lm_7617/tilelang_dsa.py" in names
    assert "backports/megatron/_vendor/megatron_lm_7617/UPSTREAM.toml" in names
    assert "backports/megatron/py.typed" in names
    assert "backports/__init__.py" not in names
    top_level = {name.split("/")[0] for name in names if not name.endswith(".dist-info/")}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"backports"}


def _vendored_files(spec):
    """What the wheel must hold for ``spec``: its vendor/<id>/ .py files and UPSTREAM.toml,
    listed from the source folder (not from the package list the build used)."""
    folder = ROOT / "vendor" / spec.vendored.package.rpartition(".")[2]
    names = [*sorted(p.name for p in folder.glob("*.py")), "UPSTREAM.toml"]
    return [f"backports/megatron/_vendor/{folder.name}/{name}" for name in names]


@pytest.mark.slow
@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_wheel_ships_every_catalog_entrys_vendored_folder(wheel, spec):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = _vendored_files(spec)
    assert len(expected) >= 3  # __init__.py, the vendored module, UPSTREAM.toml
    assert [name for name in expected if name not in names] == []
    assert f"backports/megatron/catalog/{spec.id.replace('-', '_')}.py" in names


@pytest.mark.slow
def test_plain_install_finds_the_vendored_code(wheel, tmp_path):
    target = tmp_path / "site"
    _run("-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel, cwd=tmp_path)
    script = (
        "import backports.megatron as bm, importlib.util\n"
        "from backports.megatron.catalog import MEGATRON_LM_7617 as spec\n"
        "from backports.megatron.decision.early import early_evidence\n"
        "import backports.megatron.api, backports.megatron.catalog.spec\n"
        f"assert bm.__file__.startswith({str(target)!r}), bm.__file__\n"
        "assert importlib.util.find_spec('vendor') is None\n"
        "result = early_evidence(spec)\n"
        "assert result.evidence['vendored']['ok'], result.evidence\n"
        "print(result.evidence['vendored']['sha256'])\n"
    )
    # -S: no site-packages .pth files, so the development install's editable finder cannot
    # fill in what the wheel lacks; the venv's packages are still importable by path.
    site_packages = sysconfig.get_paths()["purelib"]
    # And those this interpreter's .pth path lines add (a light venv over a main venv).
    extra = [p for p in sys.path if p.endswith("site-packages") and p != site_packages]
    env = _isolated_env(target, site_packages, *extra)
    out = _run("-S", "-c", script, cwd=tmp_path, env=env)
    assert len(out.strip()) == 64


def test_development_install_finds_the_vendored_code():
    from importlib.resources import files

    manifest = files("backports.megatron._vendor.megatron_lm_7617") / "UPSTREAM.toml"
    assert manifest.is_file()


def test_another_backports_portion_still_imports(tmp_path):
    """`backports` is a namespace: e.g. backports.zoneinfo-style packages live beside ours."""
    other = tmp_path / "other-site" / "backports" / "other_fix"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("VALUE = 'other'\n")
    script = (
        "import backports.other_fix, backports.megatron\n"
        "assert backports.other_fix.VALUE == 'other'\n"
        "assert callable(backports.megatron.apply)\n"
        "print(len(list(__import__('backports').__path__)))\n"
    )
    paths = [tmp_path / "other-site", *sys.path[1:]]
    out = _run("-c", script, cwd=tmp_path, env=_isolated_env(*paths))
    assert int(out) >= 2
