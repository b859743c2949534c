"""Route a: which of a pull request's tests can run as a sniff (``sniff._route_a_test``),
and how one runs with a version of the target bound wherever the test reaches it
(``standin.route_a_bindings``, ``standin.run_upstream_test``), on real megatron-core.

The end-to-end derivation with such a test (#129 of the fixture repository) is in
tests/authoring/test_from_pr_command.py."""

import textwrap
from typing import Any

from backports.megatron.authoring.from_pr import sniff, standin
from tests.from_pr_fixture import TEST_VOCAB, TEST_VOCAB_TEXT

TP = "megatron.core.tensor_parallel.utils"
RANGE = "VocabUtility.vocab_range_from_per_partition_vocab_size"


class _Texts:
    """The one thing ``_route_a_test`` asks of a clone: a file's text at a commit."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def text(self, sha: str, path: str) -> str | None:
        del sha
        return self.files.get(path)


def _test(node_id: str, text: str) -> dict[str, Any] | None:
    path = node_id.partition("::")[0]
    return sniff._route_a_test(_Texts({path: text}), "sha", node_id)  # type: ignore[arg-type]


def _refuses_outside_the_world(per_partition_vocab_size, rank, world_size):  # type: ignore[no-untyped-def]
    """The fix as #129 writes it (an independent text, not the code under test)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    index_f = rank * per_partition_vocab_size
    return index_f, index_f + per_partition_vocab_size


def test_a_parametrized_method_of_a_plain_class_runs_once_per_case_with_its_helper() -> None:
    test = _test(
        f"{TEST_VOCAB}::TestVocabRange::test_a_rank_outside_the_world_is_refused", TEST_VOCAB_TEXT
    )
    assert test is not None
    source = test["source"]
    assert "import megatron.core.tensor_parallel.utils as tp_utils" in source
    assert "def _vocab_range(rank, world_size):" in source  # the helper it calls
    assert "class TestVocabRange:" in source
    runner = test["function"]
    assert f"def {runner}():\n    for _case in [{{'rank': 2}}, {{'rank': -1}}]:" in source
    assert "TestVocabRange().test_a_rank_outside_the_world_is_refused(**_case)" in source
    compile(source, "<route a>", "exec")


def test_the_test_fails_on_the_installed_code_and_passes_on_the_fix_through_a_module_alias() -> (
    None
):
    from megatron.core.tensor_parallel import utils

    installed = utils.VocabUtility.__dict__["vocab_range_from_per_partition_vocab_size"].__func__
    test = _test(
        f"{TEST_VOCAB}::TestVocabRange::test_a_rank_outside_the_world_is_refused", TEST_VOCAB_TEXT
    )
    assert test is not None
    run = [test["source"], test["function"], TP, RANGE]
    assert standin.run_upstream_test(*run, installed) == "failed"  # DID NOT RAISE
    assert standin.run_upstream_test(*run, _refuses_outside_the_world) == "passed"
    # The live class and module were never written.
    assert (
        utils.VocabUtility.__dict__["vocab_range_from_per_partition_vocab_size"].__func__
        is installed
    )
    assert utils.VocabUtility.vocab_range_from_per_partition_vocab_size(8, 2, 2) == (16, 24)


def test_a_subclass_that_inherits_the_method_is_bound_and_one_that_overrides_it_is_not() -> None:
    from megatron.core.tensor_parallel.utils import VocabUtility

    class Inherits(VocabUtility):
        pass

    class Overrides(VocabUtility):
        @staticmethod
        def vocab_range_from_per_partition_vocab_size(*args):  # type: ignore[no-untyped-def]
            return "its own"

    namespace = {"Inherits": Inherits, "Overrides": Overrides, "VocabUtility": VocabUtility}
    bound = standin.route_a_bindings(namespace, TP, RANGE, _refuses_outside_the_world)
    assert sorted(bound) == ["Inherits", "VocabUtility"]
    made = bound["Inherits"]
    assert isinstance(made, type) and issubclass(made, Inherits) and made is not Inherits
    assert made.vocab_range_from_per_partition_vocab_size(8, 1, 2) == (8, 16)  # still static
    assert "vocab_range_from_per_partition_vocab_size" not in Inherits.__dict__


def test_a_test_that_reaches_nothing_of_the_target_or_does_not_load_says_so() -> None:
    unrelated = "def test_other():\n    assert 1 + 1 == 2\n"
    outcome = standin.run_upstream_test(
        unrelated, "test_other", TP, RANGE, _refuses_outside_the_world
    )
    assert outcome == f"error: the test reaches nothing of {RANGE}"
    missing = "import megatron_fixture_absent\n\n\ndef test_x():\n    pass\n"
    outcome = standin.run_upstream_test(missing, "test_x", TP, RANGE, _refuses_outside_the_world)
    assert outcome.startswith("error ModuleNotFoundError: does not load here")


def test_tests_pytest_runs_around_hooks_or_fixtures_are_not_runnable_as_a_sniff() -> None:
    text = textwrap.dedent(
        """\
        import pytest


        class TestHooked:
            def setup_method(self, method):
                self.x = 1

            def test_a(self):
                assert self.x


        class TestPlain:
            def test_fixture(self, tmp_path):
                assert tmp_path

            @pytest.mark.parametrize("n", [pytest.param(1, id="one")])
            def test_param(self, n):
                assert n

            @pytest.mark.parametrize("n", list(range(3)))
            def test_computed(self, n):
                assert n

            @pytest.mark.skip
            def test_skipped(self):
                pass

            @pytest.mark.parametrize("a, b", [(1, 2), (3, 4)])
            def test_pairs(self, a, b):
                assert a < b


        def test_module_level():
            assert True
        """
    )
    path = "tests/unit_tests/test_shapes.py"
    for refused in ("TestHooked::test_a", "TestPlain::test_fixture", "TestPlain::test_param",
                    "TestPlain::test_computed", "TestPlain::test_skipped"):  # fmt: skip
        assert _test(f"{path}::{refused}", text) is None, refused
    pairs = _test(f"{path}::TestPlain::test_pairs", text)
    assert pairs is not None and "[{'a': 1, 'b': 2}, {'a': 3, 'b': 4}]" in pairs["source"]
    plain = _test(f"{path}::test_module_level", text)
    assert plain is not None
    assert f"def {plain['function']}():\n    test_module_level()\n" in plain["source"]
