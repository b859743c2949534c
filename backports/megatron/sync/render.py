"""The one renderer of a synced file: upstream's pieces vendored into one module, ast
positions and no unparse.

A piece is one thing to vendor: a top-level function, a ``Class.method`` (dedented to the
top level; its decorators, which read the module at class-definition time, are left off
and recorded, since the applier decorates the body with the live decorator as the
original is), or module state the targets carry along (a ``ContextVar``, a scope helper, a
small class). A backport of one function is a one-piece file.

Each piece is upstream's text byte for byte (decorators, inner comments, blank lines);
only the module globals it reads at call time are replaced, in place, by live look-ups:
``_live_target().NAME`` for the manifest's ``path``, ``_live_module("pkg.mod").NAME`` for
another file's, so the vendored code sees the target module's current kernel and helpers.
Names the vendored module imports itself (``torch``, ``typing`` names), builtins, the
pieces' own names and each function's locals are left alone (``scopes`` decides). Every
text edit is checked against the same edit made on the tree. No git and no file system
here: ``commands.py`` is the step around it.
"""

import ast
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..vendored.manifest import unsafe_text
from .errors import RewriteError, SourceError
from .scopes import Import, ModuleNames, defines, find_function, global_reads, module_names

LIVE_TARGET = "_live_target"
LIVE_MODULE = "_live_module"
# What a synced file defines to find the live target module at call time.
LIVE_TARGET_DEF = f"def {LIVE_TARGET}():\n    return sys.modules[__target_module__]\n"
# Names the vendored module itself defines; upstream code must not bind them.
_RESERVED = frozenset({LIVE_TARGET, "__target_module__", "__reads__"})


@dataclass(frozen=True)
class Provenance:
    """What the vendored file's header and docstring say about where it came from."""

    repo: str
    pr: int | str
    sha: str
    path: str
    symbol: str
    target_module: str  # the default ``__target_module__``; the applier rebinds it
    # Where upstream plans to move the module (UPSTREAM.toml's ``moved_path``), or None.
    moved_path: str | None = None
    # (symbol, upstream's name for it) where they differ (UPSTREAM.toml's ``upstream_names``).
    upstream_names: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # Each value lands in a comment, a docstring or a string literal of generated code:
        # one that could end it early is refused, never written (it came from a manifest
        # or a flag, not from this tool).
        fields = {"repo": self.repo, "pr": str(self.pr), "sha": self.sha, "path": self.path}
        fields.update(symbol=self.symbol, moved_path=self.moved_path or "x")
        fields.update({f"upstream name of {k}": v for k, v in self.upstream_names})
        for name, value in fields.items():
            why = unsafe_text(value)
            if why is not None:
                raise RewriteError(f"{name} {value!r} holds {why}: refusing to write it into code")
        if not all(part.isidentifier() for part in self.target_module.split(".")):
            raise RewriteError(f"target module {self.target_module!r} is not a dotted Python name")


@dataclass(frozen=True)
class Piece:
    """One thing to vendor: ``symbol`` of the upstream file ``path`` (module ``module``)."""

    path: str
    module: str
    symbol: str  # "fn", "Class.method", or a carried top-level name
    carried: bool = False  # module state the targets need, not a target itself
    # The name the vendored module defines it under (the catalog target's ``replacement``,
    # e.g. ``layer_wise_optimizer_init`` for ``Class.__init__``); "" = its own name.
    defined_as: str = ""
    # The name upstream gives ``symbol`` at the commit read, where it differs (a class
    # renamed on main: UPSTREAM.toml's ``upstream_names``); "" = ``symbol``.
    upstream_symbol: str = ""

    @property
    def read_as(self) -> str:
        """What upstream's file calls it."""
        return self.upstream_symbol or self.symbol

    @property
    def name(self) -> str:
        """What the vendored module calls it."""
        return self.defined_as or self.symbol.rpartition(".")[2]


@dataclass(frozen=True)
class Vendored:
    """The vendored module's text and what the manifest records about it."""

    text: str
    segment: str  # upstream's exact text of every piece (what upstream_sha256 hashes)
    reads: tuple[str, ...]  # module globals it reads on the live target, sorted
    # The decorators left off each vendored method, as upstream wrote them.
    decorators: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class _Rendered:
    text: str
    segment: str
    reads: set[str] = field(default_factory=set)
    imports: dict[str, Import] = field(default_factory=dict)
    future: set[str] = field(default_factory=set)
    decorators: list[str] = field(default_factory=list)


# --- upstream's text of a piece -------------------------------------------------------------


def _parse(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise SourceError(f"{where} does not parse: {exc}") from exc
    except (RecursionError, MemoryError) as exc:  # a 10,000-term expression, say
        raise SourceError(f"{where} is too deeply nested to read ({type(exc).__name__})") from exc


def _segment(source: str, func: ast.FunctionDef) -> str:
    """The function's lines: decorators first, and the indented comments after its last
    statement (which ast leaves out of its span) last."""
    first = min([func.lineno, *(d.lineno for d in func.decorator_list)])
    lines = source.splitlines(keepends=True)
    assert func.end_lineno is not None
    last = func.end_lineno
    for number, line in enumerate(lines[last:], start=last + 1):
        if line.strip() and not (line[0] in " \t" and line.lstrip().startswith("#")):
            break
        if line.strip():
            last = number
    return "".join(lines[first - 1 : last])


def _kind(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        return "a function"
    return f"bound by an ast.{type(stmt).__name__} statement"


def _method(tree: ast.Module, symbol: str, where: str, renamed: bool) -> ast.FunctionDef:
    owner, _, name = symbol.partition(".")
    cls = defines(tree, owner)
    if not isinstance(cls, ast.ClassDef):
        # A class renamed upstream after the release leaves this name unbound, or bound to
        # something else (#5865 made FullyShardedDataParallel a function that picks a class).
        bound = "" if cls is None else f" ({owner} is {_kind(cls)} there)"
        hint = (
            ""
            if renamed
            else f"; if upstream renamed the class, give upstream's name for {symbol} in "
            "UPSTREAM.toml's upstream_names"
        )
        raise SourceError(f"{where} defines no top-level class {owner!r}{bound}{hint}")
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


def _piece_text(piece: Piece, source: str, tree: ast.Module, where: str) -> tuple[str, list[str]]:
    """Upstream's text of ``piece``, and the decorators left off it (a method's)."""
    renamed = piece.read_as != piece.symbol
    if "." in piece.symbol:
        return _method_segment(source, _method(tree, piece.read_as, where, renamed))
    stmt = defines(tree, piece.read_as)
    if stmt is None:
        raise SourceError(f"{where} defines no top-level {piece.read_as!r}")
    if not piece.carried or isinstance(stmt, ast.FunctionDef):
        stmt = find_function(tree, piece.read_as, where)
    return _statement_text(source, stmt), []


# --- its module globals made live -----------------------------------------------------------


def _check_reserved(func: ast.FunctionDef) -> None:
    for node in ast.walk(func):
        name = getattr(node, "id", None) or getattr(node, "arg", None)
        if name in _RESERVED:
            raise RewriteError(f"{func.name} uses the name {name!r}, which vendored code reserves")


def _replace_names(segment: str, nodes: list[ast.Name], live: str) -> str:
    """Each node's text replaced by ``live.NAME``; ast columns are UTF-8 byte offsets."""
    lines = [line.encode("utf-8") for line in segment.splitlines(keepends=True)]
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        assert node.end_col_offset is not None and node.end_lineno == node.lineno
        line = lines[node.lineno - 1]
        new = f"{live}.{node.id}".encode()
        lines[node.lineno - 1] = line[: node.col_offset] + new + line[node.end_col_offset :]
    return b"".join(lines).decode("utf-8")


class _ToLive(ast.NodeTransformer):
    """The tree edit ``_replace_names`` must match: each node becomes ``live.NAME``."""

    def __init__(self, nodes: list[ast.Name], live: str) -> None:
        self._ids = {id(node) for node in nodes}
        self._live = live

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if id(node) not in self._ids:
            return node
        base = ast.parse(self._live, mode="eval").body
        return ast.Attribute(base, node.id, ast.Load())


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
    want = _ToLive(same, live).visit(tree)
    if ast.dump(got) != ast.dump(want):
        raise RewriteError("the rewritten text is not the upstream code with live reads")


def _edited(text: str, spans: list[tuple[int, int, int, str]]) -> str:
    """``text`` with each (line, start, end, new) byte span of one line replaced."""
    lines = [line.encode("utf-8") for line in text.splitlines(keepends=True)]
    for lineno, start, end, new in sorted(spans, reverse=True):
        line = lines[lineno - 1]
        lines[lineno - 1] = line[:start] + new.encode("utf-8") + line[end:]
    return b"".join(lines).decode("utf-8")


def _zero_argument_supers(tree: ast.AST) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "super"
        and not n.args
        and not n.keywords
    ]


def _explicit_super(text: str, owner: str, piece: Piece) -> str:
    """A method's ``super()`` made ``super(<live owner class>, <first parameter>)``: out of
    its class body the method has no ``__class__`` cell, and zero-argument ``super()``
    would raise at call time. The class is the live target module's, as the original's
    cell holds it."""
    function = ast.parse(text).body[0]
    assert isinstance(function, ast.FunctionDef)
    calls = _zero_argument_supers(function)
    if not calls:
        return text
    positional = [*function.args.posonlyargs, *function.args.args]
    if not positional:
        raise RewriteError(f"{piece.symbol} calls super() but takes no instance or class")
    if any(call.lineno != call.end_lineno for call in calls):
        raise RewriteError(f"{piece.symbol} spreads a super() call over several lines")
    explicit = f"super({owner}, {positional[0].arg})"
    spans = [(c.lineno, c.col_offset, c.end_col_offset or 0, explicit) for c in calls]
    rewritten = _edited(text, spans)
    want = ast.parse(text)
    for call in _zero_argument_supers(want):
        call.args = list(ast.parse(explicit, mode="eval").body.args)  # type: ignore[attr-defined]
    if ast.dump(ast.parse(rewritten)) != ast.dump(want):
        raise RewriteError(f"the explicit super() of {piece.symbol} is not upstream's call")
    return rewritten


def _renamed(text: str, old: str, new: str) -> str:
    """The function ``old`` defined as ``new`` (its ``def`` line only), checked on the tree."""
    function = ast.parse(text).body[0]
    assert isinstance(function, ast.FunctionDef) and function.name == old
    line = text.splitlines(keepends=True)[function.lineno - 1].encode("utf-8")
    start = line.find(f"def {old}".encode(), function.col_offset)
    if start < 0 or not new.isidentifier():
        raise RewriteError(f"cannot define {old} as {new!r}")
    span = (function.lineno, start, start + len(f"def {old}"), f"def {new}")
    rewritten = _edited(text, [span])
    want = ast.parse(text)
    want.body[0].name = new  # type: ignore[attr-defined]
    if ast.dump(ast.parse(rewritten)) != ast.dump(want):
        raise RewriteError(f"renaming {old} to {new} changed more than its name")
    return rewritten


def _carried_names(node: ast.stmt, names: ModuleNames, own: set[str]) -> set[str]:
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


def _live_expr(module: str, main_module: str) -> str:
    return f"{LIVE_TARGET}()" if module == main_module else f'{LIVE_MODULE}("{module}")'


def _render_piece(
    piece: Piece, source: str, where: str, main_module: str, own: set[str]
) -> _Rendered:
    tree = _parse(source, where)
    names = module_names(tree)
    # The pieces' own names are the vendored module's globals, not live look-ups.
    local = ModuleNames(names.bound - own, names.imports, names.future)
    segment, decorators = _piece_text(piece, source, tree, where)
    node = ast.parse(segment).body[0]
    if isinstance(node, ast.FunctionDef):
        _check_reserved(node)
        reads = global_reads(node, local, frozenset(own))
        live = [n for n in reads.live if n.id not in own]
        used, stuck, lazy = reads.imports, reads.at_definition - own, reads.in_annotations
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
    text = _replace_names(segment, live, live_expr)
    _verify(text, segment, live, live_expr)
    if isinstance(node, ast.FunctionDef) and "." in piece.symbol:
        # The class as the release names it (the live module's), whatever upstream calls it.
        text = _explicit_super(text, f"{live_expr}.{piece.symbol.partition('.')[0]}", piece)
    if isinstance(node, ast.FunctionDef) and piece.name != node.name:
        text = _renamed(text, node.name, piece.name)
    future = set(names.future) | ({"annotations"} if lazy else set())
    imports = {name: item for name, item in names.imports.items() if name in used}
    return _Rendered(text, segment, {n.id for n in live}, imports, future, decorators)


# --- the vendored module ----------------------------------------------------------------------


def render(sources: Mapping[str, str], pieces: Sequence[Piece], provenance: Provenance) -> Vendored:
    """The vendored module holding every piece (``sources``: upstream file path -> text);
    raises a ``SyncError`` when upstream's code cannot be vendored so."""
    own = {p.symbol.rpartition(".")[2] for p in pieces} | {p.name for p in pieces}
    main = provenance.target_module
    rendered: list[_Rendered] = []
    reads: dict[str, set[str]] = {}
    for piece in pieces:
        where = f"{piece.path} at {provenance.sha[:12]}"
        one = _render_piece(piece, sources[piece.path], where, main, own - {piece.symbol})
        rendered.append(one)
        reads.setdefault(piece.module, set()).update(one.reads)
    imports: dict[str, Import] = {}
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
    head = _head(provenance, future, _import_lines(list(imports.values())))
    text = head + _live_lookups(provenance, main_reads, others) + "\n\n" + body
    try:
        compile(text, f"<vendored {provenance.symbol}>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise RewriteError(f"the vendored result does not compile: {exc}") from exc
    decorators = {
        piece.symbol: one.decorators
        for one, piece in zip(rendered, pieces, strict=True)
        if one.decorators
    }
    return Vendored(text, "".join(one.segment for one in rendered), main_reads, decorators)


def _import_lines(imports: list[Import]) -> list[str]:
    """``import`` lines in upstream's order, one ``from`` line per module."""
    grouped: dict[str | None, list[str]] = {}
    lines: list[str] = []
    for item in imports:
        if item.module is None:
            lines.append(f"import {item.name}")
        elif item.module not in grouped:
            grouped[item.module] = [item.name]
            lines.append(item.module)
        else:
            grouped[item.module].append(item.name)
    return [
        line if line.startswith("import ") else f"from {line} import {', '.join(grouped[line])}"
        for line in lines
    ]


def _head(p: Provenance, future: tuple[str, ...], imports: list[str]) -> str:
    """The lines every synced file opens with: where it came from, how it differs from
    upstream, its docstring, then its imports. The bytes of a synced file are what
    ``--check`` compares: tests pin these lines."""
    head = [
        "# Vendored for megatron-backports; see UPSTREAM.toml beside this file.",
        f"# repo:   {p.repo}",
        f"# pr:     {p.pr}",
        f"# sha:    {p.sha}",
        f"# path:   {p.path}",
        f"# symbol: {p.symbol}",
        *(f"# read as: {name} (upstream's name for {symbol})" for symbol, name in p.upstream_names),
        "# origin: synced by backports sync: upstream's code as it is, except that the module",
        "#         globals it reads are looked up on the live upstream modules.",
        "# Upstream code is not held to this repository's lint rules:",
        "# ruff: noqa",
        f'"""Upstream ``{p.symbol}`` at {p.sha[:12]}, synced by backports sync.',
        "",
        "Do not edit by hand: ``backports sync --check`` fails on any change. The names in",
        "``__reads__`` are read from the live target module at call time (those in",
        "``__reads_from__`` from the other modules named there).",
        '"""',
        "",
    ]
    if future:
        head += [f"from __future__ import {', '.join(future)}", ""]
    return "\n".join(head + list(dict.fromkeys(["import sys", *imports])))


def _live_lookups(p: Provenance, reads: tuple[str, ...], others: dict[str, tuple[str, ...]]) -> str:
    """``__target_module__`` and the names the code reads on the live modules, and the
    functions that find those modules at call time (the one of another upstream file only
    where the code reads one)."""
    reads_text = "".join(f'    "{name}",\n' for name in reads)
    # Said only when this entry's UPSTREAM.toml records a planned move.
    move = f" (upstream plans to move it to {p.moved_path})" if p.moved_path else ""
    parts = [
        "\n\n# The module whose globals the code reads. The applier rebinds it to the module\n"
        f"# that really defines the first target{move}.\n"
        # A dotted Python name (checked by Provenance): safe between double quotes.
        f'__target_module__ = "{p.target_module}"\n\n'
        "# Module globals of the target that the code reads at call time.\n"
        f"__reads__ = (\n{reads_text})\n"
    ]
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
