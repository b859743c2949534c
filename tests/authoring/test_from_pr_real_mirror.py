"""``--from-pr``'s first steps on a clone of the real NVIDIA/Megatron-LM, when a mirror is
on this machine (skipped otherwise): the judged pull requests resolve to the SHAs the
research notes verified, #6624's drifted backward carries only its own hunks, #6271 is
over the budget, and a number above the newest pull ref is refused. No child runs here:
benchmarks/from_pr.py runs the whole derivations."""

import os
import subprocess
from pathlib import Path

import pytest

from backports.megatron.authoring.from_pr.budget import check_budget
from backports.megatron.authoring.from_pr.clone import open_clone
from backports.megatron.authoring.from_pr.errors import Refused
from backports.megatron.authoring.from_pr.locate import installed_distribution, locate
from backports.megatron.authoring.from_pr.resolve import resolve_pull_request
from backports.megatron.authoring.from_pr.symbols import changed_symbols
from backports.megatron.authoring.from_pr.vendor import vendor

MIRROR = Path(os.environ.get("MEGATRON_LM_MIRROR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (MIRROR / "HEAD").is_file(), reason=f"no mirror at {MIRROR}"),
]

SHAS = {  # (merge, head), as /work/shared/notes/from-pr.md verified them
    6010: ("3d3323fbdafe697b6d67904a0bf9ad0dbef601ae", "99112c362d4a33a8950b18414c53503af99fc82f"),
    6099: ("6183f9dbec2509fe00c5f0c27cb930e76520edb6", "a650054ff593cecfc48708a4e3f1be80573728b7"),
    6624: ("e5542e85f294fc215f2e08b3c7e17213f0ffae93", "2c4a434ef267fb9264d6e5056ca6f3ba5e5d52b0"),
}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("mirror") / "Megatron-LM.git"
    subprocess.run(["git", "clone", "--quiet", "--mirror", str(MIRROR), str(path)], check=True)
    return open_clone(str(path))


@pytest.mark.parametrize("number", sorted(SHAS))
def test_the_judged_pull_requests_resolve_to_the_verified_shas(clone, number: int) -> None:
    pr = resolve_pull_request(clone, number)
    assert pr.merge is not None and (pr.merge.sha, pr.head.sha) == SHAS[number]
    assert pr.merge.verified and pr.head.verified


def test_6114s_twin_is_discarded(clone) -> None:
    pr = resolve_pull_request(clone, 6114)
    assert pr.merge is not None and pr.merge.sha.startswith("723db5a727")
    assert [t[:8] for t in pr.twins] == ["98be7da3"]


def test_6624s_drifted_backward_carries_only_its_own_hunks(clone) -> None:
    pr = resolve_pull_request(clone, 6624)
    located = locate(changed_symbols(clone, pr).symbols, clone, pr, installed_distribution())
    vendored = vendor(located, clone, pr, installed_distribution(), repo_url="https://x/y.git")
    backward = next(t for t in vendored.targets if t.attribute.endswith(".backward"))
    assert backward.merged and vendored.carried == ("_wgrad_gemm",)
    assert "ctx.input_dtype" not in vendored.text  # #6252's, never set by 0.19.2
    assert "sharded_weight.get_wgrad_tensor()" in vendored.text  # #6624's


def test_6271_is_over_the_budget(clone) -> None:
    pr = resolve_pull_request(clone, 6271)
    located = locate(changed_symbols(clone, pr).symbols, clone, pr, installed_distribution())
    with pytest.raises(Refused, match="over the size budget: 2"):
        check_budget(located)


def test_a_number_above_the_newest_pull_ref_is_refused(clone) -> None:
    newest = clone.pull_numbers()[-1]
    with pytest.raises(Refused, match=f"newer than this clone .its newest pull ref is #{newest}"):
        resolve_pull_request(clone, newest + 1)
