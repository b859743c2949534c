"""``backports.megatron`` stays reachable as an attribute of ``backports`` after megatron's
import: setuptools (which megatron imports through torch.utils.cpp_extension) pops
``sys.modules["backports"]`` at its import, and the namespace found afresh lacked it."""

import subprocess
import sys

from tests.paths import ROOT

_AFTER_SETUPTOOLS = """
import sys
sys.path.insert(0, sys.argv[1])
import backports.megatron
import setuptools  # pops sys.modules["backports"] (pypa/setuptools#4476)
assert "backports" not in sys.modules or sys.modules["backports"].megatron
import backports.megatron
print(backports.megatron.status.__module__)
import backports.tarfile  # setuptools' vendored namespace member still imports
print(backports.tarfile.__name__)
"""


def test_import_backports_megatron_after_setuptools_reaches_the_package() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", _AFTER_SETUPTOOLS, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["backports.megatron.api", "backports.tarfile"]
