"""Step two: the pull request's diff as the symbols it changes, and the tests it touches.

Every hunk of a ``.py`` file under ``megatron/`` is mapped, old side in the base's text and
new side in the new text, to its unit (``units``); a unit only the new side has is a new
helper (a function or a constant the changed code may call). Under ``tests/``, every test
function the pull request added or changed becomes a pytest node id.
"""

import ast
from dataclasses import dataclass

from .clone import Clone
from .errors import Reason, Refused
from .inert import added_class_attributes, why_inert
from .model import PullRequest, Symbol
from .units import Unit, UnitMap, map_units

SOURCE_ROOT = "megatron/"
TESTS_ROOT = "tests/"


@dataclass(frozen=True)
class Changes:
    symbols: tuple[Symbol, ...]
    tests: tuple[str, ...]  # pytest node ids of tests added or changed
    other_files: tuple[str, ...]  # changed files that are neither (docs, configs, ...)


def _parse(text: str | None, where: str) -> UnitMap | None:
    if text is None:
        return None
    try:
        return map_units(text)
    except SyntaxError as exc:
        raise Refused(f"{where} does not parse: {exc}", Reason.UNREADABLE) from exc
    except (RecursionError, MemoryError) as exc:  # a 10,000-term expression, say
        why = f"{where} is too deeply nested to read ({type(exc).__name__})"
        raise Refused(why, Reason.UNREADABLE) from exc


@dataclass
class _Tally:
    unit: Unit
    old: bool = False  # seen on the base side
    new: bool = False
    lines: int = 0
    inner: set[str] | None = None


_Side = tuple[str, UnitMap] | None  # a module's text and units on one side of the diff


def _side(clone: Clone, sha: str, path: str | None) -> _Side:
    text = clone.text(sha, path) if path else None
    units = _parse(text, f"{path} at {sha[:12]}")
    return None if text is None or units is None else (text, units)


def _tally_file(
    clone: Clone, pr: PullRequest, old_path: str | None, new_path: str | None
) -> tuple[dict[str, _Tally], _Side, _Side]:
    old_side, new_side = _side(clone, pr.base.sha, old_path), _side(clone, pr.new.sha, new_path)
    old_map = old_side[1] if old_side else None
    new_map = new_side[1] if new_side else None
    base, new = pr.base.sha, pr.new.sha
    tallies: dict[str, _Tally] = {}

    def count(unit: Unit, side: str) -> None:
        tally = tallies.setdefault(unit.qualname, _Tally(unit, inner=set()))
        setattr(tally, side, True)
        tally.lines += 1
        if unit.inner and tally.inner is not None:
            tally.inner.add(unit.inner)

    if old_path and new_path:
        for hunk in clone.hunks(base, new, old_path, new_path):
            for line in hunk.old_lines():
                assert old_map is not None
                count(old_map.unit(line), "old")
            for line in hunk.new_lines():
                assert new_map is not None
                count(new_map.unit(line), "new")
    else:  # a whole file added or removed: each of its top-level units
        whole = new_map or old_map
        assert whole is not None
        side = "new" if new_map else "old"
        for scope in whole.scopes:  # every def: a test method of a new file counts too
            count(whole.unit(getattr(scope.node, "lineno", scope.first)), side)
    return tallies, old_side, new_side


_LEFT_IN_PLACE = ("function", "class body", "method")


def _module_level_removal(unit: Unit, new_map: UnitMap | None) -> bool:
    """A module-level function or class the fix deletes (a method with its whole class):
    what the backport may leave in place. A method deleted from a class that stays is not
    (a base class's method would answer in its place)."""
    if unit.kind not in _LEFT_IN_PLACE or new_map is None:
        return False
    owner = unit.qualname.split(".")[0]
    return "." not in unit.qualname or not _defined(new_map, owner)


def _plain_assignment(side: _Side, name: str) -> bool:
    """Whether ``name`` is bound at module level by one ``NAME = value`` (a constant a
    module-attribute target can replace), nothing else binding it."""
    if side is None or name.startswith("<"):
        return False
    binding = [s for s in side[1].tree.body if name in _names_bound(s)]
    return len(binding) == 1 and isinstance(binding[0], ast.Assign | ast.AnnAssign)


def _names_bound(stmt: ast.stmt) -> set[str]:
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _symbol(tally: _Tally, old: _Side, new: _Side) -> Symbol:
    unit = tally.unit
    old_map = old[1] if old else None
    new_map = new[1] if new else None
    in_old = old_map is not None and _defined(old_map, unit.qualname)
    in_new = new_map is not None and _defined(new_map, unit.qualname)
    kind, tags = unit.kind, list(unit.tags)
    if in_new and not in_old and unit.kind in ("function", "class body"):
        kind, tags = "new helper", ["new helper", *tags]
    elif in_new and not in_old and unit.kind == "method":
        kind, tags = "new method", ["new method", *tags]
    elif in_new and not in_old and unit.kind == "module statement":
        kind, tags = "new constant", ["new constant", *tags]
    elif in_old and not in_new and unit.kind == "import":
        pass  # an import line (named by its line): ignored like any import
    elif in_old and not in_new and _module_level_removal(unit, new_map):
        # A module-level function or class the fix deletes: the backport leaves it be (the
        # fixed code no longer calls it; nothing is looked up from it that was not before).
        kind, tags = "inert", ["inert: removed upstream, left in place", *tags]
    elif in_old and not in_new:
        kind, tags = "removed", ["removed", *tags]
    elif unit.kind != "comment":
        why = why_inert(unit.qualname, unit.kind, old, new, (tally.old, tally.new))
        if why is not None:  # dropped from what is carried; the report lists it
            kind, tags = "inert", [f"inert: {why}", *tags]
        elif unit.kind == "module statement" and _plain_assignment(new, unit.qualname):
            kind, tags = "changed constant", ["changed constant", *tags]
    return Symbol("", unit.qualname, kind, tuple(tags), tally.lines, None, tuple(tally.inner or ()))


def _class_attributes(tally: _Tally, old: _Side, new: _Side) -> list[Symbol] | None:
    """A class body change that only adds class attributes: one symbol per attribute
    ("Class.NAME"), carried where its value is a literal; None for any other change."""
    if tally.unit.kind != "class body":
        return None
    added = added_class_attributes(tally.unit.qualname, old, new)
    if added is None:
        return None
    symbols = []
    for name, stmt in added:
        value = getattr(stmt, "value", None)
        try:
            ast.literal_eval(value) if value is not None else None
            kind = "new class attribute"
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            kind = "new class attribute (not a literal)"
        lines = (stmt.end_lineno or stmt.lineno) - stmt.lineno + 1
        qualname = f"{tally.unit.qualname}.{name}"
        symbols.append(Symbol("", qualname, kind, (kind, *tally.unit.tags), lines))
    return symbols


def _defined(units: UnitMap, qualname: str) -> bool:
    if units.scope(qualname) is not None:
        return True
    return any(units.unit(getattr(s, "lineno", 0)).qualname == qualname for s in units.tree.body)


def _tests(tallies: dict[str, _Tally], path: str, old_map: UnitMap | None) -> list[str]:
    ids = []
    for qualname, tally in tallies.items():
        names = qualname.split(".")
        is_test = names[-1].startswith("test") and tally.new
        in_class = len(names) == 2 and names[0].startswith("Test")
        if is_test and (len(names) == 1 or in_class):
            ids.append(f"{path}::{'::'.join(names)}")
    # A test method whose nested helper changed counts as the test changing.
    for tally in tallies.values():
        for inner in tally.inner or ():
            names = inner.split(".")[:2]
            if names[-1].startswith("test") and f"{path}::{'::'.join(names)}" not in ids:
                ids.append(f"{path}::{'::'.join(names)}")
    del old_map
    return ids


def changed_symbols(clone: Clone, pr: PullRequest) -> Changes:
    """Every symbol under ``megatron/`` the pull request changes, and its tests."""
    symbols: list[Symbol] = []
    tests: list[str] = []
    other: list[str] = []
    for old_path, new_path in clone.changed_files(pr.base.sha, pr.new.sha):
        path = new_path or old_path
        assert path is not None
        is_python = path.endswith(".py")
        if is_python and path.startswith(SOURCE_ROOT):
            tallies, old_side, new_side = _tally_file(clone, pr, old_path, new_path)
            for tally in tallies.values():
                for symbol in _class_attributes(tally, old_side, new_side) or [
                    _symbol(tally, old_side, new_side)
                ]:
                    symbols.append(
                        Symbol(
                            path,
                            symbol.qualname,
                            symbol.kind,
                            symbol.tags,
                            symbol.lines,
                            old_path,
                            symbol.inner,
                        )
                    )
        elif is_python and path.startswith(TESTS_ROOT) and new_path is not None:
            name = path.rsplit("/", 1)[-1]
            if name.startswith("test_") or name.endswith("_test.py"):
                tallies, old_side, _ = _tally_file(clone, pr, old_path, new_path)
                tests += _tests(tallies, path, old_side[1] if old_side else None)
        else:
            other.append(path)
    return Changes(tuple(symbols), tuple(dict.fromkeys(tests)), tuple(other))
