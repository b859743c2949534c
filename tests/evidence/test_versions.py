"""What was imported, not what was installed (issue 12, item 12).

A Megatron-LM source checkout first on ``PYTHONPATH`` shadows the installed megatron-core
0.19.2: the probe must report the checkout's version and say that it differs.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from backports.megatron.evidence.versions import installed_version

CHECKOUT_INFO = "MAJOR = 0\nMINOR = 20\nPATCH = 0\nPRE_RELEASE = 'rc0'\n"

_SCRIPT = textwrap.dedent(
    """
    import json
    from backports.megatron.catalog import MEGATRON_LM_7617
    from backports.megatron.evidence.versions import describe, installed_version
    info = installed_version("megatron-core").to_dict()
    print(json.dumps({"info": info, "text": describe("megatron-core", info)}))
    """
)


def _run(tmp_path: Path, with_checkout: bool) -> dict:
    core = tmp_path / "checkout" / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "package_info.py").write_text(CHECKOUT_INFO)
    env = {"PYTHONPATH": str(tmp_path / "checkout")} if with_checkout else {}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**_base_env(), **env},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_checkout_first_on_the_path_is_reported_with_its_own_version(tmp_path: Path) -> None:
    seen = _run(tmp_path, with_checkout=True)
    assert seen["info"]["version"] == "0.20.0rc0"
    assert seen["info"]["source"] == "package_info"
    assert seen["info"]["package_dir"] == str((tmp_path / "checkout/megatron/core").resolve())
    assert seen["info"]["distribution_version"] == "0.19.2"
    assert seen["text"].startswith("megatron-core 0.20.0rc0 (imported from ")
    assert "the installed megatron-core distribution is 0.19.2" in seen["text"]


def test_the_installed_distribution_alone_is_reported_plainly(tmp_path: Path) -> None:
    seen = _run(tmp_path, with_checkout=False)
    assert seen["info"]["version"] == "0.19.2" and seen["info"]["source"] == "metadata"
    assert seen["info"]["distribution_version"] is None
    assert seen["text"] == "megatron-core 0.19.2"


def test_in_this_process_the_imported_code_is_the_distributions() -> None:
    info = installed_version("megatron-core")
    assert str(info.version) == "0.19.2" and info.distribution_version is None


def test_a_package_an_editable_finder_serves_is_found_without_importing_it(tmp_path, monkeypatch):
    """`pip install -e` of a Megatron-LM checkout puts a finder on ``sys.meta_path``, no
    folder on ``sys.path``: the package's folder is asked of the finders, name by name, and
    nothing of it runs (issue 36: git ancestry said "not found on sys.path")."""
    import importlib.machinery
    import importlib.util

    from backports.megatron.evidence import versions

    checkout = tmp_path / "Megatron-LM"
    (checkout / "edpkg" / "core").mkdir(parents=True)
    (checkout / "edpkg" / "__init__.py").write_text("raise RuntimeError('ran')\n")
    (checkout / "edpkg" / "core" / "__init__.py").write_text("raise RuntimeError('ran')\n")

    class EditableFinder:  # what setuptools' editable finder does for its packages
        @staticmethod
        def find_spec(name, path=None, target=None):  # type: ignore[no-untyped-def]
            if name == "edpkg":
                return importlib.util.spec_from_file_location(
                    name,
                    checkout / "edpkg" / "__init__.py",
                    submodule_search_locations=[str(checkout / "edpkg")],
                )
            return importlib.machinery.PathFinder.find_spec(name, path)

    monkeypatch.setattr(sys, "meta_path", [EditableFinder, *sys.meta_path])
    assert versions._package_dir("edpkg.core") == (checkout / "edpkg" / "core").resolve()
    assert "edpkg" not in sys.modules and "edpkg.core" not in sys.modules
    assert versions._package_dir("edpkg.nothing") is None
