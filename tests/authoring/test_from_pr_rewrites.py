"""Soundness before speed (issue 44 item 4): a derived sniff is kept only if it reads every
semantics-preserving rewrite of the installed code as *needed* and of the fixed code as
*fixed*. The rewrites are made from the function's own AST (``rewrites``); the functions
here are small ones written for the test (the fixture repository's #117 derives a whole
plugin: tests/test_from_pr_command.py)."""

import ast

from backports.megatron.authoring.from_pr import explore, rewrites
from backports.megatron.authoring.from_pr.sniff_child import _Soundness
from backports.megatron.private_globals import with_globals


class Loader:
    """A class whose method reads a private attribute (name-mangled) and calls super()."""

    def __init__(self) -> None:
        self.__mode = "plain"

    def pick(self, algo, retries=2):  # type: ignore[no-untyped-def]
        chosen = None
        if algo != "atomic" and algo != "fully_parallel":
            chosen = "serial"
        elif not (algo in ("atomic",) or retries):
            chosen = "atomic without retries"
        try:
            label = f"{chosen or self.__mode}:{retries}"
        except TypeError as error:
            label = str(error)
        return label if retries > 0 else super().__repr__()[:1]


def _text(function) -> str:  # type: ignore[no-untyped-def]
    definition = rewrites._parse(function)
    assert definition is not None
    return ast.unparse(definition)


def test_each_rewrite_says_the_same_thing_another_way() -> None:
    made = dict(rewrites.rewrites(Loader.pick))
    assert set(made) == {
        "membership",
        "comparisons",
        "de-morgan",
        "renamed locals",
        "extracted local",
        "all",
    }
    texts = {name: _compiled_text(name) for name in made}
    assert "algo == 'atomic'" in texts["membership"]  # in (...) as a chain of ==
    assert "algo not in ('atomic', 'fully_parallel')" in texts["comparisons"]
    assert "not (algo == 'atomic' or algo == 'fully_parallel')" in texts["de-morgan"]
    assert "chosen" not in texts["renamed locals"] and "error" not in texts["renamed locals"]
    assert "if _backports_rw_held_0:" in texts["extracted local"]
    loader = Loader()
    for algo in ("atomic", "fully_parallel", "other", None):
        for retries in (0, 2):
            expected = Loader.pick(loader, algo, retries)
            for name, function in made.items():
                assert function(loader, algo, retries) == expected, (name, algo, retries)


def _compiled_text(name: str) -> str:
    definition = rewrites._parse(Loader.pick)
    assert definition is not None
    plan = list(rewrites.REWRITES) if name == "all" else [name]
    for step in plan:
        rewrites.REWRITES[step](definition)
    return ast.unparse(ast.fix_missing_locations(definition))


def test_a_function_whose_source_cannot_be_read_has_no_rewrites() -> None:
    namespace: dict[str, object] = {}
    exec("def f(x):\n    return x != 1 and x != 2\n", namespace)
    assert rewrites.rewrites(namespace["f"]) == []  # type: ignore[arg-type]


# Two versions of a rule: the fix adds "async" to the parallel algorithms. The installed one
# says it with != and and, the fixed one with not in: stand-ins answer `algo != "atomic"`
# and `"atomic" == algo` as two independent questions, so on the plainest input (every
# answer False) the installed code takes the parallel path and the fixed one the serial
# path: a difference of code shape, not of the bug.
def _installed_rule(self, algo):  # type: ignore[no-untyped-def]
    if algo != "atomic" and algo != "fully_parallel":
        return self.serial(algo)
    return self.parallel(algo)


def _fixed_rule(self, algo):  # type: ignore[no-untyped-def]
    if algo not in ("atomic", "fully_parallel", "async"):
        return self.serial(algo)
    return self.parallel(algo)


def _search(soundness=None):  # type: ignore[no-untyped-def]
    return explore.search(
        _installed_rule,
        _fixed_rule,
        target="rule",
        module="m",
        recorders=(),
        with_globals=with_globals,
        validate=soundness.observation if soundness else None,
        on_discard=soundness.discard if soundness else None,
    )


def test_without_rewrites_the_first_difference_is_one_of_code_shape() -> None:
    found = _search()
    assert found is not None and found.observation.main["truths"] == {}


def test_a_sniff_that_judges_code_shape_is_discarded_and_replaced() -> None:
    soundness = _Soundness.of(_installed_rule, _fixed_rule)
    found = _search(soundness)
    assert found is not None
    truths = {path for path, value in found.observation.main["truths"].items() if value}
    # The kept input is the fix's case, as both spellings read it: algo is "async".
    assert truths == {"(algo != 'atomic')", "(algo != 'fully_parallel')", "(algo == 'async')"}
    assert soundness.discarded >= 2
    assert "the installed code" in soundness.why[0] and "reads fixed" in soundness.why[0]
    # The kept sniff reads every rewrite as its version.
    checker = _Soundness.of(_installed_rule, _fixed_rule)
    assert checker.observation(found.observation) is None
    assert checker.answer()["passed"] == len(checker.installed) + len(checker.fixed) >= 4


def test_a_candidate_is_discarded_when_a_rewrite_reads_as_the_other_version() -> None:
    naive = _search()
    assert naive is not None
    installed_only = _Soundness.of(_installed_rule, _fixed_rule)
    installed_only.fixed = []
    fixed_only = _Soundness.of(_installed_rule, _fixed_rule)
    fixed_only.installed = []
    for checker, says in ((installed_only, "reads fixed"), (fixed_only, "reads needed")):
        why = checker.observation(naive.observation)
        assert why is not None and says in why, why
