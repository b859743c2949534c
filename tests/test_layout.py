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
