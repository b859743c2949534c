"""``--from-pr`` step two: every hunk mapped to the unit it changes, tagged with its shape,
and the tests a pull request adds or changes as pytest node ids (fixture repository)."""

from pathlib import Path

import pytest

from backports.megatron.authoring.from_pr.clone import open_clone
from backports.megatron.authoring.from_pr.errors import Refused
from backports.megatron.authoring.from_pr.resolve import resolve_pull_request
from backports.megatron.authoring.from_pr.symbols import Changes, changed_symbols
from backports.megatron.authoring.from_pr.units import map_units
from tests.from_pr_fixture import GELU, ROPE, TEST_UTILS, UTILS, Upstream, shared


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


def _changes(upstream: Upstream, number: int) -> Changes:
    clone = open_clone(str(upstream.path))
    return changed_symbols(clone, resolve_pull_request(clone, number))


@pytest.fixture(scope="module")
def shapes(upstream: Upstream) -> dict[str, tuple[str, tuple[str, ...]]]:
    """#106, one change of every shape: shown symbol -> (kind, tags)."""
    return {s.shown: (s.kind, s.tags) for s in _changes(upstream, 106).symbols}


@pytest.mark.parametrize(
    ("shown", "kind", "tags"),
    [
        (f"{GELU}::bias_gelu_back", "function", {"function", "jit_fuser/torch.compile"}),
        (  # a comment only: inert, its shape still tagged
            f"{GELU}::GeLUFunction.forward",
            "inert",
            {"inert: comments or blank lines only", "method", "autograd.Function forward"},
        ),
        (f"{GELU}::GeLUFunction", "class body", {"class body"}),
        (f"{GELU}::bias_gelu_impl", "inert", {"module-level statement"}),  # a comment
        (f"{GELU}::_gelu_note", "new helper", {"new helper", "function"}),
        (f"{GELU}::<comment>", "comment", {"comment or blank line"}),
        (f"{UTILS}::GlobalMemoryBuffer.__init__", "method", {"method", "constructor"}),
        (f"{ROPE}::rotary_fwd_q_kernel", "inert", {"inert: docstring only", "Triton kernel"}),
    ],
)
def test_each_shape_is_mapped_and_tagged(shapes, shown: str, kind: str, tags: set[str]) -> None:
    assert shown in shapes, sorted(shapes)
    assert shapes[shown][0] == kind
    assert tags <= set(shapes[shown][1]), shapes[shown]


def test_nothing_else_is_reported(shapes) -> None:
    assert len(shapes) == 8, sorted(shapes)


def test_added_and_changed_tests_are_node_ids(upstream) -> None:
    tests = _changes(upstream, 106).tests
    assert set(tests) == {
        f"{TEST_UTILS}::test_divide_whole_numbers",  # changed
        f"{TEST_UTILS}::test_divide_by_one",  # added
    }


def test_a_test_method_of_a_class_has_its_class_in_the_node_id(upstream) -> None:
    assert _changes(upstream, 102).tests == (
        "tests/unit_tests/fusions/test_fused_bias_gelu.py::TestGeLUFunction"
        "::test_backward_clamps_the_gradient",
    )


def test_a_method_changed_deep_inside_counts_its_lines(upstream) -> None:
    (symbol,) = _changes(upstream, 102).symbols
    assert symbol.shown == f"{GELU}::GeLUFunction.backward"
    assert symbol.lines == 1  # one added line, nothing removed


def test_a_line_in_a_nested_def_belongs_to_the_function_around_it() -> None:
    units = map_units("def outer(x):\n    def inner(y):\n        return y\n    return inner(x)\n")
    unit = units.unit(3)
    assert (unit.qualname, unit.kind, unit.inner) == ("outer", "function", "outer.inner")


def test_a_method_of_a_nested_class_is_not_carriable() -> None:
    units = map_units("class A:\n    class B:\n        def m(self):\n            return 1\n")
    assert units.unit(4).kind == "nested class method"


# ---- source too deep or too big to read: one line, never a traceback (issue 42) -----------


@pytest.fixture(scope="module")
def extreme(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone whose #1 adds a 10,000-term expression and #2 a 3 MB module."""
    import git

    root = tmp_path_factory.mktemp("extreme") / "Megatron-LM"
    repo = git.Repo.init(root, initial_branch="main")
    who = git.Actor("F", "f@x")

    def commit(files: dict[str, str], message: str, parent: str) -> str:
        repo.git.checkout("--quiet", "--force", "--detach", parent)
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text, encoding="utf-8")
            repo.index.add([path])
        return repo.index.commit(message, author=who, committer=who).hexsha

    (root / "README.md").write_text("x\n")
    repo.index.add(["README.md"])
    main = repo.index.commit("init", author=who, committer=who).hexsha
    deep = "LIMIT = " + " + ".join(["1"] * 10_000) + "\n"
    repo.git.update_ref("refs/pull/1/head", commit({"megatron/core/deep.py": deep}, "1", main))
    big = "X = 1\n" * 600_000
    repo.git.update_ref("refs/pull/2/head", commit({"megatron/core/big.py": big}, "2", main))
    repo.git.update_ref("refs/heads/main", main)
    return root


@pytest.mark.parametrize(
    ("number", "says"),
    [
        (1, "megatron/core/deep.py at {sha} is too deeply nested to read (RecursionError)"),
        (2, "megatron/core/big.py at {sha} is 3.4 MB, over the 2 MB a source file --from-pr"),
    ],
)
def test_source_too_deep_or_too_big_is_refused_in_one_line(extreme, number, says) -> None:
    clone = open_clone(str(extreme))
    pr = resolve_pull_request(clone, number)
    with pytest.raises(Refused) as caught:
        changed_symbols(clone, pr)
    message = str(caught.value)
    assert "\n" not in message and says.format(sha=pr.new.sha[:12]) in message, message
