"""Step three: find each changed symbol in the installed distribution and compare it with
the pull request's base.

Read from the distribution's files (its RECORD), never imported. A symbol is looked for at
the same path first, then under the same qualname in any other file of the distribution
(moved), then by the fingerprint of its body (renamed). Its installed text is then
``identical`` to the base (the same code; formatting aside), ``drifted`` (another commit
changed it since the release), or the symbol is ``absent``; one the pull request adds is
``new``, one in a file the distribution does not ship (``megatron/training``) ``not shipped``.
"""

import ast
import functools
import hashlib
import importlib.metadata
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .clone import Clone
from .errors import BadInput, Reason, Refused
from .inert import same_code
from .model import Located, PullRequest, Symbol
from .units import UnitMap, map_units, segment

DISTRIBUTION = "megatron-core"


def module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _body_mark(node: ast.AST) -> str | None:
    """A def's body, docstring dropped, as a hash: the same for a renamed function."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    dumped = "".join(ast.dump(stmt) for stmt in body)
    return hashlib.sha256(dumped.encode()).hexdigest() if body else None


def _fingerprint(code: str) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(textwrap.dedent(code))
        return _body_mark(tree.body[0]) if tree.body else None
    except (SyntaxError, RecursionError, MemoryError):  # too deep to compare: no match
        return None


def _same(a: str, b: str) -> str | None:
    """How two texts of one symbol compare: "text", "code" (formatting aside) or None."""
    if textwrap.dedent(a) == textwrap.dedent(b):
        return "text"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            dump = [ast.dump(ast.parse(textwrap.dedent(t))) for t in (a, b)]
    except (SyntaxError, RecursionError, MemoryError):  # too deep to compare: not the same
        return None
    return "code" if dump[0] == dump[1] else None


@dataclass
class Installed:
    """The installed distribution's Python files, parsed on demand."""

    name: str
    version: str
    files: dict[str, Path]  # repository path -> installed file
    _parsed: dict[str, tuple[str, UnitMap] | None] = field(default_factory=dict)

    def parsed(self, path: str) -> tuple[str, UnitMap] | None:
        if path not in self._parsed:
            file = self.files.get(path)
            result = None
            if file is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", SyntaxWarning)
                    try:
                        text = file.read_text(encoding="utf-8")
                        result = (text, map_units(text))
                    except (OSError, SyntaxError, UnicodeDecodeError):
                        result = None
            self._parsed[path] = result
        return self._parsed[path]

    def text_of(self, path: str, qualname: str) -> str | None:
        found = self.parsed(path)
        return None if found is None else segment(found[0], found[1], qualname)

    def raw(self, path: str) -> str:
        try:
            return self.files[path].read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return ""

    def defining(self, qualname: str) -> list[str]:
        """The installed files defining ``qualname`` (only files naming it are parsed)."""
        name = qualname.rpartition(".")[2]
        found = []
        for path in self.files:
            text = self.raw(path)
            if f"def {name}(" in text or f"class {name}" in text:
                parsed = self.parsed(path)
                if parsed is not None and parsed[1].scope(qualname) is not None:
                    found.append(path)
        return found

    def with_body(self, code: str) -> list[tuple[str, str]]:
        """(file, qualname) of every installed def whose body is ``code``'s (a rename);
        only files holding the body's longest line are parsed."""
        mark = _fingerprint(code)
        lines = [line.strip() for line in code.splitlines()[1:] if line.strip()]
        key = max((line for line in lines if not line.startswith("#")), key=len, default="")
        if mark is None or not key:
            return []
        found = []
        for path in self.files:
            if key in self.raw(path):
                parsed = self.parsed(path)
                for scope in parsed[1].scopes if parsed else ():
                    if _body_mark(scope.node) == mark:
                        found.append((path, scope.qualname))
        return found


@functools.lru_cache(maxsize=4)
def installed_distribution(name: str = DISTRIBUTION) -> Installed:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise BadInput(f"{name} is not installed in this environment") from exc
    files = {
        str(f): Path(str(dist.locate_file(f)))
        for f in dist.files or ()
        if str(f).endswith(".py") and str(f).startswith("megatron/")
    }
    return Installed(name, dist.version, files)


def _compare(symbol: Symbol, base: str, installed_text: str, where: str, how: str) -> Located:
    same = _same(base, installed_text)
    module = module_of(where)
    if same is None and same_code(base, installed_text):  # another docstring: no drift
        same = "docstrings"
    if same is None:
        return Located(symbol, "drifted", module, symbol.qualname, how)
    note = {
        "text": (),
        "code": ("the same code, formatted differently",),
        "docstrings": ("the same code, docstrings and comments aside",),
    }[same]
    return Located(symbol, "identical", module, symbol.qualname, how, note)


def _elsewhere(symbol: Symbol, base: str, installed: Installed) -> Located | None:
    """The symbol under its name in another file, or a def with the same body."""
    for path in installed.defining(symbol.qualname):
        text = installed.text_of(path, symbol.qualname)
        if text is not None:
            return _compare(symbol, base, text, path, f"moved to {path}")
    for path, qualname in installed.with_body(base):
        how = f"renamed to {path}::{qualname} (same body)"
        return Located(symbol, "identical", module_of(path), qualname, how)
    return None


def locate_one(symbol: Symbol, clone: Clone, pr: PullRequest, installed: Installed) -> Located:
    if symbol.kind == "inert":  # dropped: nothing of it is carried, nothing to find
        return Located(symbol, "inert", how=symbol.tags[0])
    if symbol.kind in ("new helper", "new constant"):
        return Located(symbol, "new", module_of(symbol.path), symbol.qualname, "added here")
    if symbol.kind in ("new method", "new class attribute"):
        return _added_to_class(symbol, installed)
    if not any(p.startswith(_package_root(symbol.path)) for p in installed.files):
        why = f"{symbol.path} is not part of {installed.name}"
        return Located(symbol, "not shipped", how=why)
    base_text = clone.text(pr.base.sha, symbol.old_path or symbol.path)
    base_units = map_units(base_text) if base_text is not None else None
    base = segment(base_text, base_units, symbol.qualname) if base_text and base_units else None
    if base is None:
        return Located(symbol, "absent", how="not in the pull request's base")
    here = installed.text_of(symbol.old_path or symbol.path, symbol.qualname)
    if here is not None:
        return _compare(symbol, base, here, symbol.old_path or symbol.path, "same path")
    found = _elsewhere(symbol, base, installed)
    if found is not None:
        return found
    return Located(symbol, "absent", how=f"not in {installed.name} {installed.version}")


def _added_to_class(symbol: Symbol, installed: Installed) -> Located:
    """A method or class attribute the pull request adds: "new" where the installed
    release has its class (the backport adds the name to it), "absent" where it has not."""
    owner, _, name = symbol.qualname.rpartition(".")
    path = symbol.old_path or symbol.path
    found = installed.parsed(path)
    paths = [path] if found and found[1].scope(owner) else installed.defining(owner)
    if not paths:
        return Located(symbol, "absent", how=f"its class {owner} is not in {installed.name}")
    units = installed.parsed(paths[0])
    assert units is not None
    scope = units[1].scope(owner)
    assert scope is not None and isinstance(scope.node, ast.ClassDef)
    bound = set().union(*(_bound_in_class(stmt) for stmt in scope.node.body))
    if name in bound or "__slots__" in bound:
        why = "already exists" if name in bound else f"cannot be added: {owner} defines __slots__"
        how = f"{owner}.{name} {why} in {installed.name} {installed.version}"
        return Located(symbol, "drifted", module_of(paths[0]), symbol.qualname, how)
    how = f"added to the installed {owner} at install, removed at revert"
    return Located(symbol, "new", module_of(paths[0]), symbol.qualname, how)


def _bound_in_class(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _package_root(path: str) -> str:
    """``megatron/core/`` for ``megatron/core/x/y.py``: the distribution's own package."""
    parts = path.split("/")
    return "/".join(parts[:2]) + "/" if len(parts) > 2 else path


def locate(
    symbols: tuple[Symbol, ...], clone: Clone, pr: PullRequest, installed: Installed
) -> list[Located]:
    return [locate_one(symbol, clone, pr, installed) for symbol in symbols]


def refuse_uncarried_files(paths: tuple[str, ...], installed: Installed, number: int) -> None:
    """``Refused`` where the pull request changes a file other than Python source in a
    package the installed distribution ships (a .json, .yaml, .cu under megatron/core/):
    a function swap carries none of it, so the backport would hold part of the fix only."""
    for path in paths:
        if path.endswith(".py") or not path.startswith("megatron/"):
            continue
        if any(p.startswith(_package_root(path)) for p in installed.files):
            raise Refused(
                f"#{number} also changes {path}, and --from-pr carries Python functions only: "
                f"the backport would lack that part of the fix; write it by hand "
                f"(backports new --pr {number} --repo ... --target ...)",
                Reason.SHAPE,
            )
