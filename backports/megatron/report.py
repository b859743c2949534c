"""What the probe decided and what the applier did, per backport."""

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Action", "Report", "Verdict"]


class Verdict(StrEnum):
    """What the evidence says about a backport in this environment."""

    NEEDED = "needed"  # the installed megatron-core lacks the fix: install the vendored code
    UPSTREAM = "upstream"  # the installed megatron-core has the fix: delete the backport
    ABSENT = "absent"  # the function the backport patches does not exist here
    INCOMPATIBLE = "incompatible"  # the target is not what the vendored code was written for
    DISABLED = "disabled"  # turned off by the user


class Action(StrEnum):
    """What ``apply``/``revert`` did, or, from ``status``, what ``apply`` would do."""

    INSTALLED = "installed"
    ALREADY_INSTALLED = "already-installed"
    DEFERRED = "deferred"  # target not imported yet: installs on first import
    SKIPPED = "skipped"
    WOULD_INSTALL = "would-install"
    # status: not installed in this process, but the environment's start-up hook installs
    # it in each new process when megatron's target is imported
    ACTIVE_VIA_HOOK = "active-via-hook"
    WOULD_SKIP = "would-skip"
    REVERTED = "reverted"
    NOT_INSTALLED = "not-installed"


@dataclass(frozen=True)
class Report:
    """One backport's verdict, the action taken, why, and the evidence (JSON-serialisable)."""

    id: str
    verdict: Verdict
    action: Action
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    # "builtin", or "<distribution> <version>" of the plugin that registered the entry.
    source: str = "builtin"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "verdict": str(self.verdict),
            "action": str(self.action),
            "reason": self.reason,
            "evidence": self.evidence,
            "source": self.source,
        }
