"""megatron-backports: upstream Megatron-LM fixes, carried on a pinned megatron-core.

``apply()`` at job start probes each backport and installs the vendored code where the
installed megatron-core lacks the fix; ``status()`` only reports; ``revert()`` undoes.

The public names load on first use (PEP 562), so importing one small submodule (the
stdlib-only ``interpreter.import_hooks``, say) does not pay for the api's imports (packaging,
importlib.metadata, the catalog: ~80 ms).

This module also holds the start-up hook's trigger (``_start_up``, below): the hook file's
line calls it in every interpreter of the environment, and each module more that it
imported would cost every ``python -c pass`` ~0.15 ms (2-vCPU development machine).
"""

import os
import sys

# Not typing.TYPE_CHECKING: importing typing alone costs start-up time (mypy knows the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .api import applied, apply, revert, status
    from .errors import BackportError, BackportWarning
    from .job.manifest import manifest
    from .job.ranks import verify_ranks
    from .report import Action, Report, Verdict

__all__ = [
    "Action",
    "BackportError",
    "BackportWarning",
    "Report",
    "Verdict",
    "applied",
    "apply",
    "manifest",
    "revert",
    "status",
    "verify_ranks",
]

# public name -> the submodule that defines it. No submodule may share a public name:
# importing it would rebind the package attribute from the function to the module.
_HOMES = {
    "Action": "report",
    "BackportError": "errors",
    "BackportWarning": "errors",
    "Report": "report",
    "Verdict": "report",
    "applied": "api",
    "apply": "api",
    "manifest": "job.manifest",
    "revert": "api",
    "status": "api",
    "verify_ranks": "job.ranks",
}


def __getattr__(name: str) -> "Any":
    home = _HOMES.get(name)
    if home is None:
        # AttributeError lets `from backports.megatron import <submodule>` import it.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, not importlib.import_module: the importlib package imports warnings.
    value = getattr(__import__(f"{__name__}.{home}", fromlist=[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# ---- the namespace keeps this package reachable --------------------------------------------
# setuptools pops sys.modules["backports"] at its import (pypa/setuptools#4476), and megatron
# imports setuptools (torch.utils.cpp_extension): the ``backports`` namespace found afresh
# after that lacks the attribute ``megatron``, so ``import backports.megatron`` followed by
# ``backports.megatron.status()`` raised AttributeError once megatron was imported. This
# finder lets the other finders find ``backports`` as ever and puts the attribute back.

_NAMESPACE_KEEPER = "__megatron_backports_namespace__"  # how it is told apart in sys.meta_path


class _NamespaceKeeper:
    __megatron_backports_namespace__ = True  # _NAMESPACE_KEEPER: how it is told apart

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        package = sys.modules.get(__name__)
        if fullname != "backports" or package is None:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Reattaching(spec.loader, package)
                return spec
        return None


class _Reattaching:
    """The namespace's loader, which then sets ``megatron`` on the module it made."""

    def __init__(self, loader: "Any", package: "Any") -> None:
        self.loader, self.package = loader, package

    def create_module(self, spec: "Any") -> "Any":
        return self.loader.create_module(spec)

    def exec_module(self, module: "Any") -> None:
        self.loader.exec_module(module)
        module.megatron = self.package


if not any(getattr(finder, _NAMESPACE_KEEPER, False) for finder in sys.meta_path):
    sys.meta_path.insert(0, _NamespaceKeeper())


# ---- the start-up hook's trigger -----------------------------------------------------------
# `backports apply` writes site-packages/megatron_backports_startup.pth (job.hook_file),
# whose one line is: if this file is still installed, import this package and call _start_up.
# Cheap and self-contained: os and sys only, nothing else of ours until megatron is imported.

_TRIGGER = "__megatron_backports_trigger__"  # how triggers are told apart in sys.meta_path
_OFF = ("0", "false", "off", "no")  # switches.FALSE, spelled out (tests/api/test_switches.py)


class _Trigger:
    """A ``sys.meta_path`` finder for the first import of a watched package (``megatron``):
    once that package has executed, ``_job_start`` runs ``apply()``.

    At that first lookup the import finder (``interpreter.import_hooks``) comes first in
    ``sys.meta_path`` and serves the trigger's hook and every backport's; the fired trigger
    stays where it is, inert (removing an entry while the import system iterates the list
    would skip the next one).
    """

    __megatron_backports_trigger__ = True

    def __init__(self, packages: "tuple[str, ...]", config: "dict[str, Any]") -> None:
        self.packages = frozenset(packages)
        self.config = config  # apply()'s arguments: only, strict
        self.fired = False

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        """For the first lookup of a watched package: its spec as the other finders find
        it, with a loader that runs ``apply()`` once the package has executed. Not here,
        inside the lookup: a plugin that imports megatron would then create a second one.
        A lookup that finds nothing (``sys.path`` not set yet) leaves the trigger waiting."""
        if self.fired or fullname not in self.packages:
            return None
        self.fired = True  # also keeps the lookup below from coming here again
        spec = None
        try:
            from .job.start_up import hand_over

            spec = hand_over(fullname, path, target, _JOB_START, **self.config)
        except Exception as exc:
            self._failed(exc)
            return None
        if spec is None:
            self.fired = False
        return spec

    def fire_now(self) -> None:
        """Run ``apply()`` now: the watched package was imported before the trigger."""
        self.fired = True
        try:
            _job_start(None, **self.config)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        # A half-upgraded or corrupted install (a SyntaxError, a missing module) must
        # not break the import of megatron, unless the hook was written strict.
        if self.config.get("strict"):
            raise exc
        _say_hook_failed(exc)


# What runs once the watched package has executed, named as the import finder calls it.
_JOB_START = f"{__name__}:_job_start"


def _job_start(module: "Any", only: "Any" = None, strict: bool = False) -> None:
    """``apply(only, strict=strict)`` at megatron's first import; never breaks that import,
    unless strict (then the import itself fails)."""
    try:
        from .api import apply_in_job

        apply_in_job(None if only is None else tuple(only), strict=strict)
    except Exception as exc:
        if strict:
            from .errors import StartUpFailure

            raise StartUpFailure(f"the strict start-up hook failed: {exc}") from exc
        from .interpreter.once_per_job import claim

        said = claim("start-up-apply-failed")  # once per job, as the warnings are
        import logging

        logging.getLogger(__name__).log(
            logging.ERROR if said else logging.DEBUG,
            "megatron-backports: job-start apply() failed: %r",
            exc,
        )


def _say_hook_failed(exc: BaseException) -> None:
    """One line on stderr for the job: rank 0, not again in children of one that said it."""
    try:
        from .interpreter.once_per_job import claim

        first = claim("start-up-hook-failed")
    except Exception:
        first = True  # the broken part may be that module: a line per process, not none
    if first:
        what = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, whatever exc says
        sys.stderr.write(
            f"megatron-backports: the start-up hook failed ({what}); megatron runs without "
            "the backports. Reinstall megatron-backports, or remove the hook: `backports revert`\n"
        )


def _start_up(packages: "tuple[str, ...]", config: "dict[str, Any]") -> "_Trigger | None":
    """Watch for the first import of ``packages``; returns the trigger, None if disabled.

    ``config`` holds ``apply()``'s arguments (``only``, ``strict``).
    """
    # Other values of MEGATRON_BACKPORTS are switches.py's to judge, when apply() runs.
    if os.environ.get("MEGATRON_BACKPORTS", "").strip().lower() in _OFF:
        return None
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, _TRIGGER, False)]
    trigger = _Trigger(packages, config)
    sys.meta_path.insert(0, trigger)
    if trigger.packages.intersection(sys.modules):
        trigger.fire_now()
    return trigger


_START_FILE = "megatron_backports_startup.start"  # activation.hook_file.START_FILE


def _start_up_from_start_file() -> "_Trigger | None":
    """PEP 829's entry point (Python 3.15+ runs it, with no argument, from the hook's
    ``.start`` file): ``_start_up`` with what that file's comment lines say.

    The file is the first one in an absolute ``sys.path`` folder (site adds every site dir
    there before it runs an entry point); None when there is none (a stray call).
    """
    for folder in sys.path:
        if not os.path.isabs(folder):
            continue  # the working directory is no site dir
        try:
            with open(os.path.join(folder, _START_FILE), encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        said = {}
        for line in text.splitlines():
            key, colon, value = line.removeprefix("# ").partition(": ")
            if line.startswith("# ") and colon:
                said[key] = value
        packages = tuple(p for p in said.get("watch", "").split(",") if p)
        only = said.get("only", "*")
        config = {
            "strict": said.get("strict") == "yes",
            "only": None if only == "*" else tuple(i for i in only.split(",") if i),
        }
        return _start_up(packages, config)
    return None
