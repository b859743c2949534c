"""The added-attribute kind: a name the fix adds to an existing class or module.

A fix often adds a method (or a class attribute) beside the one it changes, and the changed
code calls it (``self._shown_value()``): the installed class lacks it, so the backport adds
it at install and deletes it at revert. Nothing stood there, so nothing is wrapped or put
back: what "stood there" is ``ABSENT``. A name that is already there (the class defines it,
inherits it from a base other than ``object``, or the fix landed upstream) is never
overwritten, and a class that defines ``__slots__`` is left alone: the probe refuses it
(``incompatible``) and says why.
"""

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType

from ..model import Target
from ..session import SESSION
from . import Part, Site
from ._base import BaseKind

# How a method the fix adds is bound in its class (its decorator in upstream's text).
WRAPS = {"": None, "staticmethod": staticmethod, "classmethod": classmethod, "property": property}


class _Absent:
    """What stands where an added name is not set: nothing (one object, compared by
    identity, so a revert can be checked to have put "nothing" back)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


@dataclass(frozen=True)
class AddedAttribute(Target):
    """A name the fix adds: ``attribute`` is "Class.name" (a method or class attribute of
    an installed class) or "name" (a module-level constant). ``wrap``: "staticmethod",
    "classmethod" or "property" where the added method is one; "" otherwise."""

    parameters: tuple[str, ...] = ()
    wrap: str = ""


@dataclass(frozen=True)
class ResolvedAdded:
    """Where the name goes (``owner``: the class, or the module), what stands there now
    (``original``: ``ABSENT`` unless the name exists), and our replacement when live."""

    imported_as: str
    module: ModuleType
    owner: object
    attribute: str
    original: object = ABSENT
    installed: object = None

    @property
    def module_name(self) -> str:
        return self.module.__name__

    @property
    def name(self) -> str:
        return self.attribute.rpartition(".")[2]


def _owner(module: ModuleType, target: Target) -> object | None:
    owner_name = target.owner_name
    if owner_name is None:
        return module
    owner = vars(module).get(owner_name)
    return owner if isinstance(owner, type) else None


def _ours(backport_id: str, owner: object, name: str, held: object) -> bool:
    installation = SESSION.installed.get(backport_id)
    return any(
        isinstance(part.resolved, ResolvedAdded)
        and part.resolved.owner is owner
        and part.resolved.name == name
        and part.replacement is held
        for part in getattr(installation, "parts", ())
    )


def _in(module: ModuleType, target: Target, backport_id: str) -> ResolvedAdded | None:
    owner = _owner(module, target)
    if owner is None:
        return None  # the class is not defined here
    held = vars(owner).get(target.name, ABSENT)
    base = ResolvedAdded(module.__name__, module, owner, target.attribute)
    if held is ABSENT:
        return base
    if _ours(backport_id, owner, target.name, held):
        return replace(base, installed=held)
    return replace(base, original=held)


def _inherited(owner: object, name: str) -> type | None:
    """The base class (other than ``object``) that already gives ``owner`` the name."""
    if not isinstance(owner, type):
        return None
    return next((c for c in owner.__mro__[1:] if c is not object and name in vars(c)), None)


class AddedAttributeKind(BaseKind[ResolvedAdded]):
    """Set on its class (or module) at install, deleted at revert; never overwrites."""

    name = "added-attribute"

    def found_in(
        self, module: ModuleType, target: Target, backport_id: str
    ) -> ResolvedAdded | None:
        return _in(module, target, backport_id)

    def refusal(self, target: Target, resolved: ResolvedAdded, reads: Sequence[str]) -> str | None:
        where = f"{resolved.module_name}.{target.attribute}"
        if resolved.original is not ABSENT:
            return (
                f"{where} already exists, and the fix adds it: the release has it (landed "
                "upstream?) or another change does; check by hand"
            )
        base = _inherited(resolved.owner, resolved.name)
        if base is not None:
            return f"{where} would shadow {base.__qualname__}.{resolved.name}: check by hand"
        if isinstance(resolved.owner, type) and "__slots__" in vars(resolved.owner):
            return f"{resolved.module_name}.{target.owner_name} defines __slots__: not extended"
        missing = [
            name for name in dict.fromkeys(target.helpers) if name not in vars(resolved.module)
        ]
        if missing:
            return f"{resolved.module_name} lacks {', '.join(missing)}"
        return None

    def fingerprint(self, target: Target, resolved: ResolvedAdded) -> dict[str, object] | None:
        return None  # no installed code of its own: the entry's other targets decide

    def replacement(self, target: Target, vendored_module: ModuleType) -> object:
        value = getattr(vendored_module, target.replacement_name)
        wrap = WRAPS[getattr(target, "wrap", "")]
        return value if wrap is None else wrap(value)

    def stand_in(
        self, target: Target, resolved: ResolvedAdded, replacement: object
    ) -> ResolvedAdded:
        return replace(resolved, original=replacement, installed=None)

    def install(
        self,
        backport_id: str,
        target: Target,
        resolved: ResolvedAdded,
        replacement: object,
        markers: Mapping[str, object],
        aliases: dict[int, list[Site]],
    ) -> Part:
        held = vars(resolved.owner).get(resolved.name, ABSENT)
        if held is not ABSENT:
            raise LookupError(f"{resolved.module_name}.{target.attribute} exists: not added")
        setattr(resolved.owner, resolved.name, replacement)
        site: Site = (resolved.module_name, target.attribute)
        return Part(self, backport_id, target, resolved, replacement, (site,))

    def uninstall(self, part: Part) -> None:
        resolved = self.record_of(part)
        if vars(resolved.owner).get(resolved.name, ABSENT) is part.replacement:
            delattr(resolved.owner, resolved.name)

    def is_live(self, part: Part) -> bool:
        resolved = self.record_of(part)
        module = sys.modules.get(resolved.module_name)
        if module is not resolved.module or _owner(module, part.target) is not resolved.owner:
            return False
        return vars(resolved.owner).get(resolved.name, ABSENT) is part.replacement

    def bound(self, resolved: ResolvedAdded) -> object:
        return vars(resolved.owner).get(resolved.name, ABSENT)

    def evidence(self, target: Target, resolved: ResolvedAdded) -> dict[str, object]:
        return {
            "module": resolved.module_name,
            "imported_as": resolved.imported_as,
            "attribute": target.attribute,
            "kind": self.name,
            "exists": resolved.original is not ABSENT,
            "installed": resolved.installed is not None,
        }

    def reverted(self, parts: Sequence[Part]) -> str:
        return f"removed {', '.join(f'{m}.{a}' for part in parts for m, a in part.sites)}"


KIND = AddedAttributeKind()
