"""A property as a function-kind target: its getter is swapped by installing a new property
(the vendored getter, the original's setter, deleter and doc), and revert puts back the very
original property object. The getter is what the signature check, the fingerprint and the
sniff read. A property whose getter is itself wrapped is refused in one line.

Real megatron-core 0.19.2 class (``MegatronTokenizerTextAbstract.cls_id``, an alias of
``cls``); the replacement getter is written here."""

import functools

import pytest

from backports.megatron.kinds import kind_of
from backports.megatron.kinds.install import uninstall
from backports.megatron.model import Target
from tests.installing import install

MODULE = "megatron.core.tokenizers.text.libraries.abstract_tokenizer"
TARGET = Target("megatron-core", (MODULE,), "MegatronTokenizerTextAbstract.cls_id", ("self",))


def _abstract() -> type:
    from megatron.core.tokenizers.text.libraries.abstract_tokenizer import (
        MegatronTokenizerTextAbstract,
    )

    return MegatronTokenizerTextAbstract


def _tokenizer(**attributes: object) -> object:
    """An instance of a concrete subclass (every abstract method a no-op) with
    ``attributes`` as class attributes: it inherits ``cls_id`` from the abstract class."""
    abstract = _abstract()
    noop = {name: (lambda self, *args: None) for name in abstract.__abstractmethods__}
    return type("Tokenizer", (abstract,), {**noop, **attributes})()


def _minus_one_without_cls(self):  # type: ignore[no-untyped-def]
    """The replacement getter: -1 where the tokenizer has no ``cls`` (the installed one
    raises AttributeError)."""
    return self.cls if hasattr(self, "cls") else -1


def test_a_property_resolves_to_its_getter_and_holds_the_property() -> None:
    original = vars(_abstract())["cls_id"]
    resolved = kind_of(TARGET).resolve(TARGET, "t-prop")
    assert resolved.held is original and isinstance(original, property)
    assert resolved.original is original.fget and resolved.installed is None
    assert resolved.foreign is None and not resolved.decorated
    kind = kind_of(TARGET)
    assert kind.refusal(TARGET, resolved, []) is None  # the getter's signature: (self)
    fingerprint = kind.fingerprint(TARGET, resolved)
    assert fingerprint is not None and fingerprint["module"] == MODULE


def test_an_installed_getter_is_what_instances_read_and_revert_restores_the_property() -> None:
    abstract = _abstract()
    original = vars(abstract)["cls_id"]
    kind = kind_of(TARGET)
    assert _tokenizer(cls=7).cls_id == 7  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="has no attribute 'cls'"):
        _tokenizer().cls_id  # type: ignore[attr-defined]  # noqa: B018
    install("t-prop", [(TARGET, kind.resolve(TARGET, "t-prop"), _minus_one_without_cls)])
    try:
        live = vars(abstract)["cls_id"]
        assert isinstance(live, property) and live is not original
        assert live.__backport__ == "t-prop" and live.__wrapped__ is original
        assert (live.fset, live.fdel, live.__doc__) == (
            original.fset,
            original.fdel,
            original.__doc__,
        )
        assert live.fget.__backport__ == "t-prop" and live.fget.__wrapped__ is original.fget
        assert _tokenizer(cls=7).cls_id == 7  # type: ignore[attr-defined]
        assert _tokenizer().cls_id == -1  # type: ignore[attr-defined]
        again = kind.find(TARGET, "t-prop")  # installed: status sees the original getter
        assert again is not None and again.installed is live
        assert again.held is original and again.original is original.fget
        assert kind.is_live(_part("t-prop"))
    finally:
        uninstall("t-prop")
    assert vars(abstract)["cls_id"] is original
    with pytest.raises(AttributeError, match="has no attribute 'cls'"):
        _tokenizer().cls_id  # type: ignore[attr-defined]  # noqa: B018


def _part(backport_id: str):  # type: ignore[no-untyped-def]
    from backports.megatron.kinds.install import installed

    installation = installed(backport_id)
    assert installation is not None
    (part,) = installation.parts
    return part


def test_a_property_whose_getter_is_wrapped_is_refused_in_one_line(monkeypatch) -> None:
    abstract = _abstract()
    getter = vars(abstract)["cls_id"].fget
    monkeypatch.setattr(abstract, "cls_id", property(functools.lru_cache(getter)))
    kind = kind_of(TARGET)
    resolved = kind.resolve(TARGET, "t-prop")
    why = kind.refusal(TARGET, resolved, [])
    assert why is not None and "\n" not in why
    assert why.startswith(f"{MODULE}.MegatronTokenizerTextAbstract.cls_id is a property whose")
    assert "getter is wrapped" in why and kind.fingerprint(TARGET, resolved) is None


def test_a_property_with_a_declared_decorator_is_refused() -> None:
    declared = Target(
        "megatron-core", (MODULE,), TARGET.attribute, ("self",), decorator="functools:cache"
    )
    kind = kind_of(declared)
    why = kind.refusal(declared, kind.resolve(declared, "t-prop"), [])
    assert why is not None and "only a property of a plain getter is carried" in why
