"""megatron-backports: upstream Megatron-LM fixes, carried on a pinned megatron-core.

``apply()`` at job start probes each backport and installs the vendored code where the
installed megatron-core lacks the fix; ``status()`` only reports; ``revert()`` undoes.
"""

from .api import applied, apply, revert, status
from .errors import BackportError, BackportWarning
from .report import Action, Report, Verdict

__all__ = [
    "Action",
    "BackportError",
    "BackportWarning",
    "Report",
    "Verdict",
    "applied",
    "apply",
    "revert",
    "status",
]
