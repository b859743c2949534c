"""Step four: the vendored module, from upstream's text, through the sync's assembly.

- A symbol the release has exactly as the pull request's base is vendored as upstream's
  text at the merge (the head, for an open pull request), as ``backports sync`` would.
- A symbol that drifted is the installed text with this pull request's hunks merged in
  (``merge``); a hunk that does not apply stops here, showing it.
- New helpers and constants the pull request adds are carried along.

Methods become module functions (the sync's assembly dedents them and records their
decorators); a zero-argument ``super()`` gets its class and instance spelled out, since
the function is no longer defined in the class body. Every name the vendored code reads on
an installed module must be there, or nothing is written.
"""

import ast
import dataclasses
import re
import warnings
from dataclasses import dataclass, field

from . import _tool
from .clone import Clone
from .errors import NotProven, Reason, Refused
from .locate import Installed, module_of
from .merge import Conflict, merge_symbol
from .model import Located, PullRequest, Symbol
from .units import map_units, segment

# How a method is bound in its class, not a decorator the applier re-applies: the function
# kind finds a static method's function or a property's getter in the class dict itself.
_STATIC = ("staticmethod", "classmethod", "property")


@dataclass(frozen=True)
class CarriedTarget:
    """One installed function or method the backport replaces, and with what."""

    located: Located
    module: str  # the installed module that defines it
    attribute: str  # "fn" or "Class.method", as installed
    replacement: str  # the vendored module's function that replaces it
    parameters: tuple[str, ...]  # the installed, undecorated signature
    decorator: str | None  # "module:name" of the decorator the installed one carries
    merged: bool  # drifted: carried by a three-way merge
    helpers: tuple[str, ...] = ()
    # "method" or "class attribute": a name the fix adds to an installed class (the
    # added-attribute kind sets it at install); "constant": a module constant the fix
    # changes (the module-attribute kind replaces it); "" for a function or method target.
    added: str = ""
    wrap: str = ""  # an added method's binding: "", "staticmethod", "classmethod", "property"

    @property
    def upstream(self) -> str:
        return self.located.symbol.qualname


@dataclass(frozen=True)
class VendoredCode:
    text: str
    file: str  # the vendored module's file name
    targets: tuple[CarriedTarget, ...]
    carried: tuple[str, ...]  # new helpers and constants carried along
    decorators: dict[str, list[str]]
    reads: tuple[str, ...]  # on the first target's module
    reads_from: dict[str, tuple[str, ...]]
    segment: str  # upstream's text of the pieces (what upstream_sha256 hashes)
    left_out: tuple[str, ...]  # symbols not carried, each with why
    added: tuple[CarriedTarget, ...] = ()  # names the fix adds to installed classes

    @property
    def origin(self) -> str:
        # A class attribute is written beside upstream's pieces: no sync re-renders it.
        written = any(t.added == "class attribute" for t in self.added)
        return "handwritten" if written or any(t.merged for t in self.targets) else "synced"


def _installed_def(installed: Installed, module: str, qualname: str) -> ast.FunctionDef:
    path = next(p for p in installed.files if module_of(p) == module)
    found = installed.parsed(path)
    assert found is not None
    scope = found[1].scope(qualname)
    if scope is None or not isinstance(scope.node, ast.FunctionDef):
        raise NotProven(
            f"{module}.{qualname} is not a def in the installed code", Reason.OUTSIDE_RELEASE
        )
    _refuse_accessors(scope.parents, scope.node, f"{module}.{qualname}")
    return scope.node


def _refuse_accessors_in(source: str, qualname: str, shown: str) -> None:
    """``_refuse_accessors`` on the text carried (the pull request's, or the merged one):
    a fix that adds a setter beside the getter is refused too."""
    scope = map_units(source).scope(qualname)
    if scope is not None and isinstance(scope.node, ast.FunctionDef):
        _refuse_accessors(scope.parents, scope.node, shown)


def _refuse_accessors(parents: tuple[ast.AST, ...], node: ast.FunctionDef, shown: str) -> None:
    """A property whose class also defines its setter or deleter (``@x.setter def x``) under
    the same name is refused: the pieces are found by name (the getter here, the last
    ``def`` in the sync's assembly) and only a getter is swapped, keeping the installed
    setter and deleter."""
    owner = parents[-1] if parents else None
    if not isinstance(owner, ast.ClassDef):
        return
    accessors = {f"{node.name}.{role}" for role in ("setter", "deleter", "getter")}
    found = [
        ast.unparse(d)
        for n in owner.body
        if isinstance(n, ast.FunctionDef) and n.name == node.name
        for d in n.decorator_list
        if ast.unparse(d) in accessors
    ]
    if found:
        raise Refused(
            f"{shown} is a property with @{', @'.join(found)} defined beside its getter: "
            "only a property's lone getter is carried"
        )


def _parameters(node: ast.FunctionDef) -> tuple[str, ...]:
    a = node.args
    every = [*a.posonlyargs, *a.args, a.vararg, *a.kwonlyargs, a.kwarg]
    return tuple(arg.arg for arg in every if arg is not None)


def _imports(tree: ast.Module) -> dict[str, str]:
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return found


def _decorator(node: ast.FunctionDef, module: str, tree: ast.Module) -> str | None:
    """The one decorator besides staticmethod/classmethod/property, as "module:name", or None."""
    heads = [d for d in node.decorator_list if ast.unparse(d) not in _STATIC]
    if not heads:
        return None
    # ``@torch.no_grad()`` is recorded as ``torch:no_grad``: the probe accepts it only
    # where that decorator makes the very wrapper the installed one is (same code).
    head = heads[0].func if isinstance(heads[0], ast.Call) else heads[0]
    called_with = isinstance(heads[0], ast.Call) and (heads[0].args or heads[0].keywords)
    if len(heads) > 1 or called_with:
        shown = ", ".join("@" + ast.unparse(d) for d in heads)
        raise Refused(f"{module}.{node.name} carries {shown}: one plain decorator at most")
    text = ast.unparse(head)
    if "." in text:
        owner, _, name = text.rpartition(".")
        return f"{owner}:{name}"
    return _imports(tree).get(text, f"{module}:{text}")


def _target(loc: Located, installed: Installed, merged: bool) -> CarriedTarget:
    assert loc.module is not None and loc.qualname is not None
    node = _installed_def(installed, loc.module, loc.qualname)
    path = next(p for p in installed.files if module_of(p) == loc.module)
    parsed = installed.parsed(path)
    assert parsed is not None
    return CarriedTarget(
        loc,
        loc.module,
        loc.qualname,
        loc.symbol.qualname.rpartition(".")[2],
        _parameters(node),
        _decorator(node, loc.module, parsed[1].tree),
        merged,
    )


def _merged_source(loc: Located, clone: Clone, pr: PullRequest, installed: Installed) -> str:
    """The installed module's text with this pull request's hunks merged into the symbol."""
    assert loc.module is not None and loc.qualname is not None
    symbol = loc.symbol
    path = next(p for p in installed.files if module_of(p) == loc.module)
    parsed = installed.parsed(path)
    base_text = clone.text(pr.base.sha, symbol.old_path or symbol.path)
    new_text = clone.text(pr.new.sha, symbol.path)
    assert parsed is not None and base_text is not None and new_text is not None
    text, units = parsed
    mine = segment(text, units, loc.qualname)
    base = segment(base_text, map_units(base_text), symbol.qualname)
    new = segment(new_text, map_units(new_text), symbol.qualname)
    assert mine is not None and base is not None and new is not None
    merged = _merge_naming_blame(mine, base, new, symbol, clone, pr, base_text)
    scope = units.scope(loc.qualname)
    assert scope is not None
    lines = text.splitlines(keepends=True)
    merged_text = "".join(lines[: scope.first - 1]) + merged + "".join(lines[scope.last :])
    return with_module_imports(merged_text, _new_imports(base_text, new_text))


def with_module_imports(text: str, imports: str) -> str:
    """``text`` with ``imports`` (whole lines) at module level: after its last top-level
    import, else at its top (after a docstring and ``from __future__``). Never beside the
    merged symbol: a method's place is inside its class, where an import line would end
    the class body."""
    if not imports:
        return text
    body = _module_body(text)
    found: list[ast.stmt] = [s for s in body if isinstance(s, ast.Import | ast.ImportFrom)]
    if not found and body and isinstance(body[0], ast.Expr):  # the module's docstring
        found = [body[0]]
    after = (found[-1].end_lineno or 0) if found else 0
    lines = text.splitlines(keepends=True)
    if after and not lines[after - 1].endswith("\n"):
        lines[after - 1] += "\n"
    return "".join(lines[:after]) + imports + "".join(lines[after:])


def _module_body(text: str) -> list[ast.stmt]:
    with warnings.catch_warnings():  # upstream's invalid escapes are not ours to warn of
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(text).body


def _import_texts(text: str) -> list[str]:
    found = [s for s in _module_body(text) if isinstance(s, ast.Import | ast.ImportFrom)]
    return [ast.get_source_segment(text, s) or ast.unparse(s) for s in found]


def _new_imports(base_text: str, new_text: str) -> str:
    """The module-level imports the pull request adds, as lines: a drifted symbol is merged
    into the installed text, which lacks them, and the fixed code may use them (the
    vendored module repeats them; a ``megatron`` name is a live look-up the reads check
    finds on the installed release, or refuses)."""
    had = set(_import_texts(base_text))
    return "".join(f"{line}\n" for line in _import_texts(new_text) if line not in had)


@dataclass
class _Plan:
    sources: dict[str, str]
    pieces: list[_tool.Piece]
    targets: list[CarriedTarget]
    carried: list[str]
    left_out: list[str]
    decorators: dict[str, list[str]] = field(default_factory=dict)
    added: list[CarriedTarget] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)  # class attribute lines to append


def _undecorated(source: str, name: str) -> tuple[str, list[str]]:
    """``source`` without the decorator lines of its top-level ``def name``, and their texts:
    the applier decorates the vendored body with the live decorator, as for a method."""
    node = next(
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name
    )
    texts = [ast.get_source_segment(source, d) or ast.unparse(d) for d in node.decorator_list]
    if not node.decorator_list:
        return source, texts
    lines = source.splitlines(keepends=True)
    first = min(d.lineno for d in node.decorator_list)
    return "".join(lines[: first - 1] + lines[node.lineno - 1 :]), texts


def _plan(
    located: list[Located], clone: Clone, pr: PullRequest, installed: Installed, conflicts: str
) -> _Plan:
    plan = _Plan({}, [], [], [], [])
    helpers, added, constants = [], [], []
    for loc in located:
        symbol = loc.symbol
        if symbol.kind in ("comment", "import", "inert"):
            continue
        if loc.status == "not shipped":
            plan.left_out.append(f"{symbol.shown}: {loc.how}")
        elif symbol.kind in _ADDED and loc.status == "new":
            added.append(loc)
        elif symbol.kind in _ADDED:
            raise Refused(f"{symbol.shown}: {loc.how}; the fix adds it: check by hand")
        elif loc.status == "absent":
            raise NotProven(
                f"{symbol.shown} is {loc.how}: there is nothing installed to patch",
                Reason.OUTSIDE_RELEASE,
            )
        elif loc.status == "new":
            helpers.append(loc)
        elif symbol.kind == "changed constant" and loc.status == "identical":
            constants.append(loc)
        elif symbol.kind == "changed constant":
            raise Refused(
                f"{symbol.shown} changed since the release ({loc.how}): a changed constant is "
                "carried only where the installed one is the pull request's base"
            )
        elif symbol.kind in ("function", "method"):
            merged = loc.status == "drifted"
            key = f"{symbol.path}@{'installed+pr' if merged else pr.new.sha[:12]}"
            try:
                if key not in plan.sources:
                    plan.sources[key] = (
                        _merged_source(loc, clone, pr, installed)
                        if merged
                        else clone.text(pr.new.sha, symbol.path) or ""
                    )
                elif merged:  # a second drifted symbol of the same file: merge it in too
                    plan.sources[key] = _merge_into(plan.sources[key], loc, clone, pr)
            except Conflict:
                if conflicts != "installed":
                    raise
                # --keep-unfinished: the installed text stands where the merge failed.
                path = next(p for p in installed.files if module_of(p) == loc.module)
                plan.sources.setdefault(key, (installed.parsed(path) or ("",))[0])
            target = _target(loc, installed, merged)
            _refuse_accessors_in(plan.sources[key], symbol.qualname, symbol.shown)
            plan.targets.append(target)
            plan.pieces.append(_tool.Piece(key, target.module, symbol.qualname))
    for piece, target in zip(plan.pieces, plan.targets, strict=False):
        if "." not in target.upstream and target.decorator is not None:
            plan.sources[piece.path], texts = _undecorated(
                plan.sources[piece.path], target.upstream
            )
            plan.decorators[target.upstream] = texts
    if not plan.targets:
        left = f" (left out: {'; '.join(plan.left_out)})" if plan.left_out else ""
        raise NotProven(
            f"the pull request changes no installed function or method to swap{left}",
            Reason.OUTSIDE_RELEASE,
        )
    for loc in added:
        _plan_added(plan, loc, clone, pr)
    for loc in constants:  # replaced on the installed module (the module-attribute kind)
        assert loc.module is not None
        key = f"{loc.symbol.path}@{pr.new.sha[:12]}"
        plan.sources.setdefault(key, clone.text(pr.new.sha, loc.symbol.path) or "")
        plan.pieces.append(_tool.Piece(key, loc.module, loc.symbol.qualname, carried=True))
        name = loc.symbol.qualname
        plan.added.append(
            CarriedTarget(loc, loc.module, name, name, (), None, False, added="constant")
        )
    for loc in helpers:
        key = f"{loc.symbol.path}@{pr.new.sha[:12]}"
        plan.sources.setdefault(key, clone.text(pr.new.sha, loc.symbol.path) or "")
        module = loc.module or module_of(loc.symbol.path)
        plan.pieces.append(_tool.Piece(key, module, loc.symbol.qualname, carried=True))
        plan.carried.append(loc.symbol.qualname)
    return plan


_ADDED = ("new method", "new class attribute")
_ATTRIBUTES_ORIGIN = (
    "# origin: derived by backports new --from-pr: upstream's code at the pull request's\n"
    "#         commit; the class attributes it adds are written at the end as module\n"
    "#         constants. Module globals are looked up on the live upstream modules.\n"
)
_WRAPS = ("staticmethod", "classmethod", "property")


def _plan_added(plan: _Plan, loc: Located, clone: Clone, pr: PullRequest) -> None:
    """A method the fix adds is vendored as a method piece (upstream's text, dedented); a
    class attribute's literal is written as a module constant beside the pieces. Either is
    set on the installed class at install (the added-attribute kind)."""
    symbol = loc.symbol
    assert loc.module is not None
    key = f"{symbol.path}@{pr.new.sha[:12]}"
    source = plan.sources.setdefault(key, clone.text(pr.new.sha, symbol.path) or "")
    units = map_units(source)
    owner, _, name = symbol.qualname.rpartition(".")
    if symbol.kind == "new method":
        scope = units.scope(symbol.qualname)
        assert scope is not None and isinstance(scope.node, ast.FunctionDef)
        node = scope.node
        texts = [ast.unparse(d) for d in node.decorator_list]
        if len(texts) > 1 or (texts and texts[0] not in _WRAPS):
            raise Refused(f"{symbol.shown} carries @{', @'.join(texts)}: no kind adds it bound so")
        target = CarriedTarget(
            loc, loc.module, symbol.qualname, name, _parameters(node), None, False,
            added="method", wrap=texts[0] if texts else "",
        )  # fmt: skip
        plan.pieces.append(_tool.Piece(key, loc.module, symbol.qualname))
    else:
        scope = units.scope(owner)
        assert scope is not None and isinstance(scope.node, ast.ClassDef)
        stmt = next(s for s in scope.node.body if name in _bound_by(s))
        value = getattr(stmt, "value", None)
        assert value is not None
        replacement = f"_added_{owner}_{name}"
        text = ast.get_source_segment(source, value) or ast.unparse(value)
        plan.attributes.append(
            f"# {symbol.qualname}, which the pull request adds (upstream's value): the\n"
            f"# backport sets it on the installed {owner} at install.\n"
            f"{replacement} = {text}\n"
        )
        target = CarriedTarget(
            loc, loc.module, symbol.qualname, replacement, (), None, False,
            added="class attribute",
        )  # fmt: skip
    plan.added.append(target)


def _rename_clashes(plan: _Plan) -> None:
    """Targets of one name (two ``__init__``s, a helper duplicated in two modules) are
    defined in the vendored module under names of their own (``<module>_<Class>___init__``):
    each target's ``replacement`` names its function."""
    names = [t.replacement for t in [*plan.targets, *plan.added]]
    clashes = {n for n in names if names.count(n) > 1}
    if not clashes:
        return
    with_pieces = [t for t in [*plan.targets, *plan.added] if t.added != "class attribute"]
    for index, target in enumerate(with_pieces):
        if target.replacement not in clashes:
            continue
        unique = f"{target.module.rpartition('.')[2]}_{target.attribute.replace('.', '_')}"
        renamed = dataclasses.replace(target, replacement=unique)
        owner = plan.targets if target in plan.targets else plan.added
        owner[owner.index(target)] = renamed
        plan.pieces[index] = dataclasses.replace(plan.pieces[index], defined_as=unique)
    names = [t.replacement for t in [*plan.targets, *plan.added]]
    clashes = {n for n in names if names.count(n) > 1}
    if clashes:
        raise Refused(f"two targets are both named {min(clashes)}: one module cannot hold both")


def _merge_naming_blame(
    mine: str, base: str, new: str, symbol: Symbol, clone: Clone, pr: PullRequest, base_text: str
) -> str:
    """``merge_symbol``; a conflict also names the upstream commits (and their pull
    requests) that last changed the base lines of its first hunk: the change the installed
    release lacks, which this one needs first."""
    try:
        return merge_symbol(mine, base, new, symbol.shown)
    except Conflict as exc:
        blamed = _blamed(exc, base, symbol, clone, pr, base_text)
        if not blamed:
            raise
        first, _, hunk = str(exc).partition("\n")
        needs = f"; those lines were last changed upstream by {blamed}: carry that first"
        raise Conflict(f"{first}{needs}\n{hunk}") from exc


def _blamed(
    exc: Conflict, base: str, symbol: Symbol, clone: Clone, pr: PullRequest, base_text: str
) -> str:
    """``abc123def456 (#6252), ...`` for the base lines of ``exc``'s first hunk; "" if none."""
    wanted = exc.base_lines()
    scope = map_units(base_text).scope(symbol.qualname)
    ours = base.splitlines()
    at = next(
        (i for i in range(len(ours) - len(wanted) + 1) if ours[i : i + len(wanted)] == wanted),
        None,
    )
    if not wanted or scope is None or at is None:
        return ""
    first = scope.first + at
    path = symbol.old_path or symbol.path
    commits = clone.last_changed(pr.base.sha, path, first, first + len(wanted) - 1)
    names = []
    for sha in commits[:3]:
        number = re.search(r"\(#(\d+)\)\s*$", clone.subject(sha))
        names.append(f"{sha[:12]} (#{number.group(1)})" if number else sha[:12])
    return ", ".join(names)


def _merge_into(source: str, loc: Located, clone: Clone, pr: PullRequest) -> str:
    """``source`` (already merged for another symbol) with ``loc``'s hunks merged in."""
    symbol = loc.symbol
    base_text = clone.text(pr.base.sha, symbol.old_path or symbol.path) or ""
    new_text = clone.text(pr.new.sha, symbol.path) or ""
    units = map_units(source)
    mine = segment(source, units, symbol.qualname)
    base = segment(base_text, map_units(base_text), symbol.qualname)
    new = segment(new_text, map_units(new_text), symbol.qualname)
    assert mine is not None and base is not None and new is not None
    scope = units.scope(symbol.qualname)
    assert scope is not None
    lines = source.splitlines(keepends=True)
    merged = _merge_naming_blame(mine, base, new, symbol, clone, pr, base_text)
    return "".join(lines[: scope.first - 1]) + merged + "".join(lines[scope.last :])


def _live_expr(module: str, main: str) -> str:
    return f"{_tool.LIVE_TARGET}()" if module == main else f'{_tool.LIVE_MODULE}("{module}")'


def _spell_out_super(text: str, targets: list[CarriedTarget], main: str) -> str:
    """``super()`` in a vendored method -> ``super(<live class>, <first parameter>)``: the
    function is not defined in the class body, so it has no ``__class__`` cell."""
    tree = ast.parse(text)
    methods = {t.replacement: t for t in targets if "." in t.attribute}
    edits: list[tuple[int, int, int, str]] = []
    for func in tree.body:
        target = methods.get(getattr(func, "name", ""))
        if not isinstance(func, ast.FunctionDef) or target is None:
            continue
        owner = target.attribute.partition(".")[0]
        first = func.args.posonlyargs + func.args.args
        for node in ast.walk(func):
            name = getattr(node, "id", None) or getattr(node, "attr", None) or ""
            if name == "__class__" or (name.startswith("__") and not name.endswith("__")):
                raise Refused(
                    f"{target.attribute} uses {name}, which only works inside its class body"
                )
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "super"
                and not node.args
                and first
            ):
                live = f"super({_live_expr(target.module, main)}.{owner}, {first[0].arg})"
                assert node.end_col_offset is not None
                edits.append((node.lineno, node.col_offset, node.end_col_offset, live))
    lines = [line.encode("utf-8") for line in text.splitlines(keepends=True)]
    for lineno, start, end, new in sorted(edits, reverse=True):
        line = lines[lineno - 1]
        lines[lineno - 1] = line[:start] + new.encode("utf-8") + line[end:]
    result = b"".join(lines).decode("utf-8")
    ast.parse(result)  # still Python
    return result


def _literal(tree: ast.Module, name: str) -> object:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in stmt.targets
        ):
            return ast.literal_eval(stmt.value)
    return None


def _bound_by(stmt: ast.stmt) -> set[str]:
    names: set[str] = set()
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
    elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        names.add(stmt.name)
    else:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _top_level_names(installed: Installed, module: str) -> tuple[set[str], set[str]]:
    """(every name the installed module may bind at top level, those it always binds):
    a name bound only in a ``try``/``if`` (an optional kernel) is not always there."""
    path = next((p for p in installed.files if module_of(p) == module), None)
    parsed = installed.parsed(path) if path else None
    if parsed is None:
        return set(), set()
    always: set[str] = set()
    maybe: set[str] = set()
    for stmt in parsed[1].tree.body:
        if isinstance(stmt, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for inner in ast.walk(stmt):
                if isinstance(inner, ast.stmt) and inner is not stmt:
                    maybe |= _bound_by(inner)
        else:
            always |= _bound_by(stmt)
    return always | maybe, always


def _check_reads(reads: dict[str, tuple[str, ...]], installed: Installed) -> None:
    """Every name the vendored code looks up live must be on the installed module."""
    for module, names in reads.items():
        have, _ = _top_level_names(installed, module)
        missing = sorted(set(names) - have)
        if missing:
            raise NotProven(
                f"the vendored code reads {', '.join(missing)} from {module}, which "
                f"{installed.name} {installed.version} does not define: another upstream "
                "change it depends on is missing",
                Reason.OUTSIDE_RELEASE,
            )


def _helpers(
    reads: tuple[str, ...], target: CarriedTarget, installed: Installed
) -> tuple[str, ...]:
    """The reads the probe may require of the target's module: those it always binds (one
    bound only where an optional package imports is read only on that package's path)."""
    _, always = _top_level_names(installed, target.module)
    return tuple(name for name in reads if name in always)


def _merged_note(text: str, targets: list[CarriedTarget]) -> str:
    merged = [t.attribute for t in targets if t.merged]
    if not merged:
        return text
    named = "".join(f"#           {name}\n" for name in merged)
    lines = (
        "# origin: derived by backports new --from-pr: upstream's code at the pull request's\n"
        "#         commit, except what follows, which is the installed text with only this\n"
        "#         pull request's hunks merged in (the installed code had drifted):\n"
        f"{named}"
        "#         Module globals are looked up on the live upstream modules.\n"
    )
    if _tool.SYNCED_ORIGIN_LINES not in text:
        return lines + text
    return text.replace(_tool.SYNCED_ORIGIN_LINES, lines, 1)


def vendor(
    located: list[Located],
    clone: Clone,
    pr: PullRequest,
    installed: Installed,
    *,
    repo_url: str,
    first: str | None = None,
    conflicts: str = "stop",
) -> VendoredCode:
    """The vendored module for every carried symbol; ``NotProven`` or ``Refused`` in one
    line (a merge conflict shows its hunk below it)."""
    plan = _plan(located, clone, pr, installed, conflicts)
    if first is not None:  # the sniffed target leads: its module is the vendored module's
        order = sorted(range(len(plan.targets)), key=lambda i: plan.targets[i].attribute != first)
        plan.targets = [plan.targets[i] for i in order]
        plan.pieces = [plan.pieces[i] for i in order] + plan.pieces[len(order) :]
    main = plan.targets[0].module
    _rename_clashes(plan)
    provenance = _tool.Provenance(
        repo=repo_url,
        pr=pr.number,
        sha=pr.new.sha,
        path=plan.targets[0].located.symbol.path,
        symbol=", ".join(t.upstream for t in plan.targets),
        target_module=main,
    )
    try:
        rendered, decorators = _tool.render_pieces(plan.sources, plan.pieces, provenance)
    except _tool.SyncError as exc:
        raise NotProven(f"cannot vendor it: {exc}", Reason.SHAPE) from exc
    text = _spell_out_super(rendered.text, [*plan.targets, *plan.added], main)
    text = _merged_note(text, plan.targets)
    if plan.attributes:  # written beside upstream's pieces: a sync would not re-render them
        text = text.replace(_tool.SYNCED_ORIGIN_LINES, _ATTRIBUTES_ORIGIN, 1)
        text += "".join(f"\n\n{a}" for a in plan.attributes)
    tree = ast.parse(text)
    listed = _literal(tree, "__reads__") or ()
    others = _literal(tree, "__reads_from__") or {}
    assert isinstance(listed, tuple) and isinstance(others, dict)
    main_reads = tuple(str(name) for name in listed)
    reads_from = {str(k): tuple(v) for k, v in others.items()}
    _check_reads({main: main_reads, **reads_from}, installed)
    targets = [
        CarriedTarget(
            t.located,
            t.module,
            t.attribute,
            t.replacement,
            t.parameters,
            t.decorator,
            t.merged,
            _helpers(
                main_reads if t.module == main else reads_from.get(t.module, ()), t, installed
            ),
        )
        for t in plan.targets
    ]
    file = re.sub(r"\W", "_", main.rpartition(".")[2]) + ".py"
    return VendoredCode(
        text,
        file,
        tuple(targets),
        tuple(plan.carried),
        {**plan.decorators, **decorators},
        main_reads,
        reads_from,
        rendered.segment,
        tuple(plan.left_out),
        tuple(plan.added),
    )
