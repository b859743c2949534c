"""The module-attribute kind: a module-level object that is not a function.

A Triton kernel (``triton.jit``'s ``JITFunction``, an ``Autotuner`` around it), a table:
code that reads it as a module global at call time sees a replacement put in its module.
Like a function, it may have been imported by name elsewhere, so every module that binds
that very object gets the replacement, and ``revert`` puts the very original back at each.
Such an object may not carry ``__backport__`` / ``__wrapped__``: the record of what was
replaced is the installation kept on the session (``applied()`` and ``status`` read it there).

A value Python shares between unrelated bindings (a small int, a string, a tuple: ``LIMIT =
64`` is the very object ``os.O_CREAT`` is) cannot be told apart by identity: besides its
defining module, it is rebound (and put back) only in the modules whose source imports it by
name from the target module (``from m import LIMIT``, ``from .m import LIMIT as CAP``, ``from
m import *``); an equal value anywhere else is left alone.
"""

import ast
import contextlib
import importlib.util
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType

from ..evidence.fingerprints import installed_file
from ..model import Target
from ..session import SESSION
from . import Part, Site
from ._base import BaseKind, lacking
from ._bindings import bindings_of_each, rebind, rebind_everywhere, restore_everywhere

_LOG = logging.getLogger(__name__)

# Values Python may share between unrelated bindings (interned, cached or constant-folded):
# an identical object elsewhere is no alias of the target.
_SHARED_BY_VALUE = (int, float, complex, str, bytes, tuple, frozenset, range, type(None))


@dataclass(frozen=True)
class ModuleAttribute(Target):
    """A module-level object a backport replaces (``attribute`` is its name in the module).

    ``type_name`` ("module:qualname", e.g. "triton.runtime.autotuner:Autotuner") is the type
    the vendored replacement was written against: an object of another type is not the
    target (``incompatible``). Empty: any type.
    """

    parameters: tuple[str, ...] = ()
    type_name: str = ""


@dataclass(frozen=True)
class ResolvedAttribute:
    """``module`` defines ``original`` as ``attribute``; ``installed`` is our replacement
    when one is live (what stood there before it is ``original``)."""

    imported_as: str
    module: ModuleType
    attribute: str
    original: object
    installed: object = None

    @property
    def module_name(self) -> str:
        return self.module.__name__

    @property
    def name(self) -> str:
        return self.attribute


def _type_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _ours(backport_id: str, module: ModuleType, attribute: str, held: object) -> object:
    """What stood at the site before our installation, if ``held`` is our replacement."""
    installation = SESSION.installed.get(backport_id)
    for part in getattr(installation, "parts", ()):
        resolved = part.resolved
        if (
            isinstance(resolved, ResolvedAttribute)
            and resolved.module is module
            and resolved.attribute == attribute
            and part.replacement is held
        ):
            return resolved.original
    return None


def _in(module: ModuleType, target: Target, backport_id: str) -> ResolvedAttribute | None:
    if target.attribute not in vars(module):
        return None  # not defined here (a forwarder's getattr would hand another module's)
    held = vars(module)[target.attribute]
    before = _ours(backport_id, module, target.attribute, held)
    if before is not None:
        return ResolvedAttribute(module.__name__, module, target.attribute, before, held)
    return ResolvedAttribute(module.__name__, module, target.attribute, held)


def _shared_by_value(obj: object) -> bool:
    return isinstance(obj, _SHARED_BY_VALUE) or obj is Ellipsis


def _module_level_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """The ``from ... import`` statements that bind module globals (not inside a function
    or a class: those bind locals or class attributes)."""
    found: list[ast.ImportFrom] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ImportFrom):
            found.append(node)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            pending.extend(ast.iter_child_nodes(node))
    return found


def _source_tree(module: object, words: Sequence[str]) -> ast.Module | None:
    """The module's source parsed, or None where it has none or lacks one of ``words``
    (a small int is held by hundreds of modules: most are ruled out without parsing)."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    try:
        with open(path, encoding="utf-8") as source:
            text = source.read()
        if not all(word in text for word in words):
            return None
        return ast.parse(text, path)
    except (OSError, SyntaxError, ValueError) as exc:
        _LOG.debug("cannot read %s to tell its imports: %r", path, exc)
        return None


def _imports_by_name(site: Site, defining: Site) -> bool:
    """Whether the module of ``site`` binds ``site[1]`` by importing ``defining[1]`` from the
    module ``defining[0]`` (its source says so): an alias, not an equal value of its own."""
    module = sys.modules.get(site[0])
    # What an import of it must spell: the defining module's last name, and the name
    # itself unless a star import binds it under that very name.
    words = [defining[0].rpartition(".")[2], *([] if site[1] == defining[1] else [defining[1]])]
    tree = _source_tree(module, words) if module is not None else None
    if tree is None:
        return False  # cannot tell: left alone
    package = getattr(module, "__package__", None) or ""
    for node in _module_level_imports(tree):
        try:
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        except (ImportError, ValueError):
            continue
        if source != defining[0]:
            continue
        for alias in node.names:
            if alias.name == "*" and site[1] == defining[1]:
                return True
            if alias.name == defining[1] and (alias.asname or alias.name) == site[1]:
                return True
    return False


def _true_aliases(
    defining: Site, olds: Sequence[object], aliases: dict[int, list[Site]]
) -> dict[int, list[Site]]:
    """``aliases`` of ``olds`` with, for a value shared by value, only the modules that
    import it by name from the defining module."""
    kept = dict(aliases)
    for old in olds:
        if _shared_by_value(old):
            found = aliases.get(id(old), [])
            kept[id(old)] = [s for s in found if s == defining or _imports_by_name(s, defining)]
    return kept


class ModuleAttributeKind(BaseKind[ResolvedAttribute]):
    """Found in the module that defines it; replaced there and at every alias."""

    name = "module-attribute"

    def found_in(
        self, module: ModuleType, target: Target, backport_id: str
    ) -> ResolvedAttribute | None:
        return _in(module, target, backport_id)

    def refusal(
        self, target: Target, resolved: ResolvedAttribute, reads: Sequence[str]
    ) -> str | None:
        wanted = getattr(target, "type_name", "")
        actual = _type_name(resolved.original)
        if wanted and actual != wanted:
            return f"{resolved.module_name}.{target.attribute} is a {actual}, expected {wanted}"
        return lacking(resolved.module, target, reads)

    def fingerprint(self, target: Target, resolved: ResolvedAttribute) -> dict[str, object] | None:
        if resolved.installed is not None:
            return None
        source = getattr(resolved.module, "__file__", None)
        installed = installed_file(target.distribution, resolved.module_name, source)
        if installed is None:
            return None
        return {
            "module": resolved.module_name,
            "attribute": target.attribute,
            "file": installed["file"],
            "file_sha256": installed["file_sha256"],
            "type": _type_name(resolved.original),
            "distribution": installed["distribution"],
        }

    def stand_in(
        self, target: Target, resolved: ResolvedAttribute, replacement: object
    ) -> ResolvedAttribute:
        return replace(resolved, original=replacement, installed=None)

    def aliases(self, resolved: ResolvedAttribute) -> list[object]:
        olds = [resolved.original]
        if resolved.installed is not None:
            olds.append(resolved.installed)
        return olds

    def install(
        self,
        backport_id: str,
        target: Target,
        resolved: ResolvedAttribute,
        replacement: object,
        markers: Mapping[str, object],
        aliases: dict[int, list[Site]],
    ) -> Part:
        held = vars(resolved.module).get(resolved.attribute)
        olds = self.aliases(resolved)
        if not any(held is old for old in olds):
            raise LookupError(f"{resolved.module_name}.{resolved.attribute} is not the original")
        defining = (resolved.module_name, resolved.attribute)
        sites = rebind_everywhere(
            defining, olds, replacement, _true_aliases(defining, olds, aliases)
        )
        return Part(self, backport_id, target, resolved, replacement, sites)

    def uninstall(self, part: Part) -> None:
        resolved = self.record_of(part)
        defining = (resolved.module_name, resolved.attribute)
        new = part.replacement
        if _shared_by_value(new):
            # Only the recorded sites and the modules that import it by name since: the
            # same small int elsewhere is someone else's.
            late = [s for s in bindings_of_each([new])[id(new)] if _imports_by_name(s, defining)]
            rebind(tuple(dict.fromkeys([*part.sites, *late])), new, resolved.original, defining)
        else:
            restore_everywhere(part.sites, new, resolved.original, defining)
        # The module object patched at install time, even when a fresh import replaced it.
        if vars(resolved.module).get(resolved.attribute) is part.replacement:
            setattr(resolved.module, resolved.attribute, resolved.original)

    def is_live(self, part: Part) -> bool:
        resolved = self.record_of(part)
        module = sys.modules.get(resolved.module_name)
        return module is resolved.module and (
            vars(module).get(resolved.attribute) is part.replacement
        )

    def bound(self, resolved: ResolvedAttribute) -> object:
        return vars(resolved.module).get(resolved.attribute)

    def evidence(self, target: Target, resolved: ResolvedAttribute) -> dict[str, object]:
        return {
            "module": resolved.module_name,
            "imported_as": resolved.imported_as,
            "attribute": target.attribute,
            "kind": self.name,
            "type": _type_name(resolved.original),
            "installed": resolved.installed is not None,
        }

    @contextlib.contextmanager
    def unlike_any_version(self, target: Target, resolved: ResolvedAttribute) -> Iterator[bool]:
        if not getattr(target, "type_name", ""):
            yield False  # any type is accepted: no shape to differ
            return
        held = vars(resolved.module)[resolved.attribute]
        setattr(resolved.module, resolved.attribute, _Unlike())
        try:
            yield True
        finally:
            setattr(resolved.module, resolved.attribute, held)


class _Unlike:
    """An object of a type no version of any target has."""


KIND = ModuleAttributeKind()
