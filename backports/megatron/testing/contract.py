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

import textwrap
import warnings
from collections.abc import Callable
from typing import Any

from .. import api
from ..decision import sniff_vendored
from ..errors import BackportError, BackportWarning
from ..interpreter.children import run_python
from ..kinds import kind_of
from ..kinds.install import installed
from ..model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, BackportSpec
from ..report import Action, Report
from ..vendored import check_integrity, drift_reason, read_upstream, vendored_module

Check = Callable[[BackportSpec], None]


def _resolved(spec: BackportSpec) -> list[Any]:
    """Every target as its kind resolves it (importing its module; an import guard's
    module is never imported here: its sniff imports it in a child)."""
    return [kind_of(target).resolve(target, spec.id) for target in spec.targets]


def _bound(spec: BackportSpec, resolved: list[Any]) -> list[Any]:
    """The very objects the defining sites hold now (a method as the class holds it)."""
    return [
        kind_of(target).bound(found) for target, found in zip(spec.targets, resolved, strict=True)
    ]


def _one_report(reports: list[Report], spec: BackportSpec) -> Report:
    mine = [r for r in reports if r.id == spec.id]
    assert len(mine) == 1, f"{spec.id}: {len(mine)} reports, not one: {reports}"
    return mine[0]


def sniff_says_needed_on_the_installed_code(spec: BackportSpec) -> None:
    """On the megatron-core the entry is written for, the sniff sees the bug (in each copy
    of an entry whose code ships in several distributions)."""
    for part in spec.parts():
        stock = [
            kind_of(target).stock(target, found)
            for target, found in zip(part.targets, _resolved(part), strict=True)
        ]
        result = part.sniff(stock)
        assert result.fixed is False, f"{part.id}: the sniff says fixed: {result.summary}"


def sniff_says_fixed_on_the_vendored_code(spec: BackportSpec) -> None:
    """Run on what the default mode installs (its vendored code with the local changes),
    the sniff sees the fix (as the decision runs it; in each copy)."""
    for part in spec.parts():
        result = sniff_vendored(part, vendored_module(part.vendored), upstream_only=False)
        assert result.fixed is True, f"{part.id}: the sniff says needed: {result.summary}"


def sniff_says_fixed_on_the_vendored_code_upstream_only(spec: BackportSpec) -> None:
    """Upstream's code alone, without this project's local changes, has the fix too."""
    for part in spec.parts():
        result = sniff_vendored(part, vendored_module(part.vendored), upstream_only=True)
        assert result.fixed is True, f"{part.id}: upstream-only, the sniff says: {result.summary}"


def _apply_then_revert(spec: BackportSpec, upstream_only: bool) -> None:
    """``apply`` installs every target in the mode asked, recorded on the session (what
    stood there, what stands now); a replacement that carries attributes is marked with the
    id and wraps the original; ``revert`` puts back the very objects the sites held."""
    resolved = _resolved(spec)
    before = _bound(spec, resolved)
    wanted = UPSTREAM_ONLY if upstream_only else WITH_LOCAL_CHANGES
    try:
        report = _one_report(api.apply(spec.id, upstream_only=upstream_only), spec)
        assert report.action is Action.INSTALLED, f"{spec.id}: {report.action}: {report.reason}"
        assert report.evidence.get("mode") == wanted, f"{spec.id}: mode {report.evidence}"
        installation = installed(spec.id)
        assert installation is not None and installation.mode == wanted, (
            f"{spec.id}: {installation}"
        )
        for part, original in zip(installation.parts, before, strict=True):
            assert part.kind.is_live(part), f"{spec.id}: {part.target.attribute} is not live"
            marker = getattr(part.replacement, "__backport__", None)
            if marker is not None:
                assert marker == spec.id, f"{spec.id}: {part.replacement!r}"
                # A static method's own __wrapped__ is its function: that one wraps.
                inner = getattr(part.replacement, "__func__", part.replacement)
                wrapped = getattr(inner, "__wrapped__", None)
                assert wrapped is original, f"{spec.id}: {part.replacement!r}"
    finally:
        api.revert(spec.id)
    assert installed(spec.id) is None, f"{spec.id}: still installed after revert"
    after = _bound(spec, _resolved(spec))
    assert all(a is b for a, b in zip(after, before, strict=True)), f"{spec.id}: {after}"


def apply_then_revert_restores_the_very_objects(spec: BackportSpec) -> None:
    """``apply`` installs every target, marked with the id; ``revert`` puts back the very
    objects the owners held (a compiled method's wrapper included)."""
    _apply_then_revert(spec, upstream_only=False)


def apply_then_revert_restores_the_very_objects_upstream_only(spec: BackportSpec) -> None:
    """The same with ``upstream_only=True``: upstream's code alone is installed."""
    _apply_then_revert(spec, upstream_only=True)


def status_lists_it_once(spec: BackportSpec) -> None:
    """``status()`` has one report for it, would install it, and changes nothing."""
    resolved = _resolved(spec)
    before = _bound(spec, resolved)
    report = _one_report(api.status(), spec)
    assert report.action is Action.WOULD_INSTALL, f"{spec.id}: {report.action}: {report.reason}"
    assert installed(spec.id) is None, f"{spec.id}: status installed it"
    assert all(a is b for a, b in zip(_bound(spec, resolved), before, strict=True))


def strict_refuses_a_target_unlike_any_version(spec: BackportSpec) -> None:
    """A target of a shape no version of it has (its kind makes one: a signature the
    vendored code was not written against, an object of another type) is ``incompatible``:
    ``apply(strict=True)`` raises and installs nothing. A kind with no shape to differ (an
    import guard: its module's behaviour is the sniff's) has nothing to check here."""
    resolved = _resolved(spec)
    first, kind = spec.targets[0], kind_of(spec.targets[0])
    with kind.unlike_any_version(first, resolved[0]) as changed:
        if not changed:
            return
        unlike = kind.bound(kind.resolve(first, spec.id))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BackportWarning)
                try:
                    api.apply(spec.id, strict=True)
                except BackportError as exc:
                    assert "incompatible" in str(exc), f"{spec.id}: {exc}"
                else:
                    raise AssertionError(f"{spec.id}: strict apply() accepted {first.attribute}")
            assert installed(spec.id) is None, f"{spec.id}: installed over a foreign shape"
            assert kind.bound(kind.resolve(first, spec.id)) is unlike
        finally:
            api.revert(spec.id)


def vendored_code_matches_its_hashes(spec: BackportSpec) -> None:
    """``UPSTREAM.toml`` is valid and its sha256 and files_sha256 match the files (the
    failure says so as the probe does, naming what puts it right)."""
    upstream = read_upstream(spec.vendored)
    drift = drift_reason(check_integrity(spec.vendored, upstream), spec.id, upstream["origin"])
    assert drift is None, f"{spec.id}: {drift}"


_RELOAD = textwrap.dedent(
    """
    import importlib, sys
    from backports.megatron import api
    from backports.megatron.catalog import by_id
    from backports.megatron.job.start_up import deactivate
    from backports.megatron.kinds import kind_of
    from backports.megatron.kinds.install import installed
    deactivate()  # an environment's own start-up hook: apply() decides here
    spec = by_id(sys.argv[1])
    kinds = [kind_of(t) for t in spec.targets]
    found = [kind.resolve(t, spec.id) for t, kind in zip(spec.targets, kinds)]  # imported
    (report,) = [r for r in api.apply(spec.id) if r.id == spec.id]
    assert report.action.value == "installed", report
    module = importlib.import_module(found[0].module_name)  # a guard's: imported here
    importlib.reload(module)  # runs the module again: its originals are bound anew
    installation = installed(spec.id)
    assert installation is not None, "not installed again after the reload"
    assert all(part.kind.is_live(part) for part in installation.parts), installation
    (after,) = [r for r in api.status(spec.id) if r.id == spec.id]
    assert after.action.value == "already-installed", after
    """
)


def reload_is_patched_again(spec: BackportSpec) -> None:
    """After ``importlib.reload`` of the first target's module (in a fresh interpreter),
    the import hook installs it again (an import guard: the reload runs inside the guard,
    as the first import did) and ``status`` says so."""
    done = run_python(_RELOAD, [spec.id], backports=True, timeout=600)
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
