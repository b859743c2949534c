"""The catalog is found, not registered: every ``catalog/<id with underscores>.py`` that
defines ``SPEC`` is a builtin, its defaults derived from the id, and README has a section
for each. The drop-in test copies the installed layout, adds an entry module and a vendored
folder under a new id (copies of #7091's), and finds it in ``status`` and ``check``."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from backports.megatron import catalog, model
from backports.megatron.catalog import CATALOG
from tests.conftest import skip_environment_plugins
from tests.paths import ROOT

CATALOG_DIR = ROOT / "backports" / "megatron" / "catalog"
README_SECTION = re.compile(r"^### `(megatron-lm-\d+)`", re.M)


def _entry_modules() -> list[Path]:
    return sorted(p for p in CATALOG_DIR.glob("*.py") if not p.name.startswith("_"))


def _defines_spec(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SPEC" for t in node.targets)
        for node in tree.body
    )


def test_every_module_that_defines_spec_is_a_builtin_under_its_own_id():
    expected = {p.stem for p in _entry_modules() if _defines_spec(p)}
    assert {model.module_name_of(spec.id) for spec in CATALOG} == expected
    assert len({spec.id for spec in CATALOG}) == len(CATALOG)
    for spec in CATALOG:
        assert getattr(catalog, model.module_name_of(spec.id).upper()) is spec


def test_builtins_come_newest_pull_request_first():
    numbers = [int(spec.id.rpartition("-")[2]) for spec in CATALOG]
    assert numbers == sorted(numbers, reverse=True)


def test_an_unknown_upper_case_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="MEGATRON_LM_1"):
        _ = catalog.MEGATRON_LM_1


def test_no_entry_defines_its_own_exception_class():
    """One shared ``SniffFailed``: an entry's sniff raises it, never a class of its own."""
    for path in _entry_modules():
        classes = [
            node.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)
            and any(getattr(b, "id", "").endswith(("Error", "Exception")) for b in node.bases)
        ]
        assert classes == [], path.name


def test_the_model_types_are_the_ones_catalog_and_catalog_spec_hand_out():
    from backports.megatron.catalog import spec as old_address

    for name in ("BackportSpec", "SniffResult", "Target", "VendoredRef"):
        assert getattr(catalog, name) is getattr(model, name) is getattr(old_address, name)


def _spec(**fields):
    target = model.Target("megatron-core", ("megatron.core.a.kernels",), "K.run", ("self",))
    base = dict(
        id="megatron-lm-1234",
        title="t",
        targets=(target,),
        target_since=Version("0.19"),
        fixed_in=None,
        sniff=lambda targets: model.SniffResult(False, "s"),
    )
    return model.BackportSpec(**{**base, **fields})


def test_what_an_entry_leaves_out_is_derived_from_its_id():
    spec = _spec()
    assert spec.vendored == model.VendoredRef(
        "backports.megatron._vendor.megatron_lm_1234", "kernels", "run"
    )
    assert spec.delete_when_landed == (
        "Delete vendor/megatron_lm_1234/ and backports/megatron/catalog/megatron_lm_1234.py."
    )
    partial = _spec(vendored=model.VendoredRef(module="other"), delete_when_landed="Drop it.")
    assert partial.vendored.module == "other" and partial.vendored.attribute == "run"
    assert partial.delete_when_landed == "Drop it."
    given = model.VendoredRef("acme.vendor.x", "m", "f")
    assert _spec(vendored=given).vendored is given


def test_readme_has_a_section_for_every_builtin_and_none_for_another():
    sections = README_SECTION.findall((ROOT / "README.md").read_text())
    assert sorted(sections) == sorted(spec.id for spec in CATALOG)


def _installed_copy(site: Path) -> None:
    """This tree as a wheel lays it out: ``vendor/`` inside the package as ``_vendor``."""
    junk = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "backports", site / "backports", ignore=junk)
    shutil.copytree(ROOT / "vendor", site / "backports" / "megatron" / "_vendor", ignore=junk)


def _drop_in(site: Path, source_id: str, new_id: str) -> None:
    """A new entry module and vendored folder: copies of ``source_id``'s under ``new_id``."""
    old, new = model.module_name_of(source_id), model.module_name_of(new_id)
    package = site / "backports" / "megatron"
    text = (package / "catalog" / f"{old}.py").read_text()
    assert f'id="{source_id}"' in text
    (package / "catalog" / f"{new}.py").write_text(text.replace(source_id, new_id))
    shutil.copytree(package / "_vendor" / old, package / "_vendor" / new)
    manifest = package / "_vendor" / new / "UPSTREAM.toml"
    manifest.write_text(manifest.read_text().replace(f'id = "{source_id}"', f'id = "{new_id}"'))


@pytest.mark.slow
def test_a_new_entry_module_and_vendored_folder_are_all_a_builtin_needs(tmp_path):
    site = tmp_path / "site"
    _installed_copy(site)
    _drop_in(site, "megatron-lm-7091", "megatron-lm-9999")
    packages = [sysconfig.get_paths()["purelib"]]
    packages += [p for p in sys.path if p.endswith("site-packages") and p not in packages]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MEGATRON_"))}
    env |= {"PYTHONPATH": os.pathsep.join([str(site), *packages]), "MEGATRON_BACKPORTS_CACHE": "0"}
    env |= skip_environment_plugins()  # what it judges are the builtins

    def backports(*args: str, **extra: str) -> tuple[int, list[dict[str, Any]]]:
        # -S: no .pth files, so this checkout's editable install cannot stand in for the copy.
        command = [sys.executable, "-S", "-m", "backports.megatron", *args, "--json"]
        done = subprocess.run(
            command, cwd=tmp_path, env=env | extra, capture_output=True, text=True, timeout=300
        )
        assert done.stdout.startswith("["), done.stdout + done.stderr
        return done.returncode, json.loads(done.stdout)

    code, rows = backports("status")
    assert code == 0
    by_id = {row["id"]: row for row in rows}
    assert by_id["megatron-lm-9999"]["verdict"] == "needed"
    # The same target: the newer entry installs first, and status says the other never does.
    shadowed = by_id["megatron-lm-7091"]
    assert shadowed["verdict"] == "incompatible" and "megatron-lm-9999" in shadowed["reason"]
    assert [row["id"] for row in rows].count("megatron-lm-9999") == 1
    vendored = by_id["megatron-lm-9999"]["evidence"]["vendored"]
    assert vendored["ok"] and Path(vendored["folder"]) == site / "backports/megatron/_vendor" / (
        "megatron_lm_9999"
    )
    # Two entries on one function cannot both install: the copy's original steps aside.
    code, checked = backports("check", MEGATRON_BACKPORTS_SKIP="megatron-lm-7091")
    assert [row["id"] for row in checked].count("megatron-lm-9999") == 1
    assert code == 0, checked
    assert {row["id"]: row for row in checked}["megatron-lm-9999"]["check"]["ok"] is True
