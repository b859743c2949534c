"""The constructor kind: a class's ``__init__`` (or ``__post_init__``), replaced like a method.

A constructor fix reaches only the objects built after the install: an optimizer constructed
before ``apply()`` keeps what the old constructor set up. So this kind counts the instances
of the class alive when it is judged (``existing``); the decision puts the count in the
report, ``apply`` makes it the job's one warning, and ``status`` says the same. It also
records them at the install (``_built_before``): the entry's methods of the same class, which
may read what only the fixed constructor sets (#6099's ``count_zeros``), run the original
for them, so such an object keeps the installed release's behaviour rather than failing.
"""

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..model import ResolvedTarget, Target
from . import Part, Site
from ._built_before import forget, record
from .function import FunctionKind


@dataclass(frozen=True)
class Constructor(Target):
    """``Class.__init__`` (or ``Class.__post_init__``) of the class that defines it: objects
    built before the install are not reached, and the report says how many there are."""

    def problem_in(self, targets: Sequence[Target]) -> str | None:
        if self.owner_name is None or self.name not in ("__init__", "__post_init__"):
            wanted = "Class.__init__ or Class.__post_init__"
            return f"a Constructor target is {wanted}, not {self.attribute}"
        # Its methods learn of the objects built before it when they install after it.
        first = next(
            (t for t in targets if t.owner_name == self.owner_name and t.modules == self.modules),
            self,
        )
        if first is not self:
            return (
                f"the Constructor {self.attribute} must come before {first.attribute}, a "
                "method of its class (those route objects built before the install to the "
                "original)"
            )
        return None


def _with_subclasses(cls: type) -> set[type]:
    """``cls`` and every class derived from it, now."""
    found, todo = {cls}, [cls]
    while todo:
        subclasses: list[type] = todo.pop().__subclasses__()
        for sub in subclasses:
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def _alive(cls: type) -> list[object]:
    """Objects of ``cls`` (or a subclass) the garbage collector tracks now. By their type
    alone: ``isinstance`` would also ask each object's ``__class__``, which some answer
    with a warning (torch's deprecated ``reduce_op``) or worse; an ABC's registered virtual
    subclasses do not run its constructor and are not counted. An object of a Python class
    refers to its class, so the collector's referrers of the classes hold every instance:
    one pass in C (~60 ms with torch and megatron loaded) instead of an ``issubclass`` per
    tracked object (~200 ms, and several times that for an ABC such as MegatronOptimizer)."""
    classes = _with_subclasses(cls)
    return [obj for obj in gc.get_referrers(*classes) if type(obj) in classes]


def _instances(cls: type) -> int:
    return len(_alive(cls))


class ConstructorKind(FunctionKind):
    """A method kind that counts the objects built before it is installed."""

    name = "constructor"
    routes_old_objects = False

    def existing(self, resolved: ResolvedTarget) -> int:
        owner = resolved.owner
        return _instances(owner) if isinstance(owner, type) else 0

    def evidence(self, target: Target, resolved: ResolvedTarget) -> dict[str, object]:
        return {**super().evidence(target, resolved), "kind": self.name}

    def install(
        self,
        backport_id: str,
        target: Target,
        resolved: ResolvedTarget,
        replacement: object,
        markers: Mapping[str, object],
        aliases: dict[int, list[Site]],
    ) -> Part:
        part = super().install(backport_id, target, resolved, replacement, markers, aliases)
        owner = resolved.owner
        if isinstance(owner, type):
            record(backport_id, owner, _alive(owner))
        return part

    def uninstall(self, part: Part) -> None:
        super().uninstall(part)
        owner = self.record_of(part).owner
        if isinstance(owner, type):
            forget(part.backport_id, owner)


KIND = ConstructorKind()
