"""The contract every catalog entry passes, builtin or plugin (as ddtrace's ``PatchTestCase``
holds every integration to one set of checks).

Each check is a function of the entry that raises ``AssertionError`` naming what broke; a
test suite runs every check over every entry::

    import pytest
    from backports.megatron.testing import CONTRACT

    @pytest.mark.parametrize("check", CONTRACT, ids=lambda check: check.__name__)
    def test_contract(check):
        check(SPEC)

The checks run on the installed megatron-core (stock 0.19.2 for this project's builtins)
and leave it as they found it: whatever they install they revert, whatever they swap they
put back. ``reload_is_patched_again`` runs in a fresh interpreter (a reload re-creates the
module's functions and classes, which no revert could undo in this one).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

from .. import api, import_guards
from ..errors import BackportError, BackportWarning
from ..model import BackportSpec, ResolvedTarget
from ..report import Action, Report
from ..targets import resolve_target
from ..vendored import check_integrity, drift_reason, read_upstream, vendored_module
from ..vendored_sniff import sniff_replacement

__all__ = [
    "CONTRACT",
    "apply_then_revert_restores_the_very_objects",
    "apply_then_revert_restores_the_very_objects_upstream_only",
    "reload_is_patched_again",
    "sniff_says_fixed_on_the_vendored_code",
    "sniff_says_fixed_on_the_vendored_code_upstream_only",
    "sniff_says_needed_on_the_installed_code",
    "status_lists_it_once",
    "strict_refuses_a_target_unlike_any_version",
    "vendored_code_matches_its_hashes",
]

Check = Callable[[BackportSpec], None]


def _resolved(spec: BackportSpec) -> list[Any]:
    """Every target as the probe resolves it (importing its module); an import guard's is
    its module under no guard (never imported here: the sniff imports it in a child)."""
    if spec.guard is not None:
        return [import_guards.GuardTarget(spec.guard.modules[0], import_guards.no_guard)]
    return [resolve_target(target, spec.id) for target in spec.targets]


def _bound(resolved: list[ResolvedTarget]) -> list[Any]:
    """The very objects the owners hold now (a method as the class holds it)."""
    return [vars(r.owner)[r.name] for r in resolved]


def _one_report(reports: list[Report], spec: BackportSpec) -> Report:
    mine = [r for r in reports if r.id == spec.id]
    assert len(mine) == 1, f"{spec.id}: {len(mine)} reports, not one: {reports}"
    return mine[0]


def sniff_says_needed_on_the_installed_code(spec: BackportSpec) -> None:
    """On the megatron-core the entry is written for, the sniff sees the bug."""
    result = spec.sniff(_resolved(spec))
    assert result.fixed is False, f"{spec.id}: the sniff says fixed: {result.summary}"


def sniff_says_fixed_on_the_vendored_code(spec: BackportSpec) -> None:
    """Run on what the default mode installs (its vendored code with the local changes),
    the sniff sees the fix (``vendored_sniff.sniff_replacement``, as the probe runs it)."""
    result = sniff_replacement(spec, vendored_module(spec.vendored), upstream_only=False)
    assert result.fixed is True, f"{spec.id}: the sniff says needed: {result.summary}"


def sniff_says_fixed_on_the_vendored_code_upstream_only(spec: BackportSpec) -> None:
    """Upstream's code alone, without this project's local changes, has the fix too."""
    result = sniff_replacement(spec, vendored_module(spec.vendored), upstream_only=True)
    assert result.fixed is True, f"{spec.id}: upstream-only, the sniff says: {result.summary}"


def _apply_then_revert_guard(spec: BackportSpec, upstream_only: bool) -> None:
    """An import guard: ``apply`` installs the guard in the mode asked; ``revert`` removes it."""
    wanted = api.UPSTREAM_ONLY if upstream_only else api.WITH_LOCAL_CHANGES
    try:
        report = _one_report(api.apply(spec.id, upstream_only=upstream_only), spec)
        assert report.action is Action.INSTALLED, f"{spec.id}: {report.action}: {report.reason}"
        installed = import_guards.installed(spec.id)
        assert installed is not None and installed.mode == wanted, f"{spec.id}: {installed}"
    finally:
        api.revert(spec.id)
    assert import_guards.installed(spec.id) is None, f"{spec.id}: the guard is still installed"


def _apply_then_revert(spec: BackportSpec, upstream_only: bool) -> None:
    if spec.guard is not None:
        _apply_then_revert_guard(spec, upstream_only)
        return
    resolved = _resolved(spec)
    before = _bound(resolved)
    try:
        report = _one_report(api.apply(spec.id, upstream_only=upstream_only), spec)
        assert report.action is Action.INSTALLED, f"{spec.id}: {report.action}: {report.reason}"
        mode = report.evidence.get("mode")
        wanted = api.UPSTREAM_ONLY if upstream_only else api.WITH_LOCAL_CHANGES
        assert mode is None or wanted in str(mode), f"{spec.id}: mode {mode}, not {wanted}"
        for live, original in zip(_bound(resolved), before, strict=True):
            assert getattr(live, "__backport__", None) == spec.id, f"{spec.id}: {live!r}"
            assert getattr(live, "__wrapped__", None) is original, f"{spec.id}: {live!r}"
    finally:
        api.revert(spec.id)
    after = _bound(resolved)
    assert all(a is b for a, b in zip(after, before, strict=True)), f"{spec.id}: {after}"


def apply_then_revert_restores_the_very_objects(spec: BackportSpec) -> None:
    """``apply`` installs every target, marked with the id; ``revert`` puts back the very
    objects the owners held (a compiled method's wrapper included)."""
    _apply_then_revert(spec, upstream_only=False)


def apply_then_revert_restores_the_very_objects_upstream_only(spec: BackportSpec) -> None:
    """The same with ``upstream_only=True``: upstream's code alone is installed."""
    _apply_then_revert(spec, upstream_only=True)


def status_lists_it_once(spec: BackportSpec) -> None:
    """``status()`` has one report for it, and changes nothing."""
    if spec.guard is not None:
        report = _one_report(api.status(), spec)
        assert report.action is Action.WOULD_INSTALL, f"{spec.id}: {report.reason}"
        assert import_guards.installed(spec.id) is None, f"{spec.id}: status installed it"
        return
    resolved = _resolved(spec)
    before = _bound(resolved)
    report = _one_report(api.status(), spec)
    assert report.action is Action.WOULD_INSTALL, f"{spec.id}: {report.action}: {report.reason}"
    assert all(a is b for a, b in zip(_bound(resolved), before, strict=True))


def _unlike_any_version(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a stand-in for a target unlike any version: never called")


def strict_refuses_a_target_unlike_any_version(spec: BackportSpec) -> None:
    """A target whose signature is not the one the vendored code was written against is
    ``incompatible``: ``apply(strict=True)`` raises and installs nothing. An import guard
    has no signature to differ (its module's behaviour is the sniff's, in ``status``)."""
    if spec.guard is not None:
        assert spec.guard.parameters == (), f"{spec.id}: an import guard takes no parameters"
        return
    resolved = _resolved(spec)
    first = resolved[0]
    original = vars(first.owner)[first.name]
    setattr(first.owner, first.name, _unlike_any_version)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackportWarning)
            try:
                api.apply(spec.id, strict=True)
            except BackportError as exc:
                assert "incompatible" in str(exc), f"{spec.id}: {exc}"
            else:
                raise AssertionError(f"{spec.id}: strict apply() accepted {first.attribute}")
        assert vars(first.owner)[first.name] is _unlike_any_version
        for live in _bound(resolved[1:]):
            assert getattr(live, "__backport__", None) is None, f"{spec.id}: {live!r}"
    finally:
        api.revert(spec.id)
        setattr(first.owner, first.name, original)


def vendored_code_matches_its_hashes(spec: BackportSpec) -> None:
    """``UPSTREAM.toml`` is valid and its sha256 and files_sha256 match the files (the
    failure says so as the probe does, naming what puts it right)."""
    upstream = read_upstream(spec.vendored)
    drift = drift_reason(check_integrity(spec.vendored, upstream), spec.id, upstream["origin"])
    assert drift is None, f"{spec.id}: {drift}"


_RELOAD = textwrap.dedent(
    """
    import importlib, sys
    from backports.megatron import activation, api
    from backports.megatron.catalog import by_id
    from backports.megatron.targets import resolve_target
    activation.deactivate()  # an environment's own start-up hook: apply() decides here
    spec = by_id(sys.argv[1])
    first = [resolve_target(t, spec.id) for t in spec.targets][0]  # every module imported
    (report,) = [r for r in api.apply(spec.id) if r.id == spec.id]
    assert report.action.value == "installed", report
    importlib.reload(first.module)  # runs the module again: the original is bound anew
    live = vars(resolve_target(spec.targets[0], spec.id).owner)[first.name]
    assert getattr(live, "__backport__", None) == spec.id, live
    (after,) = [r for r in api.status(spec.id) if r.id == spec.id]
    assert after.action.value == "already-installed", after
    """
)


# An import guard: the first import and a reload both run inside the guard.
_RELOAD_GUARD = textwrap.dedent(
    """
    import importlib, sys
    from backports.megatron import activation, api, import_guards
    from backports.megatron.catalog import by_id
    activation.deactivate()
    spec = by_id(sys.argv[1])
    (report,) = [r for r in api.apply(spec.id) if r.id == spec.id]
    assert report.action.value == "installed", report
    module = importlib.import_module(spec.guard.modules[0])
    importlib.reload(module)
    runs = import_guards.installed(spec.id).executions
    assert runs == ["ok", "ok"], runs
    """
)


def reload_is_patched_again(spec: BackportSpec) -> None:
    """After ``importlib.reload`` of the target's module (in a fresh interpreter), the
    post-import hook installs it again and ``status`` says so (an import guard: the reload
    runs inside the guard, as the first import did)."""
    script = _RELOAD if spec.guard is None else _RELOAD_GUARD
    done = subprocess.run(
        [sys.executable, "-c", script, spec.id],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{spec.id}: {done.stderr[-2000:]}"


CONTRACT: tuple[Check, ...] = (
    sniff_says_needed_on_the_installed_code,
    sniff_says_fixed_on_the_vendored_code,
    sniff_says_fixed_on_the_vendored_code_upstream_only,
    apply_then_revert_restores_the_very_objects,
    apply_then_revert_restores_the_very_objects_upstream_only,
    status_lists_it_once,
    strict_refuses_a_target_unlike_any_version,
    vendored_code_matches_its_hashes,
    reload_is_patched_again,
)
