"""megatron-backports: upstream Megatron-LM fixes, carried on a pinned megatron-core.

``apply()`` at job start probes each backport and installs the vendored code where the
installed megatron-core lacks the fix; ``status()`` only reports; ``revert()`` undoes.

The public names load on first use (PEP 562), so importing one small submodule (the
stdlib-only ``post_import``, say) does not pay for the api's imports (packaging,
importlib.metadata, the catalog: ~80 ms).
"""

# Not typing.TYPE_CHECKING: importing typing alone costs start-up time (mypy knows the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .api import applied, apply, revert, status
    from .errors import BackportError, BackportWarning
    from .process_manifest import manifest
    from .ranks import verify_ranks
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
    "manifest": "process_manifest",
    "revert": "api",
    "status": "api",
    "verify_ranks": "ranks",
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
