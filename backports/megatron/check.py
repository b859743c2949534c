"""The CI gate: is every backport still carrying its weight, and does it still apply?

A patch rots quietly: its fix lands upstream and the copy lives on, or a pin bump moves
the target and the patch stops applying while CI stays green. ``judge`` turns each report
into pass or fail so that ``backports check`` can make that a red CI run:

- ``incompatible``: fails (the target is not what the vendored code was written for, or
  the vendored code does not show the fix; "unfinished" for a scaffold's stub);
- ``upstream``: fails (the fix landed: delete the backport);
- ``absent``: passes only where the distribution predates the target (nothing to carry
  there); a target missing from a version that should have it, or a distribution that is
  not installed, fails: the backport would silently do nothing;
- ``needed``: passes only if ``apply`` really installed it in this process;
- ``disabled``: probed anyway (``anyway``): a switch in CI's environment must not hide a
  landed or rotted backport that jobs elsewhere still carry. It fails as the verdict would,
  saying it is disabled here; a needed or not-yet-existing one passes, with a note.
"""

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from .evidence.versions import release_predates
from .model import BackportSpec
from .report import Action, Report, Verdict

__all__ = ["Judgement", "judge"]

_INSTALLED = (Action.INSTALLED, Action.ALREADY_INSTALLED)


@dataclass(frozen=True)
class Judgement:
    ok: bool
    why: str  # one line for the table

    def to_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "why": self.why}


def _absent(spec: BackportSpec | None, probed: Report) -> Judgement:
    distribution = probed.evidence.get("distribution") or {}
    name = distribution.get("name") or (spec.target.distribution if spec else "the target")
    version = distribution.get("version")
    if version is None or spec is None:
        return Judgement(False, f"{name} is not installed: nothing was checked")
    try:
        predates = release_predates(Version(str(version)), spec.target_since)
    except InvalidVersion:
        predates = False
    if predates:
        return Judgement(True, f"{name} {version} predates the target: nothing to carry")
    return Judgement(False, "the target is missing where it should exist: the patch does nothing")


def _vendored_unfixed(probed: Report) -> bool:
    """Whether the sniff on the vendored replacement (probe) did not show the fix."""
    shown = probed.evidence.get("vendored_behaviour")
    return isinstance(shown, dict) and any(
        isinstance(mode, dict) and mode.get("fixed") is False for mode in shown.values()
    )


def _disabled(spec: BackportSpec | None, anyway: Report | None) -> Judgement:
    """A backport the environment turns off, judged on what its probe found anyway."""
    if anyway is None or anyway.verdict is Verdict.DISABLED:
        return Judgement(True, "disabled by the environment: not checked")
    if anyway.verdict is Verdict.NEEDED:
        return Judgement(True, f"disabled here; still needed where it runs: {anyway.reason}")
    found = judge(spec, anyway, None)
    return Judgement(found.ok, f"disabled here; {found.why}")


def judge(
    spec: BackportSpec | None,
    probed: Report,
    applied: Report | None,
    anyway: Report | None = None,
) -> Judgement:
    """Pass or fail for one backport: ``probed`` from ``status``, ``applied`` from ``apply``,
    ``anyway``: what the probe found for a disabled one (see ``_disabled``).

    ``spec`` is None for a plugin the catalog withheld (its report is incompatible, or
    disabled by ``MEGATRON_BACKPORTS_SKIP_PLUGINS``).
    """
    verdict = probed.verdict
    if verdict is Verdict.INCOMPATIBLE and probed.evidence.get("unfinished"):
        return Judgement(False, f"unfinished, write it: {probed.reason}")
    if verdict is Verdict.INCOMPATIBLE and _vendored_unfixed(probed):
        return Judgement(False, f"would install code without the fix: {probed.reason}")
    if verdict is Verdict.INCOMPATIBLE:
        return Judgement(False, f"does not fit, update or delete it: {probed.reason}")
    if verdict is Verdict.UPSTREAM:
        return Judgement(False, f"landed upstream, delete it: {probed.reason}")
    if verdict is Verdict.ABSENT:
        return _absent(spec, probed)
    if verdict is Verdict.DISABLED:
        return _disabled(spec, anyway)
    if applied is None or applied.action not in _INSTALLED:
        action = "no report" if applied is None else f"{applied.action}: {applied.reason}"
        return Judgement(False, f"needed but not installed ({action})")
    return Judgement(True, "needed, and it installs")
