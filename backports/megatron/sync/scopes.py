"""Which names in upstream code are module globals: Python's scope rules, read from the ast.

A name inside a function is a module global when the compiler would look it up in the
module's globals (not a parameter, a local, an enclosing function's name, a comprehension
target; class bodies enclose nothing). Of those, the names the upstream module binds itself
become live look-ups in vendored code; the names it imports from outside megatron are
imports the vendored file repeats; builtins stay as they are. ``render`` uses this.
"""

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass, field

from .errors import RewriteError, SourceError

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
class Import:
    module: str | None  # ``from module import ...``, or None for ``import ...``
    name: str  # ``a.b`` or ``a as b``


@dataclass(frozen=True)
class ModuleNames:
    bound: frozenset[str]  # every name the upstream module binds at top level
    imports: dict[str, Import]  # name -> the import the vendored module repeats
    future: tuple[str, ...]  # ``from __future__`` features


def module_names(tree: ast.Module) -> ModuleNames:
    scope = _Scope(tree)
    _own_bindings(scope, list(tree.body), comprehension=False)
    imports: dict[str, Import] = {}
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
                imports[_alias_binding(alias)] = Import(module, name)
        else:
            other = _Scope(tree)
            _bind_node(other, stmt, comprehension=False)
            rebound |= other.bound
    # A name the module also binds some other way is the module's, not the import's.
    carried = {name: line for name, line in imports.items() if name not in rebound}
    return ModuleNames(frozenset(scope.bound), carried, tuple(future))


def _repeatable(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return all(a.name.split(".")[0] not in _LIVE_IMPORT_ROOTS for a in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        root = (stmt.module or "").split(".")[0]
        star = any(a.name == "*" for a in stmt.names)
        return stmt.level == 0 and root not in _LIVE_IMPORT_ROOTS and not star
    return False


@dataclass(frozen=True)
class GlobalReads:
    """The module globals a function reads, sorted by what vendoring must do with them."""

    live: list[ast.Name]  # read at call time: each becomes a live look-up
    imports: set[str]  # names of imports the vendored file repeats
    at_definition: set[str]  # read when the def runs (a decorator, a default): cannot be live
    in_annotations: bool  # the signature's annotations name module globals: keep them lazy


def global_reads(
    func: ast.FunctionDef, names: ModuleNames, own: frozenset[str] = frozenset()
) -> GlobalReads:
    """What ``func`` reads from its module (``names``); assigning a module global is refused,
    except one of ``own``: state the vendored module itself carries (a counter or a pool the
    pull request adds beside its helper), which lives there and nowhere else."""
    live: list[ast.Name] = []
    used_imports: set[str] = set()
    scope, inner = _new_scope(func)
    for node in (n for part in inner for n in _global_names(part, [scope])):
        if not isinstance(node.ctx, ast.Load) and node.id in own:
            continue
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
    return GlobalReads(live, used_imports, stuck, lazy_annotations)


def _is_module_global(name: str, names: ModuleNames) -> bool:
    """Whether a global read means the module's name rather than a builtin."""
    return name in names.bound or name in _MODULE_DUNDERS or not hasattr(builtins, name)
