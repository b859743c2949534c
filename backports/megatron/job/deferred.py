"""Backports waiting for their target's import, and what runs when it comes.

``apply()`` before megatron's import (the start-up hook fires at ``import megatron``, long
before the model's modules load) cannot judge a target that is not imported: importing it
there would cost the job ~9 s in every process the hook reaches. So it watches the target's
modules (``watch``); the import finder calls ``on_target_import`` each time one of them has
executed, and every watched backport with a target there is decided and installed then,
together (the decision imports an entry's other modules, unless its targets are coupled:
then it waits until they are all loaded). An installed backport stays watched: a reload or
a fresh import puts the original back, and the hook installs it again.
"""

import logging
import threading
from dataclasses import dataclass
from types import ModuleType

from ..catalog import entries
from ..decision import decide, sniffs_in_this_thread
from ..errors import BackportError
from ..evidence.one_look import one_look
from ..interpreter import import_hooks
from ..kinds.install import installed
from ..model import BackportSpec
from ..report import Verdict
from ..session import SESSION
from .announce import announce
from .settling import settle

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Watch:
    """One backport watched: how ``apply()`` was asked for it."""

    spec: BackportSpec
    strict: bool
    mode: str
    plugin: tuple[str, str] | None
    # Whether a sniff that starts child interpreters may run at the import (an explicit
    # ``apply()``), or the verdict cache must answer (a job's start-up hook).
    child_sniffs: bool = False
    # Whether an entry's sniff marked ``sniff_on_demand`` may run (``apply()``), or only
    # its proof in the store answers (a job's start-up hook).
    on_demand: bool = False


class _StrictFailure(BackportError):
    # Raised from an import hook in strict mode: the import itself must fail.
    fatal_on_import = True


def hook_key(backport_id: str) -> str:
    return f"backports.megatron:{backport_id}"


def watch(watched: Watch) -> None:
    """Decide and install ``watched`` on every (re-)import of one of its target modules."""
    with SESSION.lock:
        SESSION.watched[watched.spec.id] = watched
    modules = dict.fromkeys(m for target in watched.spec.targets for m in target.modules)
    for module_name in modules:
        import_hooks.register(module_name, hook_key(watched.spec.id), on_target_import)


def unwatch(backport_id: str) -> bool:
    """Stop watching; whether a hook was waiting (nothing installed yet)."""
    pending = is_deferred(backport_id)
    import_hooks.unregister(hook_key(backport_id))
    with SESSION.lock:
        SESSION.watched.pop(backport_id, None)
    return pending


def is_deferred(backport_id: str) -> bool:
    """Whether an import hook waits to decide and install ``backport_id``."""
    return bool(import_hooks.registered(hook_key(backport_id))) and installed(backport_id) is None


def _due(module_name: str) -> list[Watch]:
    """Watched backports with a target in ``module_name``, not installed; in catalog order
    (builtins first). The decision says whether each can be judged now."""
    order = {spec.id: index for index, spec in enumerate(entries())}
    with SESSION.lock:
        watching = list(SESSION.watched.values())
    due = [
        w
        for w in watching
        if any(module_name in target.modules for target in w.spec.targets)
        and installed(w.spec.id) is None
    ]
    return sorted(due, key=lambda w: order.get(w.spec.id, len(order)))


_THIS_THREAD = threading.local()


def _deciding() -> set[str]:
    """The ids this thread is deciding in an import hook now (an outer hook's)."""
    ids: set[str] = _THIS_THREAD.__dict__.setdefault("ids", set())
    return ids


def on_target_import(module: ModuleType) -> None:
    """Every watched backport that waits for ``module`` (a coupled one: once its targets
    are all loaded), decided and installed together, once the import of megatron that brought
    ``module`` in has finished (``decide_and_install``)."""
    # Inside ``import megatron.core`` its modules are partially initialised: a sniff (or a
    # vendored module) importing a name from one of them meets a circular import, and the
    # backport would be called incompatible. So the decision waits for that import's end.
    if not import_hooks.after_package_import(module, decide_and_install):
        decide_and_install(module)


def decide_and_install(module: ModuleType) -> None:
    """Every watched backport that waits for ``module`` (a coupled one: once its targets
    are all loaded), decided and installed together. One call for them all (the import finder runs a
    callback registered under several keys once per import): their installs share one scan
    for aliases. A strict backport that is incompatible fails the import before anything is
    installed in it."""
    # In the importing thread: it holds the module's import lock (see sniffs_in_this_thread).
    with SESSION.lock, one_look(), sniffs_in_this_thread():
        # Judging an entry imports the modules of its other targets: their own hooks leave
        # it to the decision under way here (one sniff, one report).
        due = [w for w in _due(module.__name__) if w.spec.id not in _deciding()]
        _deciding().update(w.spec.id for w in due)
        try:
            decisions = [
                decide(
                    w.spec,
                    w.mode,
                    importing=False,
                    child_sniffs=w.child_sniffs,
                    plugin=w.plugin,
                    on_demand=w.on_demand,
                )
                for w in due
            ]
        finally:
            _deciding().difference_update(w.spec.id for w in due)
        ready = [
            (w, d)
            for w, d in zip(due, decisions, strict=True)
            if d.verdict is not None and installed(w.spec.id) is None
        ]
        refused = [d for w, d in ready if w.strict and d.verdict is Verdict.INCOMPATIBLE]
        # A refusal fails the import: only the refused are settled (skipped), none installed.
        reports = settle(refused or [d for _, d in ready])
        for report in reports:
            announce(report, stacklevel=2)
    if refused:
        reasons = "; ".join(f"{d.spec.id} is incompatible: {d.reason}" for d in refused)
        raise _StrictFailure(reasons)
