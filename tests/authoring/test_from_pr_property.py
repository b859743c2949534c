"""``--from-pr`` carries a fix to a property's getter (fixture #130: the installed 0.19.2's
``MCoreTensorAwareStateDict.tensors`` raises RuntimeError where it asserted, with a
module-level CPU test): the target is the property, vendored as its undecorated getter, and
route a runs the pull request's test on a class whose property is the getter under
judgement. A property whose setter or deleter is defined beside it is refused."""

from pathlib import Path

import pytest

from backports.megatron.authoring.from_pr import sniff_child, standin
from backports.megatron.authoring.from_pr.clone import open_clone
from backports.megatron.authoring.from_pr.errors import Reason, Refused
from backports.megatron.authoring.from_pr.locate import installed_distribution, locate
from backports.megatron.authoring.from_pr.resolve import resolve_pull_request
from backports.megatron.authoring.from_pr.symbols import changed_symbols
from backports.megatron.authoring.from_pr.vendor import _refuse_accessors_in, vendor
from backports.megatron.private_globals import with_globals
from tests.from_pr_fixture import Upstream, shared

TASD = "megatron.core.dist_checkpointing.tensor_aware_state_dict"
TENSORS = "MCoreTensorAwareStateDict.tensors"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


def test_a_changed_getter_is_a_target_vendored_as_its_undecorated_function(upstream) -> None:
    """``@property`` is how the method is bound, not a decorator the applier re-applies:
    the target declares none, and the vendored getter is a plain module function."""
    clone = open_clone(str(upstream.path))
    pr = resolve_pull_request(clone, 130)
    located = locate(changed_symbols(clone, pr).symbols, clone, pr, installed_distribution())
    assert [(loc.symbol.qualname, loc.status) for loc in located] == [(TENSORS, "identical")]
    vendored = vendor(located, clone, pr, installed_distribution(), repo_url="https://x.org/m")
    (target,) = vendored.targets
    assert (target.attribute, target.module) == (TENSORS, TASD)
    assert (target.parameters, target.decorator) == (("self",), None)
    assert vendored.decorators == {TENSORS: ["property"]}  # recorded, as a method's are
    assert "\ndef tensors(self)" in vendored.text and "@property" not in vendored.text


def _hollow_tensors_raise_runtime_error() -> None:
    """A test as #130 writes it: it names the class at module level."""
    hollow = MCoreTensorAwareStateDict({}, {}, _is_hollow=True)  # noqa: F821 - bound by run_test
    with pytest.raises(RuntimeError):
        hollow.tensors  # noqa: B018


def _raising_getter(self):  # type: ignore[no-untyped-def]
    """A fixed getter, written here."""
    if self.is_hollow:
        raise RuntimeError("hollow")
    return iter(())


def test_route_a_binds_a_property_of_the_getter_under_judgement() -> None:
    from megatron.core.dist_checkpointing.tensor_aware_state_dict import (
        MCoreTensorAwareStateDict,
    )

    live = vars(MCoreTensorAwareStateDict)["tensors"]
    name, value = standin.test_binding(TASD, TENSORS, _raising_getter)
    assert name == "MCoreTensorAwareStateDict" and issubclass(value, MCoreTensorAwareStateDict)
    bound = vars(value)["tensors"]
    assert isinstance(bound, property) and bound.fget is _raising_getter
    assert bound.__doc__ == live.__doc__
    assert vars(MCoreTensorAwareStateDict)["tensors"] is live  # the live class untouched
    test = _hollow_tensors_raise_runtime_error
    assert standin.run_test(test, name, value, with_globals) == "passed"
    installed = sniff_child._unwrapped(live)
    stock = standin.test_binding(TASD, TENSORS, installed)
    assert standin.run_test(test, *stock, with_globals, inside=installed.__code__) == "failed"


def test_the_sniff_child_runs_a_propertys_getter() -> None:
    """The sniff's child finds the installed getter (it said "defines no such function")."""
    from megatron.core.dist_checkpointing.tensor_aware_state_dict import (
        MCoreTensorAwareStateDict,
    )

    getter, module = sniff_child._installed(TASD, TENSORS)
    assert getter is vars(MCoreTensorAwareStateDict)["tensors"].fget
    assert module.__name__ == TASD


@pytest.mark.parametrize(
    "accessor", ["@x.setter\n    def x(self, v):\n", "@x.deleter\n    def x(self):\n"]
)
def test_a_property_defined_beside_its_setter_or_deleter_is_refused(accessor: str) -> None:
    """Pieces are found by name, and the sync's assembly takes the last ``def``: the
    setter would stand in for the getter. Refused, as a shape."""
    text = f"class C:\n    @property\n    def x(self):\n        return 1\n\n    {accessor}"
    text += "        pass\n"
    with pytest.raises(Refused, match="only a property's lone getter is carried") as caught:
        _refuse_accessors_in(text, "C.x", "m.C.x")
    assert caught.value.reason is Reason.SHAPE
    _refuse_accessors_in(text.replace("def x(self, v)", "def y(self, v)"), "C.y", "m.C.y")
    overloads = "class C:\n    @overload\n    def f(self):\n        ...\n\n"
    _refuse_accessors_in(overloads + "    def f(self):\n        pass\n", "C.f", "m.C.f")


@pytest.mark.slow(
    reason="derives, proves (contract kit, backports check in children) and writes a whole "
    "plugin from the fixture: minutes on 2 cores"
)
def test_a_fix_to_a_property_getter_is_proven_by_its_own_test(
    upstream, tmp_path, capsys, monkeypatch
) -> None:
    """#130 end to end: route a on the property, the contract kit's apply/revert (the very
    property put back) and ``backports check`` pass, and the plugin is written."""
    import tempfile

    from backports.megatron import cli

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dest = tmp_path / "plugin"
    argv = ["new", "--from-pr", "130", "--repo", str(upstream.path), "--dest", str(dest)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"  {TENSORS}: route a, the pull request's own test" in out
    assert "contract apply_then_revert_restores_the_very_objects: ok" in out
    assert "backports check --only mlm-pr-130: exit 0" in out
    entry = Path(dest / "mlm_pr_130_backport" / "entry.py").read_text()
    assert f"attribute={TENSORS!r}" in entry and "decorator=None" in entry
