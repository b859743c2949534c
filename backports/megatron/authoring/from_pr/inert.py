"""Changes that do nothing at run time: dropped from what a backport carries, and listed.

A unit whose code is the same on both sides once docstrings are dropped (and, in a plain
class body, bare annotations such as ``x: int``, which bind nothing) changed only its
docstrings, comments, blank lines or annotations. Carrying it would make a one-line fix a
many-symbol backport for nothing; refusing it (a module docstring's whitespace is a
"module statement") would refuse the fix. ``why_inert`` says which, or None.
"""

import ast
import textwrap
import warnings

from .units import UnitMap, segment

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# Bases and decorators that turn a class body's annotations into fields or a schema.
_ANNOTATIONS_MATTER = ("dataclass", "NamedTuple", "TypedDict", "BaseModel", "attr", "Struct")


def _is_string(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _is_plain(cls: ast.ClassDef) -> bool:
    """Whether the class body's bare annotations bind nothing (no dataclass, no schema)."""
    texts = [ast.unparse(node) for node in [*cls.decorator_list, *cls.bases, *cls.keywords]]
    return not any(word in text for text in texts for word in _ANNOTATIONS_MATTER)


def _without_noise(node: ast.AST) -> ast.AST:
    """``node`` with every docstring dropped, and a plain class's bare annotations."""
    for inner in ast.walk(node):
        if not isinstance(inner, _DOCUMENTED):
            continue
        body = [stmt for stmt in inner.body if not _is_string(stmt)]
        if isinstance(inner, ast.ClassDef) and _is_plain(inner):
            body = [s for s in body if not (isinstance(s, ast.AnnAssign) and s.value is None)]
        inner.body = body or [ast.Pass()]
    return node


def _parse(text: str) -> ast.Module:
    """``text`` (a unit's lines) parsed, quietly: upstream's invalid escapes are not ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(textwrap.dedent(text))


def _code(text: str) -> str | None:
    """The code of ``text`` (a unit's lines), noise dropped, as a comparable dump."""
    try:
        tree = _parse(text)
    except (SyntaxError, RecursionError, MemoryError):
        return None
    return ast.dump(_without_noise(tree))


def same_code(a: str, b: str) -> bool:
    """Whether two texts of one unit are the same code once docstrings are dropped."""
    code = _code(a)
    return code is not None and code == _code(b)


def _docstrings(text: str) -> list[str]:
    tree = _parse(text)
    nodes = [n for n in ast.walk(tree) if isinstance(n, _DOCUMENTED)]
    return [ast.get_docstring(n, clean=False) or "" for n in nodes]


def _class_body(text: str, units: UnitMap, qualname: str) -> str | None:
    """The class's own statements (its methods are units of their own)."""
    scope = units.scope(qualname)
    if scope is None or not isinstance(scope.node, ast.ClassDef):
        return None
    cls = scope.node
    kept = [s for s in cls.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
    shell = ast.ClassDef(
        cls.name, cls.bases, cls.keywords, kept or [ast.Pass()], cls.decorator_list, []
    )
    return ast.unparse(ast.fix_missing_locations(shell))


def _why_same(old: str, new: str) -> str | None:
    before, after = _code(old), _code(new)
    if before is None or before != after:
        return None
    if _docstrings(old) != _docstrings(new):
        return "docstring only"
    if ast.dump(_parse(old)) != ast.dump(_parse(new)):
        return "bare annotation in a plain class only"
    return "comments or blank lines only"


def _statement_at(units: UnitMap, line: int) -> ast.stmt | None:
    return next(
        (s for s in units.tree.body if s.lineno <= line <= (s.end_lineno or s.lineno)), None
    )


def why_inert(
    qualname: str,
    kind: str,
    old: tuple[str, UnitMap] | None,
    new: tuple[str, UnitMap] | None,
    sides: tuple[bool, bool] = (True, True),
) -> str | None:
    """Why the change to ``qualname`` is inert, or None. ``old`` and ``new``: the module's
    text and units on each side; ``sides``: on which side the diff touched it."""
    if old is None or new is None:
        return None  # added or removed: never inert
    if qualname.startswith("<module:"):  # an unnamed statement ("<module:L>"): a string?
        line = int(qualname.removeprefix("<module:").removesuffix(">"))
        touched = [units for (_, units), seen in zip((old, new), sides, strict=True) if seen]
        found = [_statement_at(units, line) for units in touched]
        if found and all(s is not None and _is_string(s) for s in found):
            return "module docstring only"
        return None

    if kind == "class body":
        texts = [_class_body(text, units, qualname) for text, units in (old, new)]
    else:
        texts = [segment(text, units, qualname) for text, units in (old, new)]
    if texts[0] is None or texts[1] is None:
        return None
    return _why_same(texts[0], texts[1])


def _assigned_name(stmt: ast.stmt) -> str | None:
    """``NAME`` of ``NAME = value`` / ``NAME: T = value`` (one plain name), else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return stmt.target.id if isinstance(stmt.target, ast.Name) else None
    return None


def _takes_attributes(cls: ast.ClassDef) -> bool:
    """Whether a name set on the class later is what the class body would have made: not
    for a dataclass or schema (a field), an enum (a member), or a class with a metaclass."""
    texts = [ast.unparse(node) for node in [*cls.decorator_list, *cls.bases]]
    special = (*_ANNOTATIONS_MATTER, "Enum", "Flag")
    return not cls.keywords and not any(word in t for t in texts for word in special)


def _own_statements(units: UnitMap, qualname: str) -> ast.ClassDef | None:
    """The class ``qualname`` with only its own statements (methods are units of theirs)."""
    scope = units.scope(qualname)
    if scope is None or not isinstance(scope.node, ast.ClassDef):
        return None
    cls = scope.node
    kept = [s for s in cls.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
    return ast.ClassDef(cls.name, cls.bases, cls.keywords, kept, cls.decorator_list, [])


def added_class_attributes(
    qualname: str, old: tuple[str, UnitMap] | None, new: tuple[str, UnitMap] | None
) -> list[tuple[str, ast.stmt]] | None:
    """The class attributes the change adds to the class ``qualname`` (name, statement),
    when that is all it changes in the class body (inert noise aside); else None."""
    if old is None or new is None:
        return None
    before, after = _own_statements(old[1], qualname), _own_statements(new[1], qualname)
    if before is None or after is None or not _takes_attributes(after):
        return None
    had = {_assigned_name(s) for s in before.body} | {
        getattr(s.target, "id", None) for s in before.body if isinstance(s, ast.AnnAssign)
    }
    added = [(name, s) for s in after.body if (name := _assigned_name(s)) and name not in had]
    if not added:
        return None
    after.body = [s for s in after.body if all(s is not stmt for _, stmt in added)]
    same = ast.dump(_without_noise(_shell(before))) == ast.dump(_without_noise(_shell(after)))
    return added if same else None


def _shell(cls: ast.ClassDef) -> ast.ClassDef:
    cls.body = cls.body or [ast.Pass()]
    return cls
