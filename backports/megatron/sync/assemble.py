"""Every shape a backport takes, vendored into one module: a top-level function, a
``Class.method``, several symbols, symbols from several files, and the module state they
carry along (a ``ContextVar``, a scope helper, a small class).

Each piece is upstream's own text (a method dedented to the top level; its decorators,
which read the module at class-definition time, are left off and recorded, since the
applier decorates the body with the live decorator as the original is). Inside each piece
the module globals of its own upstream module become live look-ups on that module:
``_live_target().NAME`` for the manifest's ``path``, ``_live_module("pkg.mod").NAME`` for
another file's. Names the pieces define themselves stay the vendored module's own.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .errors import RewriteError, SourceError
from .rewrite import (
    LIVE_TARGET,
    LIVE_TARGET_DEF,
    Provenance,
    ToLive,
    Vendored,
    _check_reserved,
    _classify,
    _Import,
    _import_lines,
    _module_names,
    _ModuleNames,
    _segment,
    defines,
    find_function,
    replace_names,
    target_globals,
    vendored_head,
)

__all__ = ["Piece", "render_pieces"]

LIVE_MODULE = "_live_module"


@dataclass(frozen=True)
class Piece:
    """One thing to vendor: ``symbol`` of the upstream file ``path`` (module ``module``)."""

    path: str
    module: str
    symbol: str  # "fn", "Class.method", or a carried top-level name
    carried: bool = False  # module state the targets need, not a target itself


@dataclass
class _Rendered:
    text: str
    segment: str
    reads: set[str] = field(default_factory=set)
    imports: dict[str, _Import] = field(default_factory=dict)
    future: set[str] = field(default_factory=set)
    decorators: list[str] = field(default_factory=list)


def _parse(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise SourceError(f"{where} does not parse: {exc}") from exc


def _method(tree: ast.Module, symbol: str, where: str) -> ast.FunctionDef:
    owner, _, name = symbol.partition(".")
    cls = defines(tree, owner)
    if not isinstance(cls, ast.ClassDef):
        raise SourceError(f"{where} defines no top-level class {owner!r}")
    found = [s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == name]
    if not found:
        raise SourceError(f"class {owner} in {where} defines no method {name!r}")
    return found[-1]


def _method_segment(source: str, method: ast.FunctionDef) -> tuple[str, list[str]]:
    """The method's own text from ``def`` on, dedented; and its decorators' texts."""
    decorators = [
        ast.get_source_segment(source, d) or ast.unparse(d) for d in method.decorator_list
    ]
    undecorated = ast.FunctionDef(
        name=method.name,
        args=method.args,
        body=method.body,
        decorator_list=[],
        returns=method.returns,
        type_comment=method.type_comment,
        type_params=getattr(method, "type_params", []),
        lineno=method.lineno,
        col_offset=method.col_offset,
        end_lineno=method.end_lineno,
        end_col_offset=method.end_col_offset,
    )
    text = textwrap.dedent(_segment(source, undecorated))
    return text, decorators


def _statement_text(source: str, stmt: ast.stmt) -> str:
    """A top-level statement's lines; a def or class with its decorators (``_segment``)."""
    if isinstance(stmt, ast.FunctionDef):
        return _segment(source, stmt)
    decorators = getattr(stmt, "decorator_list", [])
    first = min([stmt.lineno, *(d.lineno for d in decorators)])
    assert stmt.end_lineno is not None
    return "".join(source.splitlines(keepends=True)[first - 1 : stmt.end_lineno])


def _live_expr(module: str, main_module: str) -> str:
    return f"{LIVE_TARGET}()" if module == main_module else f'{LIVE_MODULE}("{module}")'


def _verify(rewritten: str, segment: str, nodes: list[ast.Name], live: str) -> None:
    """The text edit must equal the tree edit: upstream's code, its names made live."""
    try:
        got = ast.parse(rewritten)
    except SyntaxError as exc:
        raise RewriteError(f"the vendored result does not compile: {exc}") from exc
    tree = ast.parse(segment)
    ids = {(n.lineno, n.col_offset) for n in nodes}
    same = [
        n for n in ast.walk(tree) if isinstance(n, ast.Name) and (n.lineno, n.col_offset) in ids
    ]
    want = ToLive(same, live).visit(tree)
    if ast.dump(got) != ast.dump(want):
        raise RewriteError("the rewritten text is not the upstream code with live reads")


def _carried_names(node: ast.stmt, names: _ModuleNames, own: set[str]) -> set[str]:
    """Module globals a carried class or assignment reads when the vendored module is
    imported: only imports and the pieces' own names can serve that."""
    stuck = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            if sub.id in own or sub.id in names.imports:
                continue
            if sub.id in names.bound:
                stuck.add(sub.id)
    return stuck


def _render_piece(
    piece: Piece, source: str, where: str, main_module: str, own: set[str]
) -> _Rendered:
    tree = _parse(source, where)
    names = _module_names(tree)
    # The pieces' own names are the vendored module's globals, not live look-ups.
    local = _ModuleNames(names.bound - own, names.imports, names.future)
    decorators: list[str] = []
    if "." in piece.symbol:
        method = _method(tree, piece.symbol, where)
        segment, decorators = _method_segment(source, method)
    else:
        stmt = defines(tree, piece.symbol)
        if stmt is None:
            raise SourceError(f"{where} defines no top-level {piece.symbol!r}")
        if not piece.carried or isinstance(stmt, ast.FunctionDef):
            stmt = find_function(tree, piece.symbol, where)
        segment = _statement_text(source, stmt)
    node = ast.parse(segment).body[0]
    if isinstance(node, ast.FunctionDef):
        _check_reserved(node)
        live, used, stuck, lazy = _classify(node, local)
        live = [n for n in live if n.id not in own]
        stuck -= own
    else:
        live, lazy = [], False
        stuck = _carried_names(node, local, own)
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in names.imports}
    if stuck:
        raise RewriteError(
            f"{piece.symbol} reads {', '.join(sorted(stuck))} from its module when it is "
            "defined (a decorator, a default, a class body); a live look-up cannot serve that"
        )
    live_expr = _live_expr(piece.module, main_module)
    text = replace_names(segment, live, live_expr)
    _verify(text, segment, live, live_expr)
    future = set(names.future) | ({"annotations"} if lazy else set())
    imports = {name: item for name, item in names.imports.items() if name in used}
    return _Rendered(text, segment, {n.id for n in live}, imports, future, decorators)


def render_pieces(
    sources: Mapping[str, str], pieces: Sequence[Piece], provenance: Provenance
) -> tuple[Vendored, dict[str, list[str]]]:
    """The vendored module holding every piece, and the decorators left off each method."""
    own = {p.symbol.rpartition(".")[2] for p in pieces}
    main = provenance.target_module
    rendered: list[_Rendered] = []
    reads: dict[str, set[str]] = {}
    for piece in pieces:
        where = f"{piece.path} at {provenance.sha[:12]}"
        one = _render_piece(piece, sources[piece.path], where, main, own - {piece.symbol})
        rendered.append(one)
        reads.setdefault(piece.module, set()).update(one.reads)
    imports: dict[str, _Import] = {}
    for one in rendered:
        for name, item in one.imports.items():
            if imports.setdefault(name, item) != item:
                raise RewriteError(f"two upstream files import {name!r} differently")
    future = tuple(sorted(set().union(*(one.future for one in rendered))))
    main_reads = tuple(sorted(reads.pop(main, set())))
    others = {module: tuple(sorted(names)) for module, names in reads.items() if names}
    carried = [one for one, piece in zip(rendered, pieces, strict=True) if piece.carried]
    targets = [one for one, piece in zip(rendered, pieces, strict=True) if not piece.carried]
    # Carried state first: the functions read it at call time, a class body at import.
    body = "\n\n".join(one.text.rstrip("\r\n") + "\n" for one in [*carried, *targets])
    text = _module_text(
        provenance, future, _import_lines(list(imports.values())), main_reads, others, body
    )
    try:
        compile(text, f"<vendored {provenance.symbol}>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise RewriteError(f"the vendored result does not compile: {exc}") from exc
    segments = "".join(one.segment for one in rendered)
    decorators = {
        piece.symbol: one.decorators
        for one, piece in zip(rendered, pieces, strict=True)
        if one.decorators
    }
    return Vendored(text, segments, main_reads), decorators


def _module_text(
    p: Provenance,
    future: tuple[str, ...],
    imports: list[str],
    reads: tuple[str, ...],
    others: dict[str, tuple[str, ...]],
    body: str,
) -> str:
    head = vendored_head(
        p,
        future,
        imports,
        origin=(
            "synced by backports sync: upstream's code as it is, except that the module",
            "globals it reads are looked up on the live upstream modules.",
        ),
        doc=(
            f"Upstream ``{p.symbol}`` at {p.sha[:12]}, synced by backports sync.",
            "",
            "Do not edit by hand: ``backports sync --check`` fails on any change. The names in",
            "``__reads__`` are read from the live target module at call time (those in",
            "``__reads_from__`` from the other modules named there).",
        ),
    )
    return "\n".join(head) + _live_lookups(p, reads, others) + "\n\n" + body


def _live_lookups(p: Provenance, reads: tuple[str, ...], others: dict[str, tuple[str, ...]]) -> str:
    """The names the code reads on the live modules, and the functions that find those
    modules at call time (the one of another upstream file only where the code reads one)."""
    parts = [target_globals(p, reads, reader="the code", definer="the first target")]
    if others:
        listed = "".join(
            f'    "{module}": ({"".join(f"{chr(34)}{n}{chr(34)}, " for n in names)}),\n'
            for module, names in others.items()
        )
        parts.append(
            "\n# What the code of other upstream files reads on their modules.\n"
            f"__reads_from__ = {{\n{listed}}}\n"
        )
    parts.append(f"\n\n{LIVE_TARGET_DEF}")
    if others:
        parts.append(
            f"\n\ndef {LIVE_MODULE}(name):\n    __import__(name)\n    return sys.modules[name]\n"
        )
    return "".join(parts)
