"""Step five: synthesise the sniff (in a child interpreter: ``sniff_child``).

What the child needs from the clone is gathered here: the pull request's tests that could
run as a sniff (route a: a module-level test function or a method of a plain test class,
taking no fixtures, parametrized at most by literal cases, with the imports and module-level
helpers it uses), and the names those tests observe that the change also touches (route b's
focus: the test's observation, lifted onto stand-ins).
"""

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard, cast

from .child import package_root, run_module
from .clone import Clone
from .errors import NotProven
from .model import PullRequest, Symbol
from .vendor import VendoredCode

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Words too common to say what a test observes.
_COMMON = frozenset(
    {
        "self",
        "None",
        "True",
        "False",
        "if",
        "else",
        "for",
        "in",
        "not",
        "and",
        "or",
        "return",
        "assert",
        "def",
        "import",
        "from",
        "as",
        "is",
        "torch",
        "print",
        "len",
        "range",
        "dict",
        "list",
        "tuple",
        "str",
        "int",
        "float",
        "bool",
        "x",
        "y",
        "i",
        "j",
        "k",
        "n",
    }
)
ROUTES = {
    "a": "the pull request's own test, run on the target",
    "b": "the pull request's test's observation, lifted onto stand-ins",
    "c": "a differential search over stand-in inputs",
}


@dataclass(frozen=True)
class Sniffed:
    """Per target (its installed attribute): the route that made its sniff and what it
    froze, or None with why each route failed."""

    results: dict[str, dict[str, Any]]
    seconds: float
    focus: tuple[str, ...] = field(default=())

    def discriminating(self) -> list[str]:
        return [name for name, r in self.results.items() if r.get("route")]

    def soundness(self) -> tuple[int, int]:
        """(rewrites the kept sniffs judged as their versions, candidate sniffs the
        rewrites discarded), over every target."""
        passed = discarded = 0
        for result in self.results.values():
            rewrites = result.get("rewrites") or {}
            passed += int(rewrites.get("passed", 0)) if result.get("route") else 0
            discarded += int(rewrites.get("discarded", 0))
        return passed, discarded

    def route(self) -> str:
        routes = sorted({str(r["route"]) for r in self.results.values() if r.get("route")})
        return "+".join(routes)


def _test_function(
    clone: Clone, sha: str, node_id: str
) -> tuple[ast.Module, ast.FunctionDef, str] | None:
    path, *names = node_id.split("::")
    text = clone.text(sha, path)
    if text is None:
        return None
    tree = ast.parse(text)
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for name in names:
        node = next((n for n in body if getattr(n, "name", None) == name), None)
        if node is None:
            return None
        body = getattr(node, "body", [])
    return (tree, node, text) if isinstance(node, ast.FunctionDef) else None


def _is_key(node: ast.AST) -> TypeGuard[ast.Constant]:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and not any(ch.isspace() for ch in node.value)
    )


def _words(node: ast.AST) -> set[str]:
    words: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            words.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            words.add(sub.attr)
        elif isinstance(sub, ast.keyword) and sub.arg:
            words.add(sub.arg)
        elif _is_key(sub):  # a key ("loss_mask"), not prose
            words.update(_WORD.findall(str(sub.value)))
    return words - _COMMON


def _observed(tree: ast.Module, test: ast.FunctionDef, depth: int = 2) -> set[str]:
    """The words of a test and of the helpers of its module it calls (a worker function
    that runs in each rank holds the assertions)."""
    words = _words(test)
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    for name in sorted(words & set(helpers)) if depth else []:
        if helpers[name] is not test:
            words |= _observed(tree, helpers[name], depth - 1)
    return words


def _changed_words(clone: Clone, pr: PullRequest, symbols: tuple[Symbol, ...]) -> set[str]:
    words: set[str] = set()
    for path, old_path in {(s.path, s.old_path or s.path) for s in symbols}:
        old = (clone.text(pr.base.sha, old_path) or "").splitlines()
        new = (clone.text(pr.new.sha, path) or "").splitlines()
        for hunk in clone.hunks(pr.base.sha, pr.new.sha, old_path, path):
            lines = [old[i - 1] for i in hunk.old_lines()] + [new[i - 1] for i in hunk.new_lines()]
            for line in lines:
                words.update(_WORD.findall(line.split("#")[0]))
    return words - _COMMON


def focus_names(
    clone: Clone, pr: PullRequest, symbols: tuple[Symbol, ...], tests: tuple[str, ...]
) -> tuple[str, ...]:
    """Names the pull request's tests observe that its change also touches."""
    observed: set[str] = set()
    for node_id in tests:
        found = _test_function(clone, pr.new.sha, node_id)
        if found is not None:
            observed |= _observed(found[0], found[1])
    return tuple(sorted(observed & _changed_words(clone, pr, symbols)))


# ---- route a: the pull request's tests that could run as a sniff ----------------------------

# Hooks a test class may not define: pytest would run them around the test, the sniff does not.
_CLASS_HOOKS = frozenset(
    {
        "setup_method",
        "teardown_method",
        "setup_class",
        "teardown_class",
        "setup",
        "teardown",
        "setUp",
        "tearDown",
        "setUpClass",
        "tearDownClass",
    }
)
# At most this many parametrized cases run in one sniff (each runs on every rewrite too).
MAX_CASES = 12
# How deep the module-level helpers a test calls are followed (a helper calling a helper).
_HELPER_DEPTH = 3


def _parametrize_cases(decorators: list[ast.expr]) -> list[dict[str, Any]] | None:
    """The cases of ``@pytest.mark.parametrize`` decorators with literal names and values
    (their product, as pytest runs them), or None for any other decorator, a
    ``pytest.param``, a value that is not a literal, or more than ``MAX_CASES``."""
    cases: list[dict[str, Any]] = [{}]
    for decorator in decorators:
        if not (
            isinstance(decorator, ast.Call)
            and ast.unparse(decorator.func) in ("pytest.mark.parametrize", "mark.parametrize")
            and len(decorator.args) == 2
            and not decorator.keywords
        ):
            return None
        try:
            names = ast.literal_eval(decorator.args[0])
            values = ast.literal_eval(decorator.args[1])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        keys = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if not keys or not all(isinstance(k, str) and k.isidentifier() for k in keys):
            return None
        rows = [v if len(keys) > 1 else (v,) for v in values]
        if any(not isinstance(r, tuple | list) or len(r) != len(keys) for r in rows):
            return None
        cases = [{**case, **dict(zip(keys, row, strict=True))} for case in cases for row in rows]
    return cases if 0 < len(cases) <= MAX_CASES else None


def _runnable_class(cls: ast.ClassDef) -> bool:
    """A plain test class pytest instantiates with no arguments and no hooks around it."""
    if cls.decorator_list or cls.keywords or cls.bases:
        return False
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return not any(
        m.name in _CLASS_HOOKS or any("fixture" in ast.unparse(d) for d in m.decorator_list)
        for m in methods
    )


def _module_definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """Module-level functions, classes and plain assignments, by the name they bind."""
    found: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            found[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            for t in stmt.targets:
                found[cast(ast.Name, t).id] = stmt
    return found


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _with_helpers(tree: ast.Module, roots: list[ast.stmt]) -> list[ast.stmt]:
    """``roots`` and the module-level definitions they use, followed ``_HELPER_DEPTH`` deep
    (a helper that builds the config, a fake process group), in the module's order; never
    another test."""
    defined = _module_definitions(tree)
    chosen: list[ast.stmt] = list(roots)
    frontier = list(roots)
    for _ in range(_HELPER_DEPTH):
        wanted = set().union(*(_names(n) for n in frontier)) if frontier else set()
        frontier = [
            defined[name]
            for name in sorted(wanted & set(defined))
            if defined[name] not in chosen and not name.startswith("test")
        ]
        chosen.extend(frontier)
    order = {id(stmt): i for i, stmt in enumerate(tree.body)}
    return sorted({id(s): s for s in chosen}.values(), key=lambda s: order.get(id(s), 0))


def _runner(test: str, call: str, cases: list[dict[str, Any]] | None) -> str:
    """The module-level function the sniff calls: the test, once per case."""
    if cases is None:
        return f"def {test}():\n    {call}()\n"
    return f"def {test}():\n    for _case in {cases!r}:\n        {call}(**_case)\n"


def _route_a_test(clone: Clone, sha: str, node_id: str) -> dict[str, Any] | None:
    """One test as a sniff can run it, or None: a module-level test function, or a method
    of a plain test class (no hooks, no fixtures), taking no argument but those of
    ``@pytest.mark.parametrize`` with literal values; with the imports and module-level
    helpers it uses. Its ``function`` is a runner that calls it once per case."""
    path, *names = node_id.split("::")
    text = clone.text(sha, path)
    if text is None or len(names) not in (1, 2):
        return None
    tree = ast.parse(text)
    scope: list[ast.stmt] = tree.body
    cls = next((n for n in scope if getattr(n, "name", None) == names[0]), None)
    if len(names) == 2:
        if not isinstance(cls, ast.ClassDef) or not _runnable_class(cls):
            return None
        scope = cls.body
    function = next((n for n in scope if getattr(n, "name", None) == names[-1]), None)
    if not isinstance(function, ast.FunctionDef):
        return None
    a = function.args
    params = [p.arg for p in a.args][1 if len(names) == 2 else 0 :]
    cases = _parametrize_cases(function.decorator_list) if function.decorator_list else None
    if (
        a.posonlyargs
        or a.kwonlyargs
        or a.vararg
        or a.kwarg
        or a.defaults
        or (function.decorator_list and cases is None)
        or sorted(params) != sorted(cases[0] if cases else [])
    ):
        return None
    root: ast.stmt = cls if len(names) == 2 and isinstance(cls, ast.ClassDef) else function
    body = _with_helpers(tree, [root])
    used = set().union(*(_names(n) for n in body))
    imports = [
        ast.get_source_segment(text, stmt) or ""
        for stmt in tree.body
        if isinstance(stmt, ast.Import | ast.ImportFrom)
        and {(a.asname or a.name).split(".")[0] for a in stmt.names} & used
    ]
    runner = f"_backports_route_a_{'_'.join(names)}"
    call = f"{names[0]}().{names[1]}" if len(names) == 2 else names[0]
    pieces = [ast.get_source_segment(text, stmt) or "" for stmt in body]
    source = "\n\n\n".join(["\n".join(imports), *pieces, _runner(runner, call, cases)])
    return {"id": node_id, "function": runner, "source": source, "names": sorted(used)}


def route_a_tests(clone: Clone, pr: PullRequest, tests: tuple[str, ...]) -> list[dict[str, Any]]:
    """The pull request's tests that could run as a sniff (``_route_a_test``)."""
    found = []
    for node_id in tests:
        test = _route_a_test(clone, pr.new.sha, node_id)
        if test is not None:
            found.append(test)
    return found


def synthesise(
    vendored: VendoredCode,
    package: str,
    staging: Path,
    scratch: Path,
    *,
    focus: tuple[str, ...],
    tests: list[dict[str, Any]],
    search_seconds: float = 40.0,
) -> Sniffed:
    """Run the routes in a child; ``NotProven`` when the child itself failed."""
    request = {
        "vendored": f"{package}.{vendored.file.removesuffix('.py')}",
        "main_module": vendored.targets[0].module,
        "targets": [
            {"module": t.module, "attribute": t.attribute, "replacement": t.replacement}
            for t in vendored.targets
        ],
        "focus": list(focus),
        "tests": tests,
        "test_seconds": 20,
        "max_runs": 4000,
        "search_seconds": search_seconds,
    }
    budget = 120 + 3 * search_seconds * len(vendored.targets)  # routes b, c, c with callees
    answer, done = run_module(
        "backports.megatron.authoring.from_pr.sniff_child",
        request,
        scratch,
        [package_root(), staging],
        timeout=budget,
    )
    if answer is None or "error" in answer:
        why = (answer or {}).get("error") or done.last_line()
        raise NotProven(f"the sniff's child interpreter failed (exit {done.returncode}): {why}")
    return Sniffed(answer["targets"], done.seconds, focus)
