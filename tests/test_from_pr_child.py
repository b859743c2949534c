"""The folder the derivation's children take this package from."""

import sys
import types
from pathlib import Path

from backports.megatron.authoring.from_pr.child import package_root


def test_the_package_root_is_found_whatever_stands_as_backports(monkeypatch):
    """setuptools vendors a ``backports`` package of its own; once imported it may stand in
    ``sys.modules["backports"]`` (seen in the full slow run): ``import backports.megatron``
    then binds a module without ``megatron``."""
    stand_in = types.ModuleType("backports")
    stand_in.__path__ = []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "backports", stand_in)
    assert package_root() == Path(__file__).resolve().parents[1]
