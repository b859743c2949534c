"""One name, one thing: no submodule of ``backports.megatron`` shares a public name.

Importing a submodule binds it on the package under its name, so a submodule named like a
public function (``manifest`` once) turns ``backports.megatron.manifest()`` into
"'module' object is not callable" for the rest of the process.
"""

import importlib
import pkgutil
from types import ModuleType

import backports.megatron as package


def test_no_submodule_is_named_like_a_public_name():
    submodules = {info.name for info in pkgutil.iter_modules(package.__path__)}
    assert "api" in submodules  # the listing works
    assert submodules.isdisjoint(package.__all__)


def test_public_names_survive_importing_every_submodule():
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    for name in package.__all__:
        assert not isinstance(getattr(package, name), ModuleType), name
    assert set(package.manifest()) >= {"megatron_backports", "megatron_core", "backports"}
