"""Turn one top-level upstream function into a vendored module: ast positions, no unparse.

The function's text is kept byte for byte (decorators, inner comments, blank lines); only
the module-global names it reads at call time are replaced, in place, by
``_live_target().NAME``, so the vendored copy sees the target module's current kernel and
helpers. Names the vendored module imports itself (``torch``, ``typing`` names), builtins
and the function's own locals are left alone. No git and no file system here:
``backports sync`` (``commands.py``) is the step around it.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..upstream_schema import unsafe_text
from .errors import RewriteError, SourceError, SyncError

__all__ = [
    "LIVE_TARGET",
    "LIVE_TARGET_DEF",
    "Provenance",
    "RewriteError",
    "SourceError",
    "SyncError",
    "Vendored",
    "defines",
    "find_function",
    "render_vendored",
]

LIVE_TARGET = "_live_target"
# What a synced file defines to find the live target module at call time.
LIVE_TARGET_DEF = f"def {LIVE_TARGET}():\n    return sys.modules[__target_module__]\n"
# Names the vendored module itself defines; upstream code must not bind them.
_RESERVED = frozenset({LIVE_TARGET, "__target_module__", "__reads__"})
# Module roots whose unconditional imports the vendored file repeats instead of reading
# them off the target module. Everything from megatron itself is a live look-up.
_LIVE_IMPORT_ROOTS = frozenset({"megatron"})
# Module attributes that builtins also has: in upstream code they mean the target's own.
_MODULE_DUNDERS = frozenset({"__name__", "__doc__", "__spec__", "__loader__", "__package__"})

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SCOPES = (*_FUNCTIONS, ast.Lambda, ast.ClassDef, *_COMPREHENSIONS)


# --- scopes -------------------------------------------------------------------------------


def _split(node: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """(parts evaluated in the enclosing scope, parts evaluated in ``node``'s own scope)."""
    if isinstance(node, (*_FUNCTIONS, ast.Lambda)):
        args = node.args
        outer: list[ast.AST] = [*args.defaults, *(d for d in args.kw_defaults if d)]
        if isinstance(node, _FUNCTIONS):
            outer += [*node.decorator_list, *_annotations(node)]
            return outer, list(node.body)
        return outer, [node.body]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords], list(node.body)
    assert isinstance(node, _COMPREHENSIONS), node
    first, *rest = node.generators
    inner: list[ast.AST] = [first.target, *first.ifs, *rest]
    inner += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    return [first.iter], inner


def _annotations(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.expr]:
    args = node.args
    for arg in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg):
        if arg is not None and arg.annotation is not None:
            yield arg.annotation
    if node.returns is not None:
        yield node.returns


def _parameters(node: ast.AST) -> set[str]:
    if not isinstance(node, (*_FUNCTIONS, ast.Lambda)):
        return set()
    args = node.args
    every = (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg)
    return {arg.arg for arg in every if arg is not None}


@dataclass
class _Scope:
    node: ast.AST
    bound: set[str] = field(default_factory=set)
    declared_global: set[str] = field(default_factory=set)
    declared_nonlocal: set[str] = field(default_factory=set)

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, ast.ClassDef)


def _own_bindings(scope: _Scope, parts: list[ast.AST], comprehension: bool) -> None:
    """Record what ``parts`` bind in ``scope``, without entering nested scopes."""
    for part in parts:
        _bind_node(scope, part, comprehension)


def _bind_node(scope: _Scope, node: ast.AST, comprehension: bool) -> None:
    match node:
        case ast.Name(id=name, ctx=ast.Store() | ast.Del()):
            scope.bound.add(name)
        case ast.NamedExpr(target=ast.Name(id=name)) if not comprehension:
            scope.bound.add(name)  # a walrus in a comprehension binds in the function
        case ast.Global(names=names):
            scope.declared_global.update(names)
        case ast.Nonlocal(names=names):
            scope.declared_nonlocal.update(names)
        case ast.Import(names=aliases) | ast.ImportFrom(names=aliases):
            scope.bound.update(_alias_binding(a) for a in aliases if a.name != "*")
        case ast.ExceptHandler(name=str(name)) | ast.MatchAs(name=str(name)):
            scope.bound.add(name)
        case ast.MatchStar(name=str(name)) | ast.MatchMapping(rest=str(name)):
            scope.bound.add(name)
    if isinstance(node, _SCOPES):
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            scope.bound.add(node.name)
        outer, inner = _split(node)
        _own_bindings(scope, outer, comprehension)
        if isinstance(node, _COMPREHENSIONS) and not comprehension:
            _walrus_bindings(scope, inner)
        return
    for child in ast.iter_child_nodes(node):
        _bind_node(scope, child, comprehension)


def _walrus_bindings(scope: _Scope, parts: list[ast.AST]) -> None:
    """``(x := ...)`` inside a comprehension binds ``x`` in the enclosing function."""
    for part in parts:
        for node in ast.walk(part):
            if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                scope.bound.add(node.target.id)


def _alias_binding(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _new_scope(node: ast.AST) -> tuple[_Scope, list[ast.AST]]:
    outer, inner = _split(node)
    del outer
    scope = _Scope(node, bound=_parameters(node))
    _own_bindings(scope, inner, isinstance(node, _COMPREHENSIONS))
    return scope, inner


def _is_global(name: str, chain: list[_Scope]) -> bool:
    """Python's compile-time rule: class bodies do not enclose the scopes inside them."""
    for depth, scope in enumerate(reversed(chain)):
        if scope.is_class and depth:
            continue
        if name in scope.declared_global:
            return True
        if name in scope.bound or name in scope.declared_nonlocal:
            return False
    return True


def _global_names(node: ast.AST, chain: list[_Scope]) -> Iterator[ast.Name]:
    """Every ``Name`` under ``node`` that refers to a module global at run time."""
    if isinstance(node, _SCOPES):
        outer, _ = _split(node)
        for part in outer:
            yield from _global_names(part, chain)
        scope, inner = _new_scope(node)
        for part in inner:
            yield from _global_names(part, [*chain, scope])
        return
    if isinstance(node, ast.Name) and _is_global(node.id, chain):
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _global_names(child, chain)


# --- the upstream module ------------------------------------------------------------------


def defines(tree: ast.Module, symbol: str) -> ast.stmt | None:
    """The last top-level statement that binds ``symbol`` other than an import, or None.

    An import (or a PEP 562 ``__getattr__``) only forwards: the symbol lives elsewhere.
    """
    found: ast.stmt | None = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            continue
        scope = _Scope(tree)
        _bind_node(scope, stmt, comprehension=False)
        if symbol in scope.bound:
            found = stmt
    return found


def find_function(tree: ast.Module, symbol: str, where: str) -> ast.FunctionDef:
    """The top-level ``def symbol`` of ``tree``; ``where`` names the source in errors."""
    stmt = defines(tree, symbol)
    if stmt is None:
        raise SourceError(f"{where} defines no top-level {symbol!r}")
    if isinstance(stmt, ast.AsyncFunctionDef):
        raise SourceError(f"{symbol!r} in {where} is an async function, not a plain function")
    if not isinstance(stmt, ast.FunctionDef):
        if isinstance(stmt, ast.ClassDef):
            raise SourceError(f"{symbol!r} in {where} is a class, not a function")
        kind = type(stmt).__name__
        raise SourceError(f"{symbol!r} in {where} is bound by an ast.{kind} statement, not a def")
    return stmt


@dataclass(frozen=True)
class _Import:
    module: str | None  # ``from module import ...``, or None for ``import ...``
    name: str  # ``a.b`` or ``a as b``


@dataclass(frozen=True)
class _ModuleNames:
    bound: frozenset[str]  # every name the upstream module binds at top level
    imports: dict[str, _Import]  # name -> the import the vendored module repeats
    future: tuple[str, ...]  # ``from __future__`` features


def _module_names(tree: ast.Module) -> _ModuleNames:
    scope = _Scope(tree)
    _own_bindings(scope, list(tree.body), comprehension=False)
    imports: dict[str, _Import] = {}
    future: list[str] = []
    rebound: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            future += [alias.name for alias in stmt.names]
        elif _repeatable(stmt):
            assert isinstance(stmt, ast.Import | ast.ImportFrom)
            for alias in stmt.names:
                name = alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"
                module = stmt.module if isinstance(stmt, ast.ImportFrom) else None
                imports[_alias_binding(alias)] = _Import(module, name)
        else:
            other = _Scope(tree)
            _bind_node(other, stmt, comprehension=False)
            rebound |= other.bound
    # A name the module also binds some other way is the module's, not the import's.
    carried = {name: line for name, line in imports.items() if name not in rebound}
    return _ModuleNames(frozenset(scope.bound), carried, tuple(future))


def _repeatable(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return all(a.name.split(".")[0] not in _LIVE_IMPORT_ROOTS for a in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        root = (stmt.module or "").split(".")[0]
        star = any(a.name == "*" for a in stmt.names)
        return stmt.level == 0 and root not in _LIVE_IMPORT_ROOTS and not star
    return False


def _import_lines(imports: list[_Import]) -> list[str]:
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


# --- the rewrite --------------------------------------------------------------------------


@dataclass(frozen=True)
class Vendored:
    """The vendored module's text and what the manifest records about it."""

    text: str
    segment: str  # the upstream function's exact text (what upstream_sha256 hashes)
    reads: tuple[str, ...]  # module globals it reads on the live target, sorted


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


def _classify(
    func: ast.FunctionDef, names: _ModuleNames
) -> tuple[list[ast.Name], set[str], set[str], bool]:
    """Name nodes to rewrite, imported names used, def-time names that cannot be live, and
    whether the signature's annotations name module globals (so must not be evaluated).
    """
    live: list[ast.Name] = []
    used_imports: set[str] = set()
    scope, inner = _new_scope(func)
    for node in (n for part in inner for n in _global_names(part, [scope])):
        if not isinstance(node.ctx, ast.Load):
            raise RewriteError(
                f"{func.name} assigns the module global {node.id!r}; only reads can be vendored"
            )
        if node.id in names.imports:
            used_imports.add(node.id)
        elif _is_module_global(node.id, names):
            live.append(node)
    outer, _ = _split(func)
    annotations = list(_annotations(func))
    stuck: set[str] = set()
    lazy_annotations = False
    for part in outer:
        for node in _global_names(part, []):
            if node.id in names.imports:
                used_imports.add(node.id)
            elif not _is_module_global(node.id, names):
                continue
            elif part in annotations:
                lazy_annotations = True
            else:
                stuck.add(node.id)  # evaluated when the vendored module is imported
    return live, used_imports, stuck, lazy_annotations


def _is_module_global(name: str, names: _ModuleNames) -> bool:
    """Whether a global read means the module's name rather than a builtin."""
    return name in names.bound or name in _MODULE_DUNDERS or not hasattr(builtins, name)


def _check_reserved(func: ast.FunctionDef) -> None:
    for node in ast.walk(func):
        name = getattr(node, "id", None) or getattr(node, "arg", None)
        if name in _RESERVED:
            raise RewriteError(f"{func.name} uses the name {name!r}, which vendored code reserves")


def replace_names(segment: str, nodes: list[ast.Name], live: str) -> str:
    """Each node's text replaced by ``live.NAME``; ast columns are UTF-8 byte offsets."""
    lines = [line.encode("utf-8") for line in segment.splitlines(keepends=True)]
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        assert node.end_col_offset is not None and node.end_lineno == node.lineno
        line = lines[node.lineno - 1]
        new = f"{live}.{node.id}".encode()
        lines[node.lineno - 1] = line[: node.col_offset] + new + line[node.end_col_offset :]
    return b"".join(lines).decode("utf-8")


class ToLive(ast.NodeTransformer):
    """The tree edit ``replace_names`` must match: each node becomes ``live.NAME``."""

    def __init__(self, nodes: list[ast.Name], live: str) -> None:
        self._ids = {id(node) for node in nodes}
        self._live = live

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if id(node) not in self._ids:
            return node
        base = ast.parse(self._live, mode="eval").body
        return ast.Attribute(base, node.id, ast.Load())


def _verify(rewritten: str, segment_tree: ast.Module, nodes: list[ast.Name]) -> None:
    """The text edit must equal the tree edit: upstream's function, names made live."""
    try:
        got = ast.parse(rewritten)
    except SyntaxError as exc:
        raise RewriteError(f"the vendored result does not compile: {exc}") from exc
    want = ToLive(nodes, f"{LIVE_TARGET}()").visit(segment_tree)
    if ast.dump(got) != ast.dump(want):
        raise RewriteError("the rewritten text is not the upstream function with live reads")


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

    def __post_init__(self) -> None:
        # Each value lands in a comment, a docstring or a string literal of generated code:
        # one that could end it early is refused, never written (it came from a manifest
        # or a flag, not from this tool).
        fields = {"repo": self.repo, "pr": str(self.pr), "sha": self.sha, "path": self.path}
        fields.update(symbol=self.symbol, moved_path=self.moved_path or "x")
        for name, value in fields.items():
            why = unsafe_text(value)
            if why is not None:
                raise RewriteError(f"{name} {value!r} holds {why}: refusing to write it into code")
        if not all(part.isidentifier() for part in self.target_module.split(".")):
            raise RewriteError(f"target module {self.target_module!r} is not a dotted Python name")


def render_vendored(source: str, symbol: str, provenance: Provenance) -> Vendored:
    """Vendor ``symbol`` from the upstream module ``source``; raises a ``SyncError``."""
    where = f"{provenance.path} at {provenance.sha[:12]}"
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise SourceError(f"{where} does not parse: {exc}") from exc
    func = find_function(tree, symbol, where)
    _check_reserved(func)
    names = _module_names(tree)
    segment = _segment(source, func)
    segment_tree = ast.parse(segment)
    seg_func = segment_tree.body[0]
    assert isinstance(seg_func, ast.FunctionDef)
    live, used_imports, stuck, lazy_annotations = _classify(seg_func, names)
    if stuck:
        raise RewriteError(
            f"{symbol} reads {', '.join(sorted(stuck))} from its module when it is defined "
            "(in a decorator or a default); a live look-up cannot serve that"
        )
    # Annotations that name the module's globals stay unevaluated text, never looked up.
    future = tuple(dict.fromkeys([*names.future, *(["annotations"] * lazy_annotations)]))
    rewritten = replace_names(segment, live, f"{LIVE_TARGET}()")
    _verify(rewritten, segment_tree, live)
    reads = tuple(sorted({node.id for node in live}))
    imports = _import_lines([item for name, item in names.imports.items() if name in used_imports])
    text = _module_text(provenance, future, imports, reads, rewritten)
    try:
        compile(text, f"<vendored {symbol}>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise RewriteError(f"the vendored result does not compile: {exc}") from exc
    return Vendored(text, segment, reads)


def _module_text(
    provenance: Provenance,
    future: tuple[str, ...],
    imports: list[str],
    reads: tuple[str, ...],
    function: str,
) -> str:
    p = provenance
    head = vendored_head(
        p,
        future,
        imports,
        origin=(
            "synced by tools/sync_upstream.py: upstream's function as it is, except that",
            "the module globals it reads are looked up on the live target module.",
        ),
        doc=(
            f"Upstream ``{p.symbol}`` at {p.sha[:12]}, synced by tools/sync_upstream.py.",
            "",
            "Do not edit by hand: ``python tools/sync_upstream.py --check`` fails on any change.",
            "The names in ``__reads__`` are read from the live target module at call time, so a",
            "kernel or helper replaced there is seen here; the target module must have each one.",
        ),
    )
    globals_block = target_globals(p, reads, reader="the function", definer="the function")
    body = f"{globals_block}\n\n{LIVE_TARGET_DEF}\n\n"
    return "\n".join(head) + body + function.rstrip("\r\n") + "\n"


def vendored_head(
    p: Provenance,
    future: tuple[str, ...],
    imports: list[str],
    *,
    origin: tuple[str, str],
    doc: tuple[str, ...],
) -> list[str]:
    """The lines every synced file opens with: where it came from, how it differs from
    upstream (``origin``, two comment lines), its docstring (``doc``), then its imports.
    The single-function rewrite and the multi-piece assembly word ``origin`` and ``doc``
    each their own way; the bytes of a synced file are what ``--check`` compares."""
    head = [
        "# Vendored for megatron-backports; see UPSTREAM.toml beside this file.",
        f"# repo:   {p.repo}",
        f"# pr:     {p.pr}",
        f"# sha:    {p.sha}",
        f"# path:   {p.path}",
        f"# symbol: {p.symbol}",
        f"# origin: {origin[0]}",
        f"#         {origin[1]}",
        "# Upstream code is not held to this repository's lint rules:",
        "# ruff: noqa",
        f'"""{doc[0]}',
        *doc[1:],
        '"""',
        "",
    ]
    if future:
        head += [f"from __future__ import {', '.join(future)}", ""]
    return head + list(dict.fromkeys(["import sys", *imports]))


def target_globals(p: Provenance, reads: tuple[str, ...], *, reader: str, definer: str) -> str:
    """``__target_module__`` and ``__reads__`` of a synced file: the module whose globals
    ``reader`` (the synced code) reads, which the applier rebinds to the module that really
    defines ``definer``, and the names it reads there."""
    reads_text = "".join(f'    "{name}",\n' for name in reads)
    # Said only when this entry's UPSTREAM.toml records a planned move.
    move = f" (upstream plans to move it to {p.moved_path})" if p.moved_path else ""
    return (
        f"\n\n# The module whose globals {reader} reads. The applier rebinds it to the module\n"
        f"# that really defines {definer}{move}.\n"
        # A dotted Python name (checked by Provenance): safe between double quotes.
        f'__target_module__ = "{p.target_module}"\n\n'
        f"# Module globals of the target that {reader} reads at call time.\n"
        f"__reads__ = (\n{reads_text})\n"
    )
