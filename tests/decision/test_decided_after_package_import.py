"""A backport watched in a module that megatron's own import brings in is decided once that
import has finished, not inside it: there, the package's other modules are partially
initialised and a sniff importing a name of one of them meets a circular import.

Seen with #6624: ``import megatron.core.tensor_parallel.layers`` with no proof in the store
ran its sniff while ``megatron.core.extensions.transformer_engine`` was half executed, and
called it ``incompatible`` ("vendor lacks the fix").
"""

import json
import os
import subprocess
import sys
import textwrap
from types import ModuleType

import pytest

from backports.megatron.interpreter import import_hooks

KEY = "tests:after-package-import"


@pytest.fixture
def package(tmp_path, monkeypatch) -> str:
    """``pkg_after``: its ``__init__`` imports ``inner`` first, then defines ``LATE``."""
    name = "pkg_after_package_import"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("from . import inner\nLATE = 'defined'\n")
    (folder / "inner.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [m for m in sys.modules if m.partition(".")[0] == name]:
        del sys.modules[module]
    import_hooks.unregister(KEY)


def _watch(package: str, deferred: bool) -> list[object]:
    seen: list[object] = []

    def decide(module: ModuleType) -> None:
        seen.append(getattr(sys.modules[package], "LATE", "missing"))

    def on_import(module: ModuleType) -> None:
        if not (deferred and import_hooks.after_package_import(module, decide)):
            decide(module)

    import_hooks.register(f"{package}.inner", KEY, on_import)
    return seen


def test_a_callback_put_off_sees_the_package_whole(package):
    seen = _watch(package, deferred=True)
    __import__(package)
    assert seen == ["defined"]


def test_the_control_inside_the_import_sees_it_half_done(package):
    seen = _watch(package, deferred=False)
    __import__(package)
    assert seen == ["missing"]


def test_nothing_in_progress_calls_now(package):
    __import__(package)
    del sys.modules[f"{package}.inner"]
    seen = _watch(package, deferred=True)
    __import__(f"{package}.inner")  # its package already whole: decided at once
    assert seen == ["defined"]


_JOB = """
import json
from backports.megatron import apply
from backports.megatron.api import last_report
apply(only="megatron-lm-6624")
import megatron.core.tensor_parallel.layers as layers
report = last_report("megatron-lm-6624")
backward = layers.LinearWithGradAccumulationAndAsyncCommunication.backward
print("SEEN " + json.dumps({
    "verdict": str(report.verdict), "action": str(report.action), "reason": report.reason,
    "installed": getattr(backward, "__backport__", None),
}))
"""


@pytest.mark.slow
def test_6624_imported_with_megatron_and_no_proof_is_installed(tmp_path):
    """A fresh interpreter, the store off (no proof): #6624 is decided after megatron's import
    and installed (it was ``incompatible``: a circular import inside the sniff)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    environ["MEGATRON_BACKPORTS_CACHE"] = "0"
    environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_JOB)],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("SEEN ")]
    seen = json.loads(line[5:])
    assert seen["verdict"] == "needed", seen["reason"]
    assert (seen["action"], seen["installed"]) == ("installed", "megatron-lm-6624")
