"""docs/api.md is the public face: every name it lists imports from its module, and the
``__all__`` of the package and of the catalog is exactly what it lists (a new public name is
documented, or it is not public)."""

import importlib
import re

import pytest

from tests.paths import ROOT

API = ROOT / "docs" / "api.md"
_ROW = re.compile(r"^\| `(backports\.megatron[\w.]*)` \| (.+?) \| .+ \|$")


def _listed() -> dict[str, set[str]]:
    listed: dict[str, set[str]] = {}
    for line in API.read_text(encoding="utf-8").splitlines():
        row = _ROW.match(line)
        if row:
            names = set(re.findall(r"`(\w+)`", row.group(2)))
            listed.setdefault(row.group(1), set()).update(names)
    return listed


def test_the_page_lists_the_modules_the_design_promises():
    assert set(_listed()) == {
        "backports.megatron",
        "backports.megatron.catalog",
        "backports.megatron.testing",
        "backports.megatron.vendored",
        "backports.megatron.cli",
        "backports.megatron.private_globals",
        "backports.megatron.ray_workers",
        "backports.megatron._apply_for_pytest",
    }


@pytest.mark.parametrize("module_name", sorted(_listed()))
def test_every_listed_name_imports_from_its_module(module_name):
    module = importlib.import_module(module_name)
    missing = sorted(n for n in _listed()[module_name] if not hasattr(module, n))
    assert missing == []


@pytest.mark.parametrize("module_name", ["backports.megatron", "backports.megatron.catalog"])
def test_all_is_exactly_the_listed_face(module_name):
    listed = {n for n in _listed()[module_name] if not n.startswith("_")}
    assert set(importlib.import_module(module_name).__all__) == listed
