"""The constructor kind: a class's ``__init__`` (or ``__post_init__``), replaced like a method.

A constructor fix reaches only the objects built after the install: an optimizer constructed
before ``apply()`` keeps what the old constructor set up. So this kind counts the instances
of the class alive when it is judged (``existing``); the decision puts the count in the
report, ``apply`` makes it the job's one warning, and ``status`` says the same.
"""

import gc
from collections.abc import Sequence
from dataclasses import dataclass

from ..model import ResolvedTarget, Target
from .function import FunctionKind


@dataclass(frozen=True)
class Constructor(Target):
    """``Class.__init__`` (or ``Class.__post_init__``) of the class that defines it: objects
    built before the install are not reached, and the report says how many there are."""

    def problem_in(self, targets: Sequence[Target]) -> str | None:
        if self.owner_name is None or self.name not in ("__init__", "__post_init__"):
            wanted = "Class.__init__ or Class.__post_init__"
            return f"a Constructor target is {wanted}, not {self.attribute}"
        return None


def _instances(cls: type) -> int:
    """Objects of ``cls`` (or a subclass) the garbage collector tracks now. By their type
    alone: ``isinstance`` would also ask each object's ``__class__``, which some answer
    with a warning (torch's deprecated ``reduce_op``) or worse."""
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), cls))


class ConstructorKind(FunctionKind):
    """A method kind that counts the objects built before it is installed."""

    name = "constructor"

    def existing(self, resolved: ResolvedTarget) -> int:
        owner = resolved.owner
        return _instances(owner) if isinstance(owner, type) else 0

    def evidence(self, target: Target, resolved: ResolvedTarget) -> dict[str, object]:
        return {**super().evidence(target, resolved), "kind": self.name}


KIND = ConstructorKind()
