"""``--from-pr`` step three: each changed symbol found in the installed megatron-core 0.19.2
(read from its files, never imported) and compared with the pull request's base."""

import pytest

from backports.megatron.authoring.from_pr.clone import open_clone
from backports.megatron.authoring.from_pr.locate import installed_distribution, locate
from backports.megatron.authoring.from_pr.model import Located
from backports.megatron.authoring.from_pr.resolve import resolve_pull_request
from backports.megatron.authoring.from_pr.symbols import changed_symbols
from tests.from_pr_fixture import DIVISIBILITY, GELU, POST_TRAINING, UTILS, Upstream, shared


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


def _located(upstream: Upstream, number: int) -> dict[str, Located]:
    clone = open_clone(str(upstream.path))
    pr = resolve_pull_request(clone, number)
    symbols = changed_symbols(clone, pr).symbols
    return {loc.symbol.shown: loc for loc in locate(symbols, clone, pr, installed_distribution())}


@pytest.mark.parametrize(
    ("number", "shown", "status", "module", "qualname", "how"),
    [
        # The base's text is the release's: vendored as upstream's.
        (101, f"{UTILS}::divide", "identical", "megatron.core.utils", "divide", "same path"),
        # #90 changed it on main after the release: drifted.
        (
            102,
            f"{GELU}::GeLUFunction.backward",
            "drifted",
            "megatron.core.fusions.fused_bias_gelu",
            "GeLUFunction.backward",
            "same path",
        ),
        # #92 moved it to a module the release does not have: found under its name.
        (
            107,
            f"{DIVISIBILITY}::ensure_divisibility",
            "identical",
            "megatron.core.utils",
            "ensure_divisibility",
            f"moved to {UTILS}",
        ),
        # #95 renamed it: found by its body.
        (
            112,
            f"{UTILS}::_make_viewless",
            "identical",
            "megatron.core.utils",
            "_kernel_make_viewless_tensor",
            f"renamed to {UTILS}::_kernel_make_viewless_tensor (same body)",
        ),
        # #95 added it: the release has nothing to patch.
        (112, f"{UTILS}::_buffer_size", "absent", None, None, "not in megatron-core 0.19.2"),
        # The pull request adds it.
        (
            106,
            f"{GELU}::_gelu_note",
            "new",
            "megatron.core.fusions.fused_bias_gelu",
            "_gelu_note",
            "added here",
        ),
    ],
)
def test_each_symbol_is_found_and_compared(
    upstream, number, shown, status, module, qualname, how
) -> None:
    loc = _located(upstream, number)[shown]
    assert (loc.status, loc.module, loc.qualname, loc.how) == (status, module, qualname, how)


def test_a_file_megatron_core_does_not_ship_is_said_so(upstream) -> None:
    loc = _located(upstream, 111)[f"{POST_TRAINING}::describe"]
    assert loc.status == "not shipped"
    assert loc.how == f"{POST_TRAINING} is not part of megatron-core"


def test_a_change_of_formatting_alone_is_identical(upstream) -> None:
    """#106 changes GlobalMemoryBuffer.__init__, whose text in the base is the release's."""
    loc = _located(upstream, 106)[f"{UTILS}::GlobalMemoryBuffer.__init__"]
    assert loc.status == "identical" and loc.notes == ()
