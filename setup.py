"""The package list, found rather than written down: ``backports.megatron`` and its
sub-packages, and every ``vendor/<id>/`` as ``backports.megatron._vendor.<id>``.

A catalog entry's vendored folder ships in the wheel without an edit here or in
pyproject.toml (which holds everything else, including ``package-dir``).
"""

from setuptools import find_packages, setup

_PACKAGE = "backports.megatron"
_VENDOR = f"{_PACKAGE}._vendor"

setup(
    packages=[
        _PACKAGE,
        *(f"{_PACKAGE}.{name}" for name in find_packages("backports/megatron")),
        _VENDOR,
        *(f"{_VENDOR}.{name}" for name in find_packages("vendor")),
    ]
)
