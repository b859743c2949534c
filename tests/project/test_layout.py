"""The repository's layering: ``tests/`` may use anything; nothing else may use ``tests/``.

The package, tools and benchmarks run where no test tree exists (an installed wheel, a GPU
host's copy), so a helper they share with the tests lives in ``backports.megatron.testing``
or ``tools/``.
"""

import ast
from pathlib import Path

from tests.paths import ROOT


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_nothing_outside_tests_imports_tests() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("backports", "tools", "benchmarks", "vendor")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "tests" in _imported_roots(path)
    ]
    assert offenders == []


def _package_imports(path: Path) -> set[str]:
    """The ``backports.megatron`` modules ``path`` (a module of that package) imports."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found |= {module} if node.module else {f"{module}.{a.name}" for a in node.names}
    return {name for name in found if name.startswith("backports.megatron")}


def test_the_interpreter_mechanisms_import_nothing_of_ours() -> None:
    """The one import finder and say-once-per-job are the ground floor of job start: they
    know neither the catalog, the kinds nor the api, which use them (standard library only:
    the start-up path loads them before anything of megatron)."""
    folder = ROOT / "backports" / "megatron" / "interpreter"
    reached = {
        f"{path.name}: {name}"
        for path in sorted(folder.glob("*.py"))
        for name in _package_imports(path)
        if not name.startswith("backports.megatron.interpreter")
    }
    assert len(list(folder.glob("*.py"))) >= 3 and reached == set()
