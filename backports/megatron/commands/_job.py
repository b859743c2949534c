"""The job side, as the commands see it: the start-up hook file and this process's trigger.

The one place the commands wing imports the job wing's modules (``job.startup_hook``,
``job.hook_file``, ``job.start_up``).
Names are looked up at call time, so a test that replaces ``hook_file.default_site_dir`` is
heard here too. ``job.startup_hook`` (which loads the catalog) is imported only by the functions
that need it: ``backports sync --check`` loads no catalog entry.
"""

from pathlib import Path

from ..job import hook_file, start_up
from ..job.hook_file import HookState

__all__ = [
    "HookState",
    "default_site_dir",
    "ignore_this_interpreters_trigger",
    "is_site_dir",
    "read_hook",
    "remove_hook",
    "write_hook",
]


def default_site_dir() -> Path:
    """This interpreter's site-packages: where ``apply`` writes the hook by default."""
    return hook_file.default_site_dir()


def is_site_dir(folder: Path) -> bool:
    """Whether this interpreter's start-up runs the hook files in ``folder``."""
    return hook_file.is_site_dir(folder)


def read_hook(site_dir: Path) -> HookState:
    """The hook files in ``site_dir``, and whether this version would write them so."""
    from ..job import startup_hook

    return startup_hook.read_hook(site_dir)


def write_hook(
    site_dir: Path, only: tuple[str, ...] | None, strict: bool
) -> tuple[HookState, bool]:
    """Write (or refresh) the hook files; their state and whether a file changed."""
    from ..job import startup_hook

    return startup_hook.write_hook(site_dir, only, strict)


def remove_hook(site_dir: Path) -> tuple[HookState, bool]:
    """Delete the hook files; their state before and whether this call removed one."""
    return hook_file.remove_hook(site_dir)


def ignore_this_interpreters_trigger() -> None:
    """A command decides explicitly: the environment's hook must not apply on its own in it."""
    start_up.deactivate()
