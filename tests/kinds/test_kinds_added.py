"""The added-attribute kind on real megatron-core 0.19.2 classes: a method, a class attribute
or a module constant the fix adds is set at install and deleted at revert, all or none with
the entry's other targets; a name that exists (own or inherited) or a class with
``__slots__`` is refused, never overwritten."""

import megatron.core.utils as utils
import pytest

from backports.megatron.kinds import kind_of
from backports.megatron.kinds.added import ABSENT, AddedAttribute
from backports.megatron.kinds.install import installed, uninstall
from tests.installing import install

ID = "test-kinds-added"
MODULE = "megatron.core.utils"


def _added(attribute: str, wrap: str = "") -> AddedAttribute:
    return AddedAttribute("megatron-core", (MODULE,), attribute, wrap=wrap)


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    uninstall(ID)


def _shown_value(self) -> str:
    return str(self._value)


def test_a_new_method_is_added_at_install_and_deleted_at_revert() -> None:
    target = _added("_ValueWithRank._shown_value")
    kind = kind_of(target)
    resolved = kind.resolve(target, ID)
    assert resolved.original is ABSENT and kind.refusal(target, resolved, []) is None
    assert kind.bound(resolved) is ABSENT
    install(ID, [(target, resolved, _shown_value)])
    assert vars(utils._ValueWithRank)["_shown_value"] is _shown_value
    assert utils._ValueWithRank(3, 0)._shown_value() == "3"  # a method of the class now
    again = kind.resolve(target, ID)  # found while installed: ours, nothing stood there
    assert again.original is ABSENT and again.installed is _shown_value
    assert kind.refusal(target, again, []) is None
    uninstall(ID)
    assert "_shown_value" not in vars(utils._ValueWithRank) and installed(ID) is None


def test_a_class_attribute_and_a_module_constant_are_added_and_removed() -> None:
    units, limit = _added("_ValueWithRank._PLAIN_UNITS"), _added("_ADDED_LIMIT")
    kind = kind_of(units)
    value = ("",)
    install(ID, [(units, kind.resolve(units, ID), value), (limit, kind.resolve(limit, ID), 7)])
    assert utils._ValueWithRank._PLAIN_UNITS is value and utils._ADDED_LIMIT == 7
    uninstall(ID)
    assert not hasattr(utils._ValueWithRank, "_PLAIN_UNITS")
    assert not hasattr(utils, "_ADDED_LIMIT")


def test_a_static_method_is_bound_as_one() -> None:
    target = _added("_ValueWithRank.describe", wrap="staticmethod")

    class Vendored:
        @staticmethod
        def describe() -> str:
            return "value with rank"

    made = kind_of(target).replacement(target, Vendored)  # type: ignore[arg-type]
    install(ID, [(target, kind_of(target).resolve(target, ID), made)])
    assert utils._ValueWithRank(1, 0).describe() == "value with rank"
    assert isinstance(vars(utils._ValueWithRank)["describe"], staticmethod)


def test_all_or_none_a_name_that_appeared_meanwhile_undoes_the_others(monkeypatch) -> None:
    first, second = _added("_ValueWithRank._shown_value"), _added("_ValueWithRank._later")
    kind = kind_of(first)
    resolved = [kind.resolve(first, ID), kind.resolve(second, ID)]
    monkeypatch.setattr(utils._ValueWithRank, "_later", 1, raising=False)  # someone else's
    with pytest.raises(LookupError, match="exists"):
        install(ID, [(first, resolved[0], _shown_value), (second, resolved[1], 2)])
    assert "_shown_value" not in vars(utils._ValueWithRank) and installed(ID) is None
    assert utils._ValueWithRank._later == 1


@pytest.mark.parametrize(
    ("attribute", "says"),
    [
        ("_ValueWithRank.__str__", "already exists"),  # the class defines it (landed?)
        ("MakeViewlessTensor.apply", "would shadow Function.apply"),  # a base gives it
        ("divide", "already exists"),  # a module function
        ("Slotted.extra", "defines __slots__"),
    ],
)
def test_an_existing_name_or_slots_is_refused(monkeypatch, attribute: str, says: str) -> None:
    class Slotted:
        __slots__ = ("x",)

    monkeypatch.setattr(utils, "Slotted", Slotted, raising=False)
    target = _added(attribute)
    kind = kind_of(target)
    resolved = kind.resolve(target, ID)
    problem = kind.refusal(target, resolved, [])
    assert problem is not None and says in problem, problem
    held = kind.bound(resolved)
    if resolved.original is not ABSENT:
        with pytest.raises(LookupError, match="exists"):  # never overwritten, even asked
            install(ID, [(target, resolved, object())])
        assert kind.bound(kind.resolve(target, ID)) is held
