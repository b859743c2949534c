"""``BaseKind``: the defaults most kinds share, so a kind writes only what it does otherwise.

Most targets are found in the module that defines them, once that module is imported (a
function, a method, a constructor, a module attribute); they are judged in this process, show
the sniff the installed object as it is, are put back where they were on ``revert``, and have
no objects built before them to count. The import guard differs in most of that and overrides
it. ``R`` is the kind's own record of a target (a ``model.Resolved``): what ``find`` gives
out and every other method takes back.
"""

import contextlib
import importlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import cast

from ..model import Resolved, Target
from . import Part, Site, TargetMissing


def _is_missing_module(exc: ModuleNotFoundError, name: str) -> bool:
    """True when ``name`` itself (or a parent) is absent, not something it imports."""
    return exc.name is not None and (name == exc.name or name.startswith(exc.name + "."))


def import_candidates[T](target: Target, found_in: Callable[[ModuleType], T | None]) -> T:
    """Import the target's candidate modules in order until ``found_in(module)`` finds it
    there; ``TargetMissing`` names what each candidate lacked."""
    tried: list[str] = []
    for name in target.modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not _is_missing_module(exc, name):
                raise
            tried.append(f"{name} (no such module)")
            continue
        found = found_in(module)
        if found is not None:
            return found
        tried.append(f"{name} (no {target.attribute})")
    raise TargetMissing("; ".join(tried))


def loaded_candidates[T](target: Target, found_in: Callable[[ModuleType], T | None]) -> T | None:
    """``found_in`` over the target's candidate modules already imported, in order; None
    where none holds it (nothing is imported)."""
    for name in target.modules:
        module = sys.modules.get(name)
        if module is not None:
            found = found_in(module)
            if found is not None:
                return found
    return None


def lacking(module: ModuleType, target: Target, reads: Sequence[str]) -> str | None:
    """Why the vendored code cannot run against ``module``: the helpers the entry declares
    and the globals the vendored code reads that the module does not define (a helper only
    the pull request added would fail at call time: it fails here), or None."""
    needed = dict.fromkeys([*target.helpers, *reads])
    missing = [name for name in needed if name not in vars(module)]
    return f"{module.__name__} lacks {', '.join(missing)}" if missing else None


def callable_replacement(target: Target, vendored_module: ModuleType) -> object:
    """The vendored object named for ``target``, which must be callable (a function, a
    guard): anything else is a broken vendored module, said as such."""
    replacement = getattr(vendored_module, target.replacement_name)
    if not callable(replacement):
        raise TypeError(f"{vendored_module.__name__}.{target.replacement_name} is not callable")
    return replacement


class BaseKind[R: Resolved](ABC):
    """A kind whose target is found where it is defined, after its module's import.

    A subclass names itself (``name``) and says how it finds its target in a module
    (``found_in``), how it fingerprints, installs and checks it; it overrides any default
    below that does not hold for it. The protocol the other wings call is ``kinds.Kind``.
    """

    name: str
    # False: installed once the module that defines the target has been imported.
    before_import = False
    # False: judged in this process (the entry's sniff runs here).
    sniff_in_child = False

    # ---- finding the target ------------------------------------------------------------------

    def found_in(self, module: ModuleType, target: Target, backport_id: str) -> R | None:
        """The target in ``module`` (imported), or None where it is not there."""
        raise NotImplementedError(f"{type(self).__name__} finds no target in a module")

    def find(self, target: Target, backport_id: str) -> R | None:
        return loaded_candidates(target, lambda module: self.found_in(module, target, backport_id))

    def resolve(self, target: Target, backport_id: str) -> R:
        found: R = import_candidates(
            target, lambda module: self.found_in(module, target, backport_id)
        )
        return found

    def record_of(self, part: Part) -> R:
        """``part``'s record of its target: this kind's own (it made the part)."""
        return cast(R, part.resolved)

    # ---- judging it --------------------------------------------------------------------------

    def refusal(self, target: Target, resolved: R, reads: Sequence[str]) -> str | None:
        return None  # no shape of its own to check

    def stock(self, target: Target, resolved: R) -> R:
        return resolved  # the sniff judges the installed object as it stands

    def replacement(self, target: Target, vendored_module: ModuleType) -> object:
        return getattr(vendored_module, target.replacement_name)

    def existing(self, resolved: R) -> int:
        return 0  # only a constructor fix leaves objects built before it behind

    @contextlib.contextmanager
    def unlike_any_version(self, target: Target, resolved: R) -> Iterator[bool]:
        yield False  # no shape that could differ from every version's

    # ---- installing it -----------------------------------------------------------------------

    def aliases(self, resolved: R) -> list[object]:
        return []  # bound nowhere but where it is defined

    def after_install(self, parts: Sequence[Part]) -> tuple[str, dict[str, object]]:
        return "", {}  # nothing to add to the report

    def reverted(self, parts: Sequence[Part]) -> str:
        where = ", ".join(f"{m}.{a}" for part in parts for m, a in part.sites)
        return f"restored the original at {where}"

    # ---- what each kind says for itself ------------------------------------------------------

    @abstractmethod
    def fingerprint(self, target: Target, resolved: R) -> dict[str, object] | None:
        """(Each kind's own: see ``kinds.Kind``.)"""

    @abstractmethod
    def stand_in(self, target: Target, resolved: R, replacement: object) -> R:
        """(Each kind's own: see ``kinds.Kind``.)"""

    @abstractmethod
    def install(
        self,
        backport_id: str,
        target: Target,
        resolved: R,
        replacement: object,
        markers: Mapping[str, object],
        aliases: dict[int, list[Site]],
    ) -> Part:
        """(Each kind's own: see ``kinds.Kind``.)"""

    @abstractmethod
    def uninstall(self, part: Part) -> None:
        """(Each kind's own: see ``kinds.Kind``.)"""

    @abstractmethod
    def is_live(self, part: Part) -> bool:
        """(Each kind's own: see ``kinds.Kind``.)"""

    @abstractmethod
    def bound(self, resolved: R) -> object:
        """(Each kind's own: see ``kinds.Kind``.)"""

    @abstractmethod
    def evidence(self, target: Target, resolved: R) -> dict[str, object]:
        """(Each kind's own: see ``kinds.Kind``.)"""
