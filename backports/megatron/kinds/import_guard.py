"""The import-guard kind: a fix to what a module does while it executes.

A backport of a function rebinds it after the import; a fix to module-level code (a probe of
optional packages at import time, say) must be in place before that code runs. The guard is
the vendored context manager; installing it has the one import finder
(``interpreter.import_hooks``) run each later execution of the module inside it. A module
executed before the install is not re-executed: a reload or a fresh import runs guarded.
The guard's sniff imports the module in child interpreters (here it must wait for the guard),
so the entry's sniff always runs in a child.
"""

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import cast

from ..evidence.fingerprints import (
    import_environment,
    installed_file,
    interpreter,
    module_file,
)
from ..interpreter import import_hooks
from ..interpreter.children import child_path
from ..model import Target
from ..session import SESSION
from . import Part, Site
from ._base import BaseKind, callable_replacement

Guard = Callable[[], contextlib.AbstractContextManager[object]]


@dataclass(frozen=True)
class ImportGuard(Target):
    """Module-level code a backport corrects: nothing can be rebound once it has run.

    The module ``modules[0]`` executes inside the vendored guard (``replacement``: a
    context-manager factory taking no arguments) from the moment it is installed (the
    start-up hook does so before megatron's first import). ``attribute`` names the
    module-level result the guarded code decides, for reports; there are no parameters.
    The sniff gets one ``GuardTarget`` whose ``original`` is the guard in force: ``no_guard``
    for the installed code as it stands, or the vendored guard; it judges the module's
    import under it, in a child process.
    """

    parameters: tuple[str, ...] = ()

    def problem_in(self, targets: Sequence[Target]) -> str | None:
        if len(targets) != 1 or len(self.modules) != 1:
            return "an import guard is the entry's one target, on one module"
        return None


@contextlib.contextmanager
def no_guard() -> Iterator[None]:
    """The guard in force when none is installed: the module's code as it stands."""
    yield


@dataclass(frozen=True)
class GuardTarget:
    """What an import guard's sniff judges: ``module_name`` imported under ``original``."""

    module_name: str
    original: Guard
    installed: Guard | None = None


@dataclass
class GuardRecord:
    """How each guarded execution of the module ended: "ok", or "Type: message"; and
    whether the module had executed (unguarded) before the guard went in."""

    executed_before: bool
    executions: list[str] = field(default_factory=list)


def _key(backport_id: str) -> str:
    return f"import-guard:{backport_id}"  # its import_hooks key


def _around(guard: Guard, record: GuardRecord) -> import_hooks.Around:
    """What the finder runs each execution of the guarded module inside: the guard, and a
    note of how the execution ended."""

    @contextlib.contextmanager
    def guarded(module: ModuleType) -> Iterator[None]:
        try:
            with guard():
                yield
        except BaseException as exc:
            record.executions.append(f"{type(exc).__name__}: {exc}")
            raise
        record.executions.append("ok")

    return guarded


def _installed_guard(backport_id: str) -> Guard | None:
    installation = SESSION.installed.get(backport_id)
    if installation is None:
        return None
    replacement: Guard = installation.parts[0].replacement
    return replacement


class ImportGuardKind(BaseKind[GuardTarget]):
    """Installed before the module executes; never rebinds anything. Its module is never
    imported here (the guard goes in first, the sniff's children import it), there is
    no shape to refuse or to make unlike every version (the module's behaviour under the
    guard is the sniff's), and nothing but the one finder to register and remove."""

    name = "import-guard"
    before_import = True
    sniff_in_child = True

    def find(self, target: Target, backport_id: str) -> GuardTarget:
        # Nothing to wait for: the guard goes in before the module's first import.
        return GuardTarget(target.modules[0], no_guard, _installed_guard(backport_id))

    def resolve(self, target: Target, backport_id: str) -> GuardTarget:
        # Never imported here: the module must wait for the guard (its sniff's children
        # import it).
        return self.find(target, backport_id)

    def fingerprint(self, target: Target, resolved: GuardTarget) -> dict[str, object] | None:
        """What the children's answer depends on: the interpreter, the path they search,
        the module's file and its distribution, and whatever else the import reaches on that
        path (any distribution or package put there by hand: ``import_environment``). Not
        keyed: environment variables the import may read."""
        source = module_file(resolved.module_name, child_path())
        installed = installed_file(target.distribution, resolved.module_name, source)
        if installed is None:
            return None
        return {
            "kind": self.name,
            "python": interpreter(),
            "module": {
                "name": resolved.module_name,
                "file": installed["file"],
                "file_sha256": installed["file_sha256"],
            },
            "distribution": installed["distribution"],
            "environment": import_environment(),
        }

    def stock(self, target: Target, resolved: GuardTarget) -> GuardTarget:
        return GuardTarget(resolved.module_name, no_guard)

    def replacement(self, target: Target, vendored_module: ModuleType) -> object:
        return callable_replacement(target, vendored_module)

    def stand_in(self, target: Target, resolved: GuardTarget, replacement: object) -> GuardTarget:
        return GuardTarget(resolved.module_name, cast(Guard, replacement))

    def install(
        self,
        backport_id: str,
        target: Target,
        resolved: GuardTarget,
        replacement: object,
        markers: Mapping[str, object],
        aliases: dict[int, list[Site]],
    ) -> Part:
        record = GuardRecord(resolved.module_name in sys.modules)
        guard = cast(Guard, replacement)  # what ``replacement()`` gave
        import_hooks.register_around(
            resolved.module_name, _key(backport_id), _around(guard, record)
        )
        return Part(self, backport_id, target, resolved, replacement, (), record)

    def uninstall(self, part: Part) -> None:
        import_hooks.unregister(_key(part.backport_id))

    def is_live(self, part: Part) -> bool:
        """Registered, and not bypassed: a module that executed since the install without
        running inside the guard (a finder that answered before ours) is not guarded."""
        if not import_hooks.registered(_key(part.backport_id)):
            return False
        record = cast(GuardRecord, part.record)  # this kind's parts carry one

        executed = part.resolved.module_name in sys.modules
        return not executed or record.executed_before or bool(record.executions)

    def bound(self, resolved: GuardTarget) -> Guard:
        return resolved.installed or no_guard

    def evidence(self, target: Target, resolved: GuardTarget) -> dict[str, object]:
        return {
            "module": resolved.module_name,
            "attribute": target.attribute,
            "kind": self.name,
            "installed": resolved.installed is not None,
            "executed": resolved.module_name in sys.modules,
        }

    def after_install(self, parts: Sequence[Part]) -> tuple[str, dict[str, object]]:
        module, guard = parts[0].resolved.module_name, parts[0].target.replacement_name
        if module in sys.modules:
            when = "already ran unguarded in this process; a reload or re-import runs"
        else:
            when = "runs from its first import"
        return f" [{module} {when} inside {guard}]", {}

    def reverted(self, parts: Sequence[Part]) -> str:
        return "removed the guard on " + ", ".join(p.resolved.module_name for p in parts)


KIND = ImportGuardKind()
