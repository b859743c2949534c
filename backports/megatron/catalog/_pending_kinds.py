"""Entries written for target kinds the tool does not carry yet (issue 32 is building them).

Such an entry is complete (targets, sniff, vendored code, tests) and written as it should
be, but this release's resolver raises ``TypeError`` on its target (a ``staticmethod`` in a
class dict, a Triton ``Autotuner`` bound as a module attribute) or refuses it as another
patch (a method behind ``torch.no_grad()``'s wrapper), and ``apply()`` would fail on it the
moment its module is loaded. So its catalog module defines the entry as ``ENTRY`` and
``SPEC = when_carried(ENTRY, kind, ...)``: ``SPEC`` is None (the catalog leaves the module
out) until every kind named is in ``CARRIED``. ``withheld()`` lists them, with the kinds
each waits for.

When a kind lands: add its name to ``CARRIED`` (or give entries the kind's real model class
and drop this module).
"""

from dataclasses import dataclass

from ..model import BackportSpec, Target

__all__ = ["CARRIED", "ModuleAttribute", "when_carried", "withheld"]

# The target kinds this release's probe and patcher carry.
CARRIED: frozenset[str] = frozenset({"function", "method", "compiled-method", "import-guard"})

# What each kind an entry may wait for must provide, in one line (README and reports).
KINDS = {
    "constructor": (
        "a construction-time method: at install, count the live instances of the class (and "
        "its subclasses) built before it, and say how many in the one warning and in status"
    ),
    "context-decorated-method": (
        "a method whose class attribute is a decorator's wrapper (torch.no_grad()'s "
        "decorate_context), recognised as the declared decorator, re-applied at install"
    ),
    "staticmethod": (
        "a @staticmethod in a class dict (of a torch.autograd.Function), behind a declared "
        "decorator (custom_bwd): unwrapped to resolve and sniff, re-wrapped at install"
    ),
    "module-attribute": (
        "a module attribute that is not a function (a Triton Autotuner), replaced in its "
        "module and every module that bound it by name, and put back exactly"
    ),
}

_WITHHELD: dict[str, tuple[BackportSpec, tuple[str, ...]]] = {}


def when_carried(entry: BackportSpec, *kinds: str) -> BackportSpec | None:
    """``entry`` when the tool carries every kind it needs, else None (and it is listed by
    ``withheld()``)."""
    unknown = [kind for kind in kinds if kind not in KINDS and kind not in CARRIED]
    if unknown:
        raise ValueError(f"{entry.id}: unknown target kinds {unknown}")
    missing = tuple(kind for kind in kinds if kind not in CARRIED)
    if not missing:
        return entry
    _WITHHELD[entry.id] = (entry, missing)
    return None


def withheld() -> dict[str, tuple[BackportSpec, tuple[str, ...]]]:
    """id -> (the entry, the kinds it waits for), for every builtin left out for now."""
    return dict(_WITHHELD)


@dataclass(frozen=True)
class ModuleAttribute(Target):
    """A module attribute that is not a function: an object (a Triton ``Autotuner``),
    replaced in its module and in every module that bound it by name, and put back exactly.

    ``attribute`` is the name in ``modules``; there are no parameters to check. ``expects``
    ("module:qualname") is the type the installed original must have, the shape the
    vendored replacement was written against (another type is ``incompatible``).
    """

    parameters: tuple[str, ...] = ()
    expects: str = ""
