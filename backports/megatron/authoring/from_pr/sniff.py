"""Step five: synthesise the sniff (in a child interpreter: ``sniff_child``).

What the child needs from the clone is gathered here: the pull request's tests that could
run as a sniff (route a: a module-level test function that takes no fixtures, with the
imports it uses), and the names those tests observe that the change also touches (route
b's focus: the test's observation, lifted onto stand-ins).
"""

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

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


def route_a_tests(clone: Clone, pr: PullRequest, tests: tuple[str, ...]) -> list[dict[str, Any]]:
    """Tests that could run as a sniff: module-level, no fixtures, no decorators; each with
    the imports of its module that it uses."""
    found = []
    for node_id in tests:
        got = _test_function(clone, pr.new.sha, node_id)
        if got is None or node_id.count("::") != 1:
            continue
        tree, function, text = got
        a = function.args
        if (
            a.args
            or a.posonlyargs
            or a.kwonlyargs
            or a.vararg
            or a.kwarg
            or function.decorator_list
        ):
            continue
        used = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
        imports = [
            ast.get_source_segment(text, stmt) or ""
            for stmt in tree.body
            if isinstance(stmt, ast.Import | ast.ImportFrom)
            and {(a.asname or a.name).split(".")[0] for a in stmt.names} & used
        ]
        source = "\n".join([*imports, "", "", ast.get_source_segment(text, function) or ""]) + "\n"
        found.append(
            {"id": node_id, "function": function.name, "source": source, "names": sorted(used)}
        )
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
