"""The text of a fix, known without the network: per carried symbol, the sha256 of its
normalised syntax tree at the fix's merge commit, recorded in ``UPSTREAM.toml``
(``fixed_symbols_sha256``), compared at run time with the same digest of the installed
text.

Normalised: parsed (formatting and comments gone), docstrings dropped (inert), the
symbol's own name left out (a function bound under the target's name behaves the same
whatever its ``def`` says), positions not dumped. The same function computes both sides, so
a tool that records the digests and the check that reads them cannot drift apart.
"""

import ast
import hashlib
import inspect
import textwrap
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["FIELD", "object_digest", "symbol_digest", "symbol_digests"]

# The UPSTREAM.toml table: "Class.method" (or "name") -> sha256 of its normalised AST.
FIELD = "fixed_symbols_sha256"

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class _Normaliser(ast.NodeTransformer):
    """Drops every docstring (a module's, a class's, a function's, nested ones too)."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if isinstance(node, (*_DEFS, ast.Module)) and isinstance(body, list) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        return super().generic_visit(node)


def _digest(nodes: Sequence[ast.stmt]) -> str:
    dumped = []
    for node in nodes:
        node = _Normaliser().visit(node)
        if isinstance(node, _DEFS):
            node.name = ""  # the name it is bound under is the target's, not the def's
        dumped.append(ast.dump(node, include_attributes=False))
    return hashlib.sha256("\n".join(dumped).encode("utf-8")).hexdigest()


def _parse(text: str, *, dedent: bool = True) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.parse(textwrap.dedent(text) if dedent else text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _binds(stmt: ast.stmt, name: str) -> bool:
    """Whether a module- or class-level statement binds ``name`` (an assignment, an
    import, or one inside a ``try``/``if`` block: an import guard's flag)."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name.partition(".")[0]) == name:
            return True
    return False


def _definition(tree: ast.Module, qualname: str) -> list[ast.stmt]:
    """The statements of ``tree`` that define ``qualname`` ("name" or "Class.method"):
    its ``def``/``class`` statements, else the statements that bind it; [] if none."""
    *owners, name = qualname.split(".")
    body: list[ast.stmt] = tree.body
    for owner in owners:
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner]
        if not classes:
            return []
        body = classes[-1].body
    defs: list[ast.stmt] = [n for n in body if isinstance(n, _DEFS) and n.name == name]
    return defs or [n for n in body if not isinstance(n, _DEFS) and _binds(n, name)]


def symbol_digest(source: str, qualname: str) -> str | None:
    """The digest of ``qualname`` as module text ``source`` defines it; None where the text
    does not parse or does not define it."""
    tree = _parse(source)
    if tree is None:
        return None
    nodes = _definition(tree, qualname)
    return _digest(nodes) if nodes else None


def symbol_digests(read: Callable[[str], str | None], symbols: Sequence[str]) -> dict[str, str]:
    """``{symbol: digest}`` for each of ``symbols`` whose module text ``read(symbol)``
    gives (e.g. ``git show <merge>:<path>``) and defines it: what ``UPSTREAM.toml``'s
    ``fixed_symbols_sha256`` records."""
    found = {}
    for symbol in symbols:
        text = read(symbol)
        digest = None if text is None else symbol_digest(text, symbol)
        if digest is not None:
            found[symbol] = digest
    return found


def object_digest(function: Any) -> str | None:
    """The digest of a function object's own source text (what runs, wherever it came
    from); None where its source cannot be read or is not one ``def``."""
    try:
        text = inspect.getsource(function)
    except (OSError, TypeError):
        return None
    # A method's text is indented: parsed under a header, not dedented (dedenting would
    # change the content of a multi-line string, which the module's text keeps as it is).
    indented = text[:1].isspace()
    tree = _parse("if 1:\n" + text if indented else text, dedent=False)
    if tree is None or len(tree.body) != 1:
        return None
    node = tree.body[0]
    if indented:
        block = node.body if isinstance(node, ast.If) else []
        if len(block) != 1:
            return None
        node = block[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    return _digest([node])
