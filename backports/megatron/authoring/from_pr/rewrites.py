"""Semantics-preserving rewrites of a function, made from its own AST: what a derived sniff
must see through before it is kept (soundness before speed).

A sniff that tells the installed code from the fixed one may be judging how the code is
written rather than what it does: stand-ins answer ``x != "a"`` and ``x in ("a",)`` as
independent questions, so a still-buggy rule written as a membership test can read as the
fix. Each rewrite here says the same thing another way; a candidate sniff is kept only if
it calls every rewrite of the installed code *needed* and every rewrite of the fixed code
*fixed* (``sniff_child``).

The rewrites (each applied alone, then all together):

- ``membership``: ``x in (a, b)`` as ``x == a or x == b`` (``not in``: ``!=`` and ``and``);
- ``comparisons``: the reverse, a chain of ``==``/``!=`` on one name as a membership test;
- ``de-morgan``: ``A and B`` in a test as ``not (not A or not B)``, ``not (A or B)`` as
  ``not A and not B``, the negation pushed into ``==``/``!=``/``in``/``is``;
- ``renamed locals``: every local the function assigns gets another name;
- ``extracted local``: an ``if``'s test, and a returned expression, held in a new local
  first.

Compiled in the original's module globals with its closure cells (a method in a class of
its owner's name: ``self.__x`` mangles as it did); the module is never written.
"""

import ast
import copy
import inspect
import types
from collections.abc import Callable

Function = types.FunctionType
Definition = ast.FunctionDef | ast.AsyncFunctionDef
_NEGATED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_PREFIX = "_backports_rw"


def _simple(node: ast.expr) -> bool:
    """A name or an attribute chain on one: evaluating it twice reads it twice, no more."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


class _Membership(ast.NodeTransformer):
    """``x in (a, b)`` -> ``x == a or x == b``; ``x not in (a, b)`` -> ``x != a and ...``."""

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], ast.In | ast.NotIn):
            return node
        items = node.comparators[0]
        if not isinstance(items, ast.Tuple | ast.List) or not items.elts or not _simple(node.left):
            return node
        if any(isinstance(e, ast.Starred) for e in items.elts):
            return node
        positive = isinstance(node.ops[0], ast.In)
        op: ast.cmpop = ast.Eq() if positive else ast.NotEq()
        tests: list[ast.expr] = [
            ast.Compare(copy.deepcopy(node.left), [op], [e]) for e in items.elts
        ]
        if len(tests) == 1:
            return tests[0]
        return ast.BoolOp(ast.Or() if positive else ast.And(), tests)


class _Comparisons(ast.NodeTransformer):
    """``x == a or x == b`` -> ``x in (a, b)``; ``x != a and x != b`` -> ``x not in (a, b)``."""

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        self.generic_visit(node)
        wanted = ast.Eq if isinstance(node.op, ast.Or) else ast.NotEq
        lefts, items = set(), []
        for value in node.values:
            if not (
                isinstance(value, ast.Compare)
                and len(value.ops) == 1
                and isinstance(value.ops[0], wanted)
                and _simple(value.left)
            ):
                return node
            lefts.add(ast.dump(value.left))
            items.append(value.comparators[0])
        if len(lefts) != 1:
            return node
        first = node.values[0]
        assert isinstance(first, ast.Compare)
        op: ast.cmpop = ast.In() if wanted is ast.Eq else ast.NotIn()
        return ast.Compare(first.left, [op], [ast.Tuple(items, ast.Load())])


def _negate(node: ast.expr) -> ast.expr:
    """``not node``, pushed into a comparison or a ``not`` where that says the same."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return node.operand
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _NEGATED:
        return ast.Compare(node.left, [_NEGATED[type(node.ops[0])]()], node.comparators)
    return ast.UnaryOp(ast.Not(), node)


def _dual(node: ast.BoolOp) -> ast.BoolOp:
    """``not A or not B`` for ``A and B`` (the operands negated, the operator swapped)."""
    op: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    return ast.BoolOp(op, [_negate(v) for v in node.values])


class _DeMorgan(ast.NodeTransformer):
    """``not (A or B)`` -> ``not A and not B`` anywhere (both are bools); ``A and B`` where
    only its truth is used (a test) -> ``not (not A or not B)``."""

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and isinstance(node.operand, ast.BoolOp):
            return _dual(node.operand)
        return node

    def _test(self, test: ast.expr) -> ast.expr:
        if isinstance(test, ast.BoolOp):
            test.values = [self.visit(v) for v in test.values]
            return ast.UnaryOp(ast.Not(), _dual(test))
        return self.visit(test)  # type: ignore[no-any-return]

    def _with_test(self, node: ast.If | ast.While | ast.IfExp | ast.Assert) -> ast.AST:
        test = node.test
        node.test = ast.Constant(True)  # visited once, below: not again by generic_visit
        self.generic_visit(node)
        node.test = self._test(test)
        return node

    visit_If = visit_While = visit_IfExp = visit_Assert = _with_test


def _own_scope(function: Definition) -> list[ast.AST]:
    """The nodes of the function's own scope (not those of the functions, lambdas and
    classes it defines)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = [*function.body]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _locals(function: Definition) -> set[str]:
    """Names the function binds by plain assignment only (imports, defs, ``global`` and
    ``nonlocal`` names and the parameters stay as they are)."""
    scope = _own_scope(function)
    stored = {n.id for n in scope if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    stored |= {n.name for n in scope if isinstance(n, ast.ExceptHandler) and n.name}
    kept = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
    for node in ast.walk(function):
        if isinstance(node, ast.Global | ast.Nonlocal):
            kept |= set(node.names)
        elif isinstance(node, ast.alias):
            kept.add((node.asname or node.name).split(".")[0])
        elif isinstance(
            node,
            ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.MatchAs | ast.MatchStar,
        ):
            kept.add(node.name or "")
    return stored - kept


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.ExceptHandler:
        self.generic_visit(node)
        if node.name:
            node.name = self.names.get(node.name, node.name)
        return node


def _renamed_locals(function: Definition) -> None:
    uses_frames = any(
        isinstance(n, ast.Name) and n.id in ("locals", "vars", "eval", "exec")
        for n in ast.walk(function)
    )
    if uses_frames:
        return
    names = {name: f"{_PREFIX}_{i}" for i, name in enumerate(sorted(_locals(function)))}
    function.body = [_Rename(names).visit(stmt) for stmt in function.body]


class _Extract(ast.NodeTransformer):
    """``if T:`` -> ``v = T`` then ``if v:``; ``return E`` -> ``v = E`` then ``return v``."""

    def __init__(self) -> None:
        self.count = 0

    def _local(self, value: ast.expr) -> tuple[ast.Assign, ast.Name]:
        name = f"{_PREFIX}_held_{self.count}"
        self.count += 1
        return ast.Assign([ast.Name(name, ast.Store())], value), ast.Name(name, ast.Load())

    def _skip(self, node: ast.AST) -> ast.AST:
        return node  # a nested function, lambda or class keeps its own text

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _skip

    def visit_If(self, node: ast.If) -> list[ast.stmt]:
        self.generic_visit(node)
        if isinstance(node.test, ast.Name | ast.Constant):
            return [node]
        assign, name = self._local(node.test)
        node.test = name
        return [assign, node]

    def visit_Return(self, node: ast.Return) -> list[ast.stmt]:
        if node.value is None or isinstance(node.value, ast.Name | ast.Constant):
            return [node]
        assign, name = self._local(node.value)
        return [assign, ast.Return(name)]


def _extracted_local(function: Definition) -> None:
    extract = _Extract()
    body: list[ast.stmt] = []
    for stmt in function.body:
        done = extract.visit(stmt)
        body += done if isinstance(done, list) else [done]
    function.body = body


def _transformer(kind: type[ast.NodeTransformer]) -> Callable[[Definition], None]:
    def apply(function: Definition) -> None:
        function.body = [kind().visit(stmt) for stmt in function.body]

    return apply


REWRITES: dict[str, Callable[[Definition], None]] = {
    "membership": _transformer(_Membership),
    "comparisons": _transformer(_Comparisons),
    "de-morgan": _transformer(_DeMorgan),
    "renamed locals": _renamed_locals,
    "extracted local": _extracted_local,
}


def _parse(function: Function) -> Definition | None:
    """The function's own definition, parsed from its source (indented under a header, so
    that a method's multi-line strings keep their text)."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return None
    if source[:1].isspace():
        source = "if 1:\n" + source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.name == function.__name__
        ):
            return node
    return None


def _owner(function: Function) -> str | None:
    parts = function.__qualname__.split(".")
    return parts[-2] if len(parts) > 1 and parts[-2] != "<locals>" else None


def _code(found: types.CodeType, name: str) -> types.CodeType | None:
    for const in found.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name and not const.co_name.startswith("<"):
                return const
            inner = _code(const, name)
            if inner is not None:
                return inner
    return None


def compile_like(original: Function, definition: Definition) -> Function | None:
    """``definition`` as a function that runs where ``original`` runs: its globals, its
    closure cells (by name), its defaults; None where that cannot be made."""
    definition = copy.deepcopy(definition)
    definition.decorator_list = []
    inner: ast.stmt = definition
    owner = _owner(original)
    if owner is not None:  # compiled in a class of that name: private names mangle alike
        inner = ast.ClassDef(owner, [], [], [definition], [], type_params=[])
    free = original.__code__.co_freevars
    outer = ast.FunctionDef(
        f"{_PREFIX}_outer",
        ast.arguments([], [], None, [], [], None, []),
        [
            *[ast.Assign([ast.Name(n, ast.Store())], ast.Constant(None)) for n in free],
            inner,
        ],
        [],
        None,
        type_params=[],
    )
    module = ast.fix_missing_locations(ast.Module([outer], []))
    try:
        compiled = compile(module, original.__code__.co_filename, "exec")
    except (SyntaxError, ValueError):
        return None
    code = _code(compiled, original.__name__)
    if code is None:
        return None
    cells = dict(zip(free, original.__closure__ or (), strict=True))
    if any(name not in cells for name in code.co_freevars):
        return None
    closure = tuple(cells[name] for name in code.co_freevars) or None
    made = types.FunctionType(
        code, original.__globals__, original.__name__, original.__defaults__, closure
    )
    made.__kwdefaults__ = original.__kwdefaults__
    made.__qualname__, made.__module__ = original.__qualname__, original.__module__
    return made


def rewrites(function: Function) -> list[tuple[str, Function]]:
    """(what was rewritten, the rewritten function) for each rewrite that changes the
    function's text, then all of them together; [] where its source cannot be read."""
    definition = _parse(function)
    if definition is None:
        return []
    plain = ast.unparse(definition)
    made: list[tuple[str, Function]] = []
    seen = {plain}
    plans = [[name] for name in REWRITES] + [list(REWRITES)]
    for plan in plans:
        rewritten = copy.deepcopy(definition)
        for name in plan:
            REWRITES[name](rewritten)
        ast.fix_missing_locations(rewritten)
        text = ast.unparse(rewritten)
        if text in seen:
            continue
        seen.add(text)
        compiled = compile_like(function, rewritten)
        if compiled is not None:
            made.append((" + ".join(plan) if len(plan) < len(REWRITES) else "all", compiled))
    return made
