"""The repository's layering: ``tests/`` may use anything; nothing else may use ``tests/``.

The package, tools and benchmarks run where no test tree exists (an installed wheel, a GPU
host's copy), so a helper they share with the tests lives in ``backports.megatron.testing``
or ``tools/``.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def test_activation_imports_nothing_above_it() -> None:
    """The activation mechanism (hook file, triggers, post-import finder, once per job) is
    the ground floor of job start: it knows neither the catalog nor the api, which import
    it. Only the errors module, the package's ground, is below it."""
    folder = ROOT / "backports" / "megatron" / "activation"
    allowed = ("backports.megatron.activation", "backports.megatron.errors")
    reached = {
        f"{path.name}: {name}"
        for path in sorted(folder.glob("*.py"))
        for name in _package_imports(path)
        if not name.startswith(allowed)
    }
    assert len(list(folder.glob("*.py"))) >= 5 and reached == set()
