"""Job-start activation, the mechanism alone: one room per job.

- ``hook_file``: the ``.pth`` file that ``backports apply`` writes and revert removes (its
  text from the packages and config the caller gives), and where it goes;
- ``start_up``: the start-up triggers that the hook line arms in ``sys.meta_path``, and
  their hand-over to the post-import finder at megatron's first lookup;
- ``post_import``: the one ``sys.meta_path`` finder that runs code around and after a
  watched module's execution (the trigger's, every backport's, the import guards');
- ``once_per_job``: say a thing once per job, not once per process.

Standard library only (and ``..errors``): nothing here knows the catalog or the api.
What does (which packages to watch, what ``apply()`` to run when the trigger fires) is
``backports.megatron.job_start``, above the api. The trigger itself
(``backports.megatron._start_up``) stays in the package's ``__init__``: the hook line runs
it in every interpreter, and each module more would cost every ``python -c pass``.

This ``__init__`` imports nothing (``once_per_job`` and ``post_import`` stay cheap to
import); the names below load from their module on first use (PEP 562).
"""

# Not typing.TYPE_CHECKING: importing typing alone costs start-up time (mypy knows the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .hook_file import (
        HOOK_FILE,
        HookState,
        default_site_dir,
        is_site_dir,
        remove_hook,
        same_hook,
    )
    from .start_up import active, deactivate, triggers

# name -> the module of this package that defines it
_HOMES = {
    "HOOK_FILE": "hook_file",
    "HookState": "hook_file",
    "active": "start_up",
    "deactivate": "start_up",
    "default_site_dir": "hook_file",
    "is_site_dir": "hook_file",
    "remove_hook": "hook_file",
    "same_hook": "hook_file",
    "triggers": "start_up",
}
__all__ = [
    "HOOK_FILE",
    "HookState",
    "active",
    "deactivate",
    "default_site_dir",
    "is_site_dir",
    "remove_hook",
    "same_hook",
    "triggers",
]


def __getattr__(name: str) -> "Any":
    home = _HOMES.get(name)
    if home is None:
        # AttributeError lets `from backports.megatron.activation import <submodule>` import it.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, not importlib.import_module: the importlib package imports warnings.
    # Not kept here: what the module holds now (a test's monkeypatch, say) is what callers get.
    return getattr(__import__(f"{__name__}.{home}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
