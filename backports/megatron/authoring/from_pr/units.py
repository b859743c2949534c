"""Map a line of a Python module to the unit a backport would carry, and tag its shape.

The unit of a line is the innermost ``def``/``class`` around it, widened to what can be
swapped: a module-level function, or a method of a top-level class (a nested def is part of
its function). A line in a class body outside its methods is the class's body; a line in no
def or class is a module statement (an import, an assignment, a comment).
"""

import ast
import functools
import warnings
from dataclasses import dataclass

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COMPILED = ("jit_fuser", "torch.compile", "torch.jit.script", "compile")
_TRITON = ("triton.jit", "triton.autotune", "triton.heuristics")


@dataclass(frozen=True)
class Scope:
    qualname: str
    node: ast.AST
    first: int  # its first line, decorators included
    last: int
    parents: tuple[ast.AST, ...]


@dataclass(frozen=True)
class Unit:
    """What a changed line belongs to: ``qualname`` and its shape (``kind``, ``tags``)."""

    qualname: str
    kind: str
    tags: tuple[str, ...]
    inner: str | None = None  # the nested def the line is in, when it is not the unit


def _first_line(node: ast.AST) -> int:
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    first = int(getattr(node, "lineno", 1))
    return min([first, *(d.lineno for d in decorators)])


def _scopes(tree: ast.Module) -> list[Scope]:
    found: list[Scope] = []

    def walk(node: ast.AST, prefix: str, parents: tuple[ast.AST, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (*_DEFS, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append(Scope(name, child, _first_line(child), end, parents))
                walk(child, f"{name}.", (*parents, child))
            else:
                walk(child, prefix, parents)

    walk(tree, "", ())
    return found


def _imports_from(tree: ast.Module, module_prefix: str) -> set[str]:
    """Names the module binds by ``from <module_prefix>... import name``."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(module_prefix):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _decorator_tags(node: ast.AST, tree: ast.Module) -> list[str]:
    tags = []
    texts = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
    triton_names = _imports_from(tree, "triton")
    for text in texts:
        head = text.split("(")[0]
        if head in ("staticmethod", "classmethod", "property"):
            tags.append(head)
        elif any(head.startswith(t) for t in _TRITON) or head in triton_names:
            tags.append("Triton kernel")
        elif any(marker in head for marker in _COMPILED):
            tags.append("jit_fuser/torch.compile")
        elif "custom_bwd" in head or "custom_fwd" in head:
            tags.append(f"@{head}")
    return tags


def _is_autograd_function(cls: ast.ClassDef, tree: ast.Module) -> bool:
    bases = [ast.unparse(b) for b in cls.bases]
    plain = "Function" in _imports_from(tree, "torch.autograd")
    return any(b.endswith("autograd.Function") or (plain and b == "Function") for b in bases)


def _function_unit(scope: Scope, tree: ast.Module) -> Unit:
    node = scope.node
    assert isinstance(node, _DEFS)
    owner = scope.parents[-1] if scope.parents else None
    tags = _decorator_tags(node, tree)
    if owner is None:
        kind, tags = "function", ["function", *tags]
    elif len(scope.parents) == 1 and isinstance(owner, ast.ClassDef):
        kind, tags = "method", ["method", *tags]
        if node.name in ("__init__", "__post_init__"):
            tags.append("constructor")
        if node.name in ("forward", "backward", "setup_context") and _is_autograd_function(
            owner, tree
        ):
            tags.append(f"autograd.Function {node.name}")
    else:
        kind, tags = "nested class method", ["method of a nested class", *tags]
    if "Triton kernel" in tags:
        kind = "Triton kernel"  # a kernel object, not a function a swap can replace
    return Unit(scope.qualname, kind, tuple(dict.fromkeys(tags)))


def _import_around(stmt: ast.stmt, line: int) -> ast.stmt | None:
    """The import ``line`` is in: ``stmt`` itself, or one inside its ``try``/``if`` (an
    optional import): either binds a name, which the vendored code reads or repeats."""
    imports = [n for n in ast.walk(stmt) if isinstance(n, ast.Import | ast.ImportFrom)]
    return next((n for n in imports if n.lineno <= line <= (n.end_lineno or n.lineno)), None)


def _statement_unit(stmt: ast.stmt, line: int) -> Unit:
    imported = _import_around(stmt, line)
    if imported is not None:
        return Unit(f"<import:{imported.lineno}>", "import", ("import",))
    names = []
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    for target in targets:
        if isinstance(target, ast.Name):
            names.append(target.id)
    if names:
        return Unit(names[0], "module statement", ("module-level statement",))
    return Unit(f"<module:{line}>", "module statement", ("module-level statement",))


@dataclass
class UnitMap:
    """The units of one module's text; ``unit(line)`` for any line."""

    tree: ast.Module
    scopes: list[Scope]

    def scope(self, qualname: str) -> Scope | None:
        return next((s for s in self.scopes if s.qualname == qualname), None)

    def unit(self, line: int) -> Unit:
        around = [s for s in self.scopes if s.first <= line <= s.last]
        if not around:
            stmt = next(
                (s for s in self.tree.body if _first_line(s) <= line <= (s.end_lineno or 0)),
                None,
            )
            if stmt is None:
                return Unit("<comment>", "comment", ("comment or blank line",))
            return _statement_unit(stmt, line)
        innermost = max(around, key=lambda s: len(s.parents))
        outer = [s for s in around if isinstance(s.node, _DEFS)]
        if not outer:  # a class body, outside its methods
            cls = innermost
            tags = ["class body"]
            if any("dataclass" in ast.unparse(d) for d in getattr(cls.node, "decorator_list", [])):
                tags.append("dataclass field")
            return Unit(cls.qualname, "class body", tuple(tags))
        unit_scope = min(outer, key=lambda s: len(s.parents))
        unit = _function_unit(unit_scope, self.tree)
        if innermost is not unit_scope:
            return Unit(unit.qualname, unit.kind, unit.tags, innermost.qualname)
        return unit


@functools.lru_cache(maxsize=16)  # read only; `candidates` maps one file's text many times
def map_units(text: str) -> UnitMap:
    """``text`` parsed; a SyntaxError propagates (the caller names the file). Quietly:
    upstream's invalid escapes (a SyntaxWarning) are not the user's to read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        tree = ast.parse(text)
    return UnitMap(tree, _scopes(tree))


def segment(text: str, units: UnitMap, qualname: str) -> str | None:
    """The lines of ``qualname`` (decorators included) in ``text``, or None."""
    scope = units.scope(qualname)
    if scope is not None:
        return "".join(text.splitlines(keepends=True)[scope.first - 1 : scope.last])
    for stmt in units.tree.body:  # a module-level assignment
        if units.unit(stmt.lineno).qualname == qualname and not isinstance(
            stmt, ast.Import | ast.ImportFrom
        ):
            last = stmt.end_lineno or stmt.lineno
            return "".join(text.splitlines(keepends=True)[stmt.lineno - 1 : last])
    return None
