"""The constructor kind: a class's ``__init__`` (or ``__post_init__``), replaced like a method.

A constructor fix reaches only the objects built after the install: an optimizer constructed
before ``apply()`` keeps what the old constructor set up. So this kind counts the instances
of the class alive when it is judged (``existing``); the decision puts the count in the
report, ``apply`` makes it the job's one warning, and ``status`` says the same. It also
records them at the install (``_built_before``): the entry's methods of the same class, which
may read what only the fixed constructor sets (#6099's ``count_zeros``), run the original
for them, so such an object keeps the installed release's behaviour rather than failing.

A method the constructor calls once to set up what the object keeps (``called_from``:
#6357's ``MegatronFSDP._register_fsdp_hooks``, whose hooks close over what they read) is
construction-time too: its objects built before the install are counted the same way, but
not recorded, so the entry's other methods of that class still reach them (#6357's
``all_gather_and_wait_parameters_ready`` fixes old models too).
"""

import gc
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..model import ResolvedTarget, Target
from . import Part, Site
from ._built_before import forget, record
from .function import FunctionKind


@dataclass(frozen=True)
class Constructor(Target):
    """``Class.__init__`` (or ``Class.__post_init__``) of the class that defines it: objects
    built before the install are not reached, and the report says how many there are. With
    ``called_from`` (the constructor's name), a method that constructor calls once (hooks
    registered when the object is built): counted the same way, routed nowhere."""

    # "" for the constructor itself; else "__init__" or "__post_init__", which calls it.
    called_from: str = ""

    def problem_in(self, targets: Sequence[Target]) -> str | None:
        if self.called_from:
            if self.owner_name is None or self.called_from not in _CONSTRUCTORS:
                return (
                    f"a Constructor target called from a constructor is a method called from "
                    f"Class.__init__ or Class.__post_init__, not {self.attribute} called from "
                    f"{self.called_from!r}"
                )
            return None  # it records nothing: no method of its class depends on its place
        if self.owner_name is None or self.name not in _CONSTRUCTORS:
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


_CONSTRUCTORS = ("__init__", "__post_init__")


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement or type()
_FEW_CLASSES = 16  # past this, get_referrers' per-object test costs more than a Python pass


def _in_one_pass(classes: Sequence[type]) -> list[object] | None:
    """The objects whose type is one of ``classes``, in one pass in C, where that is the
    faster way: a few classes, each made in Python (an object of such a class refers to it,
    and CPython's traversal visits that reference); None otherwise."""
    if len(classes) > _FEW_CLASSES or not all(c.__flags__ & _HEAP_TYPE for c in classes):
        return None
    wanted = {id(c) for c in classes}
    return [obj for obj in gc.get_referrers(*classes) if id(type(obj)) in wanted]


def _alive(cls: type) -> list[object]:
    """Objects of ``cls`` (or a subclass) the garbage collector tracks now. By their type
    alone: ``isinstance`` would also ask each object's ``__class__``, which some answer
    with a warning (torch's deprecated ``reduce_op``) or worse. For a few classes made in
    Python, one pass in C (a few times faster than a Python loop over every object: status
    counts several classes)."""
    found = _in_one_pass(_with_subclasses(cls))
    if found is not None:
        return found
    return [obj for obj in gc.get_objects() if issubclass(type(obj), cls)]


def _with_subclasses(cls: type) -> list[type]:
    found: dict[int, type] = {}  # by identity: a metaclass may define __eq__
    todo = [cls]
    while todo:
        current = todo.pop()
        if id(current) not in found:
            found[id(current)] = current
            todo.extend(type.__subclasses__(current))
    return list(found.values())


# Inside ``census``'s block: id(class) -> the number of its objects (subclasses' included),
# from the one pass made at its start.
_CENSUS: ContextVar[dict[int, int] | None] = ContextVar("megatron_backports_census", default=None)


def _owners_loaded(targets: Iterable[Target]) -> list[type]:
    """The classes of the construction-time targets whose modules are imported already (no
    import here: a class not found is counted by its own pass when it is judged)."""
    owners: dict[int, type] = {}
    for target in targets:
        if not isinstance(target, Constructor) or target.owner_name is None:
            continue
        for module_name in target.modules:
            namespace = getattr(sys.modules.get(module_name), "__dict__", {})
            for name in (target.owner_name, *target.owner_renamed):
                found = namespace.get(name)
                if isinstance(found, type):
                    owners[id(found)] = found
    return list(owners.values())


@contextmanager
def census(targets: Iterable[Target]) -> Iterator[None]:
    """Within the block, the objects of every construction-time target's class are counted
    from one pass over the collector's objects made at its start (apply and status judge
    four such classes: one pass instead of four, ~70 ms each with megatron loaded). The
    counts are for the reports; an install records the objects afresh."""
    owners = _owners_loaded(targets)
    families = {id(owner): _with_subclasses(owner) for owner in owners}
    every = {id(c): c for family in families.values() for c in family}
    counts: dict[int, int] | None = None
    objects = _in_one_pass(list(every.values())) if owners else None
    if objects is not None:
        found = [id(type(obj)) for obj in objects]
        counts = {}
        for owner_id, family in families.items():
            members = {id(c) for c in family}
            counts[owner_id] = sum(1 for kind in found if kind in members)
    token = _CENSUS.set(counts)
    try:
        yield
    finally:
        _CENSUS.reset(token)


def _instances(cls: type) -> int:
    counted = _CENSUS.get()
    if counted is not None and id(cls) in counted:
        return counted[id(cls)]
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
        if isinstance(owner, type) and not _called_from_constructor(target):
            record(backport_id, owner, _alive(owner))
        return part

    def uninstall(self, part: Part) -> None:
        super().uninstall(part)
        owner = self.record_of(part).owner
        if isinstance(owner, type) and not _called_from_constructor(part.target):
            forget(part.backport_id, owner)


def _called_from_constructor(target: Target) -> bool:
    """A method the constructor calls (it records nothing: the entry's other methods of its
    class run the fix for every object)."""
    return bool(getattr(target, "called_from", ""))


KIND = ConstructorKind()
