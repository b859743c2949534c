"""``_source_rule``: a function rebuilt from its installed source with one named edit.

Four vendored folders (#6010, #6099, #6624, #6890) carry the same file (a vendored folder
imports nothing of the tool or of another folder); the copies must stay byte-identical. The
rule is exercised here on functions of this test module (their source is this file), with
edits written for the test.
"""

import ast
import inspect
import linecache
import traceback
from typing import Any

import pytest
from backports.megatron._vendor.megatron_lm_6010 import _source_rule as rules

from tests.paths import ROOT

FOLDERS = [
    "megatron_lm_5976",
    "megatron_lm_6010",
    "megatron_lm_6099",
    "megatron_lm_6624",
    "megatron_lm_6890",
]
MODULE = __import__(__name__, fromlist=["_"])
GREETING = "hello"  # read by _Child.greet as a module global


def test_every_vendored_copy_is_the_same_file():
    texts = {
        folder: (ROOT / "vendor" / folder / "_source_rule.py").read_bytes() for folder in FOLDERS
    }
    assert len(set(texts.values())) == 1, sorted(texts)


class _Base:
    def greet(self, name: str) -> str:
        return f"base {name}"


class _Child(_Base):
    def greet(self, name: str) -> str:
        """A docstring
        over two lines."""
        text = """first
    second"""
        return super().greet(name) + " " + GREETING + " " + text


def _tag(function: Any) -> Any:
    function.tagged = True
    return function


@_tag
def _kernel(x: int) -> int:
    return x + 1


def _swap_greeting(definition: ast.FunctionDef) -> int:
    """The test's edit: ``GREETING`` becomes ``farewell()`` (a helper given to the rule)."""
    changed = 0
    for node in ast.walk(definition):
        if isinstance(node, ast.BinOp) and getattr(node.right, "id", None) == "GREETING":
            node.right = ast.Call(
                func=ast.Name(id="farewell", ctx=ast.Load()), args=[], keywords=[]
            )
            changed += 1
    return changed


def _rule(function: Any, edit: Any = _swap_greeting, places: int = 1, **kw: Any) -> Any:
    return rules.SourceRule(
        name="test-rule",
        symbol=function.__qualname__,
        installed_sha256=rules.source_sha256(function),
        edit=edit,
        places=places,
        **kw,
    )


def _no_edit(definition: ast.FunctionDef) -> int:
    return 0


def test_a_rebuilt_method_keeps_super_its_strings_and_reads_its_globals_live(monkeypatch):
    original = vars(_Child)["greet"]
    rebuilt = rules.rebuild(original, _rule(original, _no_edit, places=0))
    child = _Child()
    assert rebuilt(child, "x") == original(child, "x")  # super(), the multi-line literal
    assert rebuilt.__doc__ == original.__doc__
    assert rebuilt.__globals__ is vars(MODULE) and rebuilt.__qualname__ == original.__qualname__
    monkeypatch.setattr(MODULE, "GREETING", "hi")
    assert " hi " in rebuilt(child, "x")  # looked up at call time, in the module's own dict


def test_the_edit_and_its_helpers_are_what_changes():
    original = vars(_Child)["greet"]
    rebuilt = rules.rebuild(original, _rule(original), {"farewell": lambda: "bye"})
    assert rebuilt(_Child(), "x") == "base x bye first\n    second"
    assert rebuilt.__code__.co_freevars == ("__class__", "farewell")
    assert "farewell()" in inspect.getsource(rebuilt)  # the edited text, through linecache
    assert rebuilt.__code__.co_filename == "<rule test-rule: _Child.greet>"
    assert rebuilt.__code__.co_filename in linecache.cache


def test_a_traceback_shows_the_rebuilt_line():
    original = vars(_Child)["greet"]

    def fails() -> str:
        raise ValueError("boom")

    rebuilt = rules.rebuild(original, _rule(original), {"farewell": fails})
    with pytest.raises(ValueError) as raised:
        rebuilt(_Child(), "x")
    text = "".join(traceback.format_exception(raised.value))
    assert "<rule test-rule: _Child.greet>" in text and "farewell()" in text


def test_another_text_is_refused_with_both_hashes():
    original = vars(_Child)["greet"]
    rule = rules.SourceRule("test-rule", "_Child.greet", "0" * 64, _swap_greeting, 1)
    with pytest.raises(rules.SourceRuleRefused, match="not the text rule test-rule") as raised:
        rules.rebuild(original, rule, {"farewell": str})
    assert rules.source_sha256(original)[:12] in str(raised.value)


def test_an_edit_that_changes_another_number_of_places_is_refused():
    original = vars(_Child)["greet"]
    with pytest.raises(rules.SourceRuleRefused, match=r"changed 1 places of _Child\.greet, not 2"):
        rules.rebuild(original, _rule(original, places=2), {"farewell": str})


def test_a_private_name_or_another_closure_is_refused():
    class Holder:
        def uses_private(self) -> Any:
            return self.__secret  # type: ignore[attr-defined]

    method = vars(Holder)["uses_private"]
    with pytest.raises(rules.SourceRuleRefused, match="private names"):
        rules.rebuild(method, _rule(method, _no_edit, places=0))
    outer = 1

    def closes_over() -> int:
        return outer

    with pytest.raises(rules.SourceRuleRefused, match="closes over"):
        rules.rebuild(closes_over, _rule(closes_over, _no_edit, places=0))


def test_decorators_are_dropped_unless_kept():
    function = rules.installed_function(_kernel, MODULE)
    plain = rules.rebuild(function, _rule(function, _no_edit, places=0))
    assert not hasattr(plain, "tagged") and plain(1) == 2
    kept = rules.rebuild(function, _rule(function, _no_edit, places=0, keep_decorators=True))
    assert kept.tagged is True and kept(1) == 2  # the source's decorator, applied again


def test_the_installed_function_is_found_behind_wrappers():
    """Through a staticmethod, a decorator's wrapper from another file (``torch.no_grad()``'s,
    with ``__wrapped__``) and a kernel object's ``fn``."""
    import torch

    inner = vars(_Child)["greet"]
    wrapper = torch.no_grad()(inner)
    assert wrapper.__code__.co_filename != inner.__code__.co_filename

    class Kernel:
        fn = wrapper

    assert rules.installed_function(staticmethod(wrapper), MODULE) is inner
    assert rules.installed_function(Kernel(), MODULE) is inner
    with pytest.raises(rules.SourceRuleRefused, match="no function defined in"):
        rules.installed_function(len, MODULE)
