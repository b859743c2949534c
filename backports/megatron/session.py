"""This process's state, in one object: what is installed, what waits, what was said.

Everything the tool remembers between two calls in one interpreter lives on ``SESSION``,
guarded by its one re-entrant lock: the installations (every kind's, with the record of what
each replaced: an object that cannot carry ``__backport__`` is known here), the backports
waiting for their target's import, the last report per id, the warnings decided, the
``applied()`` blocks open, the loaded catalog. ``reset()`` forgets it all (tests make a
session anew this way, as pluggy's ``PluginManager``). The post-import finder's registry
(``job.post_import``) is process-wide by nature and stays there.

Standard library only: the start-up path may import this before anything of megatron.
"""

import threading
from dataclasses import dataclass, field
from typing import Any

# ``Installation``, ``Report`` and ``Watch`` are defined by the modules that make them; the
# session only keeps them (typed loosely here so that this module imports nothing of ours).


@dataclass
class Session:
    """What this process remembers; every field is guarded by ``lock``."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    # id -> the live installation (kinds.Installation).
    installed: dict[str, Any] = field(default_factory=dict)
    # id -> installations whose module was reloaded or re-imported: aliases elsewhere may
    # still hold their replacements, and an uninstall puts those back too.
    stale: dict[str, list[Any]] = field(default_factory=dict)
    # id -> what ``apply()`` last decided (report.Report).
    last: dict[str, Any] = field(default_factory=dict)
    # id -> a backport waiting for (or watching) its target modules' import (job.deferred.Watch).
    watched: dict[str, Any] = field(default_factory=dict)
    # id -> open ``applied()`` blocks sharing what the first of them installed.
    holders: dict[str, int] = field(default_factory=dict)
    # Keys of the warnings already decided in this process (a job's one warning per backport).
    warned: set[str] = field(default_factory=set)
    # The catalog as loaded (catalog.Loaded) and the builtins it was loaded with.
    catalog: tuple[Any, Any] | None = None

    def reset(self) -> None:
        """Forget everything (nothing is uninstalled: ``revert()`` does that first)."""
        with self.lock:
            self.installed.clear()
            self.stale.clear()
            self.last.clear()
            self.watched.clear()
            self.holders.clear()
            self.warned.clear()
            self.catalog = None


SESSION = Session()
