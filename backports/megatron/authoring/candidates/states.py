"""Step two: each symbol a merge changes, against the installed megatron-core.

The merge's diff is read as ``--from-pr`` reads a pull request's (``from_pr.symbols``: its
hunks mapped to functions, methods, class bodies and module statements). Each symbol's text
is then taken three times: in the merge's parent, in the merge, and in the installed
release (read from its files, never imported). Compared as normalised code (the AST:
comments and formatting aside), the installed text is the parent's (``missing``: the fix is
not in the release), the merge's (``present``: it is, e.g. cherry-picked onto the release
branch) or neither (``drifted``).
"""

import ast
import re
import textwrap
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..from_pr.clone import Clone
from ..from_pr.errors import FromPrError
from ..from_pr.locate import Installed
from ..from_pr.model import Commit, PullRequest, Symbol
from ..from_pr.symbols import Changes, changed_symbols
from ..from_pr.units import UnitMap, map_units, segment
from .model import Merge, SymbolState

SOURCE_ROOT = "megatron/"
# Kinds that change nothing at run time, or that a swap repeats (``from_pr.budget.IGNORED``).
_NOT_COMPARED = frozenset({"comment", "import"})
_DEFINES = re.compile(r"^\s*(?:async\s+def|def|class)\s+(\w+)", re.MULTILINE)


def touches_code(merge: Merge) -> bool:
    """The merge changes a Python file of the ``megatron`` package."""
    return any(f.startswith(SOURCE_ROOT) and f.endswith(".py") for f in merge.files)


def normalised(code: str, kind: str) -> str | None:
    """The code's AST as text (comments and formatting aside); a class body's without its
    methods (they are symbols of their own); None when it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(textwrap.dedent(code))
    except SyntaxError:
        return None
    if kind == "class body" and tree.body and isinstance(tree.body[0], ast.ClassDef):
        cls = tree.body[0]
        cls.body = [
            s for s in cls.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
    return ast.dump(tree)


@dataclass
class Texts:
    """Files of the clone's commits (kept for one merge: ``forget``) and of the installed
    release (parsed once each)."""

    clone: Clone
    installed: Installed
    _clone: dict[tuple[str, str], tuple[str, UnitMap] | None] = field(default_factory=dict)
    _defined_in: dict[str, list[str]] | None = None

    def forget(self) -> None:
        self._clone.clear()

    def at(self, sha: str, path: str | None) -> tuple[str, UnitMap] | None:
        if path is None:
            return None
        key = (sha, path)
        if key not in self._clone:
            self._clone[key] = _parsed(self.clone.text(sha, path))
        return self._clone[key]

    def symbol_at(self, sha: str, path: str | None, qualname: str) -> str | None:
        found = self.at(sha, path)
        return None if found is None else segment(found[0], found[1], qualname)

    def installed_symbol(self, path: str, qualname: str) -> tuple[str | None, str]:
        """The installed text of ``qualname`` (at ``path``, else in any file defining its
        name), and where it was found."""
        text = self.installed.text_of(path, qualname)
        if text is not None or qualname.startswith("<"):
            return text, "same path"
        for other in self._defining(qualname.partition(".")[0]):  # the class or function
            text = self.installed.text_of(other, qualname)
            if text is not None and other != path:
                return text, f"moved to {other}"
        return None, ""

    def _defining(self, name: str) -> list[str]:
        if self._defined_in is None:  # one pass over the installed files, on first need
            index: dict[str, list[str]] = {}
            for path in self.installed.files:
                for defined in set(_DEFINES.findall(self.installed.raw(path))):
                    index.setdefault(defined, []).append(path)
            self._defined_in = index
        return self._defined_in.get(name, [])

    def ships(self, path: str) -> bool:
        """The installed distribution ships the package ``path`` belongs to."""
        parts = path.split("/")
        root = "/".join(parts[:2]) + "/" if len(parts) > 2 else path
        return any(p.startswith(root) for p in self.installed.files)


def _parsed(text: str | None) -> tuple[str, UnitMap] | None:
    if text is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return text, map_units(text)
    except SyntaxError:
        return None


def _as_pull_request(merge: Merge, main_ref: str) -> PullRequest:
    """The merge as ``--from-pr`` sees a merged pull request: merge^ -> merge."""
    assert merge.parent is not None
    merged = Commit("merge", merge.sha, True, f"the first-parent commit {merge.sha[:12]}")
    base = Commit("base", merge.parent, True, "merge^ (the squash merge's parent)")
    return PullRequest(merge.pr or 0, merged, merged, base, main_ref)


def _compare(parent: str | None, new: str | None, here: str | None, kind: str) -> str:
    """The symbol's state from its three texts (see the module's doc)."""
    if parent is not None and new is not None and _same(parent, new, kind):
        return "no code change"
    if here is None:
        return "new" if parent is None else "absent"
    if new is not None and _same(here, new, kind):
        return "present"
    if parent is not None and _same(here, parent, kind):
        return "missing"
    return "drifted"


def _same(a: str, b: str, kind: str) -> bool:
    """The same code: the same text (indentation aside), else the same normalised AST.
    Texts that differ once comments and all whitespace are dropped are different code
    without a parse (a parse is most of the time spent: this keeps it rare)."""
    if textwrap.dedent(a) == textwrap.dedent(b):
        return True
    if kind != "class body" and _squeezed(a) != _squeezed(b):
        return False
    first = normalised(a, kind)
    return first is not None and first == normalised(b, kind)


_SPACE = re.compile(r"\s+")


def _without_comment(line: str) -> str:
    """``line`` up to a ``#`` outside a one-line string literal."""
    quote = None
    for at, char in enumerate(line):
        if quote is None and char == "#":
            return line[:at]
        if char in "'\"" and (at == 0 or line[at - 1] != "\\"):
            quote = char if quote is None else (None if char == quote else quote)
    return line


def _squeezed(code: str) -> str:
    """The code without comments or any whitespace: formatting aside, for a quick no."""
    return _SPACE.sub("", "".join(_without_comment(line) for line in code.splitlines()))


def _state(symbol: Symbol, merge: Merge, texts: Texts) -> SymbolState:
    def made(state: str, how: str = "") -> SymbolState:
        return SymbolState(symbol.path, symbol.qualname, symbol.kind, state, symbol.lines, how)

    if symbol.kind in _NOT_COMPARED:
        return made("no code change" if symbol.kind == "comment" else "import")
    if not texts.ships(symbol.old_path or symbol.path):
        return made("not shipped", f"{symbol.path} is not part of {texts.installed.name}")
    if symbol.qualname.startswith("<"):  # a statement without a name: not located
        return made("unnamed", "a module statement that binds no name")
    assert merge.parent is not None
    parent = texts.symbol_at(merge.parent, symbol.old_path, symbol.qualname)
    new = texts.symbol_at(merge.sha, symbol.path, symbol.qualname)
    here, how = texts.installed_symbol(symbol.old_path or symbol.path, symbol.qualname)
    return made(_compare(parent, new, here, symbol.kind), how)


def symbol_states(
    merge: Merge, main_ref: str, texts: Texts
) -> tuple[Changes | None, tuple[SymbolState, ...], str | None]:
    """(the merge's changes, each symbol's state, why it could not be read, if so)."""
    if merge.parent is None:
        return None, (), "a root commit: nothing to compare with"
    from git.exc import GitError  # gitpython: open_clone has imported it already

    texts.forget()
    try:
        changes = changed_symbols(texts.clone, _as_pull_request(merge, main_ref))
    except (FromPrError, GitError) as exc:  # a file that does not parse, a diff git refuses
        return None, (), (str(exc).splitlines() or [type(exc).__name__])[0]
    return changes, tuple(_state(s, merge, texts) for s in changes.symbols), None


# States that say nothing of whether the release has the merge.
_SILENT = frozenset({"no code change", "import", "unnamed", "not shipped"})


def merge_state(states: Iterable[SymbolState]) -> str:
    """One word for the merge: "present" (every compared symbol is installed as merged),
    "missing" (the release has the parent's code, new helpers aside), "drifted" (a symbol
    is neither), "partial" (some present, some missing), "absent" (it changes only code
    the release does not have), "not shipped" (only files outside megatron-core), or "no
    code change"."""
    seen = [s.state for s in states]
    told = [s for s in seen if s not in _SILENT]
    if not told:
        return "not shipped" if "not shipped" in seen else "no code change"
    if "drifted" in told:
        return "drifted"
    if "present" in told:
        return "partial" if "missing" in told else "present"
    if "missing" in told:
        return "missing"
    return "absent"
