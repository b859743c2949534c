"""``--from-pr`` step four: the vendored module (fixture repository, installed 0.19.2).

Upstream's text for a symbol the release has as the pull request's base; for one that
drifted, the installed text with only this pull request's hunks (a three-way merge); a hunk
that cannot apply stops with it shown; the budget refuses a fix too big to carry."""

import ast

import pytest

from backports.megatron.authoring.from_pr.budget import check_budget
from backports.megatron.authoring.from_pr.clone import open_clone
from backports.megatron.authoring.from_pr.errors import NotProven, Reason, Refused
from backports.megatron.authoring.from_pr.locate import installed_distribution, locate
from backports.megatron.authoring.from_pr.merge import Conflict, merge_symbol
from backports.megatron.authoring.from_pr.model import Located
from backports.megatron.authoring.from_pr.resolve import resolve_pull_request
from backports.megatron.authoring.from_pr.symbols import changed_symbols
from backports.megatron.authoring.from_pr.vendor import VendoredCode, vendor
from tests.from_pr_fixture import Upstream, installed_text, shared


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


def _located(upstream: Upstream, number: int) -> tuple[list[Located], object, object]:
    clone = open_clone(str(upstream.path))
    pr = resolve_pull_request(clone, number)
    symbols = changed_symbols(clone, pr).symbols
    return locate(symbols, clone, pr, installed_distribution()), clone, pr


def _vendor(upstream: Upstream, number: int) -> VendoredCode:
    located, clone, pr = _located(upstream, number)
    return vendor(
        located, clone, pr, installed_distribution(), repo_url="https://example.com/m.git"
    )


def _function(text: str, name: str) -> str:
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    return ast.get_source_segment(text, node) or ""


def test_an_identical_symbol_is_upstreams_text_at_the_merge(upstream) -> None:
    vendored = _vendor(upstream, 101)
    assert vendored.origin == "synced"
    (target,) = vendored.targets
    assert (target.module, target.attribute, target.merged) == (
        "megatron.core.utils",
        "divide",
        False,
    )
    assert target.parameters == ("numerator", "denominator")
    divide = _function(vendored.text, "divide")
    assert 'raise ValueError(f"{numerator} is not divisible by {denominator}")' in divide
    assert "ensure_divisibility" not in divide
    assert "# sha:    " + upstream.sha("merge101") in vendored.text


def test_a_drifted_symbol_carries_only_this_pull_requests_hunks(upstream) -> None:
    """#90 changed backward's first line on main; #102 adds a clamp. The vendored backward
    is the installed one plus the clamp: #90's line never comes along."""
    vendored = _vendor(upstream, 102)
    (target,) = vendored.targets
    assert target.merged and vendored.origin == "handwritten"
    backward = _function(vendored.text, "backward")
    installed = installed_text("megatron/core/fusions/fused_bias_gelu.py")
    assert "        input, bias = ctx.saved_tensors\n" in installed
    assert "input, bias = ctx.saved_tensors\n" in backward  # the installed line
    assert "ctx.saved_tensors[0]" not in backward  # #90's, not this pull request's
    assert "tmp = tmp.clamp(-1.0, 1.0)" in backward
    assert "GeLUFunction.backward" in vendored.text.split('"""')[0]  # named in the header
    assert "only this\n#         pull request's hunks merged in" in vendored.text


def test_a_hunk_that_does_not_apply_stops_with_the_hunk_shown(upstream) -> None:
    with pytest.raises(Conflict) as caught:
        _vendor(upstream, 103)
    message = str(caught.value)
    assert "do not apply to the installed text" in message
    assert "<<<<<<< installed\n        input, bias = ctx.saved_tensors\n" in message
    assert "input, bias = tuple(ctx.saved_tensors)" in message


def test_the_budget_refuses_a_fix_too_big_with_its_figures(upstream) -> None:
    located, _, _ = _located(upstream, 104)
    with pytest.raises(Refused) as caught:
        check_budget(located)
    message = str(caught.value)
    # Nine new helpers and a new class attribute: over the size budget, by that figure.
    assert "over the size budget: 10 carried symbols (limit 8)" in message
    assert "the budget: at most 8 carried symbols" in message and "too big" not in message
    assert caught.value.reason is Reason.OVER_BUDGET


def test_super_in_a_vendored_method_names_its_class_and_instance(upstream) -> None:
    vendored = _vendor(upstream, 110)
    init = _function(vendored.text, "__init__")
    assert "self.derived_by_fixture = True" in init
    assert "super(_live_target().LayerWiseDistributedOptimizer, self).__init__(optimizers)" in init
    calls = [n for n in ast.walk(ast.parse(init)) if isinstance(n, ast.Call)]
    assert not [c for c in calls if ast.unparse(c.func) == "super" and not c.args]


def test_a_read_the_installed_module_lacks_is_refused(upstream) -> None:
    with pytest.raises(NotProven, match=r"reads _BUFFER_NOTE from megatron\.core\.utils"):
        _vendor(upstream, 109)


def test_an_absent_target_is_refused(upstream) -> None:
    with pytest.raises(NotProven, match=r"_buffer_size is not in megatron-core 0\.19\.2"):
        _vendor(upstream, 112)


def test_a_new_helper_is_carried_and_the_decorator_recorded(upstream) -> None:
    vendored = _vendor(upstream, 113)
    assert vendored.carried == ("_tanh_out",)
    (target,) = vendored.targets
    assert target.decorator == "megatron.core.jit:jit_fuser"
    assert vendored.decorators == {"bias_gelu_back": ["jit_fuser"]}
    body = _function(vendored.text, "bias_gelu_back")
    assert "tanh_out = _tanh_out(x)" in body  # the vendored module's own helper
    assert "def _tanh_out(x):" in vendored.text


def test_helpers_are_only_names_the_module_always_binds(upstream) -> None:
    """The probe refuses a module lacking a helper: ``DTensor`` and ``HAVE_DTENSOR``, bound
    only inside a ``try`` in megatron.core.utils, are read live but never required."""
    vendored = _vendor(upstream, 114)
    (target,) = vendored.targets
    assert target.attribute == "WrappedTensor.__init__"
    assert {"DTensor", "HAVE_DTENSOR"} <= set(vendored.reads)
    assert not {"DTensor", "HAVE_DTENSOR"} & set(target.helpers)
    assert set(target.helpers) <= set(vendored.reads)


@pytest.mark.parametrize(
    ("installed", "base", "new", "merged"),
    [
        ("a\nb\nc\n", "a\nB\nc\n", "a\nB\nc\nd\n", "a\nb\nc\nd\n"),  # drift kept, hunk added
        ("a\nb\nc\n", "a\nb\nc\n", "a\nx\nc\n", "a\nx\nc\n"),
    ],
)
def test_merge_symbol_applies_the_change_to_the_installed_text(installed, base, new, merged):
    assert merge_symbol(installed, base, new, "f") == merged


def test_merge_symbol_refuses_a_conflict() -> None:
    with pytest.raises(Conflict, match="1 hunk"):
        merge_symbol("a\nb\nc\n", "a\nB\nc\n", "a\nX\nc\n", "f")
