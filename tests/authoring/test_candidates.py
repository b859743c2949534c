"""``backports candidates`` on the fixture repository (tests/candidates_fixture.py): one
test per classification, read from one run of the command (``--json``) shared by them;
the table, the exit status on a clone it cannot read, and the escaping of upstream text."""

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import git
import pytest

from backports.megatron import cli
from backports.megatron.authoring.candidates.render import printable
from tests.candidates_fixture import ENGINE, EXAMPLE, build
from tests.from_pr_fixture import Upstream


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return build(tmp_path_factory.mktemp("candidates") / "Megatron-LM")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["candidates", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def listed(upstream: Upstream) -> dict[str, Any]:
    """One ``--json`` run: the document, and each candidate by pull-request number."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # capsys is a test's own, this run is the module's
        assert cli.main(["candidates", "--repo", str(upstream.path), "--json"]) == 0
    document = json.loads(out.getvalue())
    document["by_pr"] = {c["pr"]: c for c in document["candidates"]}
    return document


def test_the_range_starts_at_the_release_branchs_point(upstream, listed) -> None:
    span = listed["range"]
    assert span["base"] == upstream.sha("point")
    assert "core_r0.19.0" in span["how"] and "no tag core_v0.19.2" in span["how"]
    assert 1 not in listed["by_pr"] and 2 not in listed["by_pr"]  # before the point


def test_a_fix_the_release_lacks_is_missing(upstream, listed) -> None:
    found = listed["by_pr"][202]
    assert found["state"] == "missing" and found["needed"]
    assert found["sha"] == upstream.sha("missing")
    backward = next(s for s in found["symbols"] if s["qualname"] == "GeLUFunction.backward")
    assert backward["state"] == "missing"
    assert found["from_pr"]["verdict"] == "carryable"
    assert found["fix"]["category"] == "numerics" and found["fix"]["fix_like"]
    assert found["fix"]["tests"] == ["tests/unit_tests/fusions/test_fused_bias_gelu.py"]


def test_a_fix_cherry_picked_onto_the_release_branch_is_already_present(upstream, listed) -> None:
    found = listed["by_pr"][201]
    assert found["state"] == "present" and not found["needed"]
    assert [s["state"] for s in found["symbols"]] == ["present"]
    assert found["release_commit"] == upstream.sha("cherry_pick")
    assert found["from_pr"]["verdict"] == "present"


def test_a_symbol_changed_since_the_release_is_drifted(listed) -> None:
    found = listed["by_pr"][205]
    init = next(s for s in found["symbols"] if s["qualname"] == "GlobalMemoryBuffer.__init__")
    assert init["state"] == "drifted" and found["state"] == "drifted"
    assert found["fix"]["category"] == "memory"


def test_a_merge_of_examples_only_is_left_out(upstream, listed) -> None:
    assert 206 not in listed["by_pr"]
    assert listed["counts"]["left_out"] == 1  # #206 alone
    assert all(EXAMPLE not in c["files"] for c in listed["candidates"])


def test_inference_only_code_is_not_reachable(listed) -> None:
    found = listed["by_pr"][207]
    assert found["files"] == [ENGINE]
    assert found["reach"]["reachable"] is False and found["reach"]["where"] == "inference"


def test_a_merge_a_builtin_carries_says_which(listed) -> None:
    found = listed["by_pr"][6099]
    assert [c["id"] for c in found["carried_by"]] == ["megatron-lm-6099"]
    assert found["carried_by"][0]["source"] == "builtin"
    assert found["carried_by"][0]["match"].startswith("pr number")  # not upstream's SHA here
    assert all(not c["carried_by"] for c in listed["candidates"] if c["pr"] != 6099)


def test_a_fix_ranks_above_a_refactor(listed) -> None:
    by_pr = listed["by_pr"]
    assert by_pr[203]["fix"]["category"] == "refactor" and not by_pr[203]["fix"]["fix_like"]
    assert by_pr[202]["rank"] < by_pr[203]["rank"]
    ranks = [c["rank"] for c in listed["candidates"]]
    assert ranks == sorted(ranks) == list(range(1, len(ranks) + 1))


def test_the_table_fits_80_columns(upstream, capsys) -> None:
    code, out, err = _run(capsys, "--repo", str(upstream.path))
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(i for i, line in enumerate(lines) if line.startswith("#   PR"))
    first = lines[header + 1].split()
    assert first[:3] == ["1", "#202", "missing"]


def _no_release(root: Path) -> Path:
    repo = git.Repo.init(root, initial_branch="main")
    (root / "README.md").write_text("x\n")
    repo.git.add("README.md")
    repo.git.commit("-qm", "first", "--author", "A <a@example.com>")
    return root


@pytest.mark.parametrize("where", ["not a clone", "no release point", "bad --since"])
def test_a_clone_it_cannot_read_is_exit_2_in_one_line(upstream, tmp_path, capsys, where) -> None:
    argv = {
        "not a clone": ["--repo", str(tmp_path)],
        "no release point": ["--repo", str(_no_release(tmp_path / "bare"))],
        "bad --since": ["--repo", str(upstream.path), "--since", "no-such-ref"],
    }[where]
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err


def test_since_overrides_the_branch_point(upstream, capsys) -> None:
    code, out, _ = _run(capsys, "--repo", str(upstream.path), "--json", "--since", "HEAD~2")
    assert code == 0
    document = json.loads(out)
    assert document["range"]["base"] == upstream.sha("carried")
    assert [c["pr"] for c in document["candidates"]] == [207]


def test_upstream_text_reaches_a_terminal_escaped() -> None:
    assert printable("fix \x1b[2Jall\u202e (#1)") == "fix \\x1b[2Jall\\u202e (#1)"


def test_derive_runs_from_pr_on_the_top_k_not_yet_carried(upstream, capsys, monkeypatch) -> None:
    """The children are stood in for (a real derivation takes minutes): which candidates
    are chosen, and where each outcome lands."""
    from backports.megatron.authoring.candidates import derive

    asked: list[int] = []

    def fake(candidate, clone, into):  # type: ignore[no-untyped-def]
        asked.append(candidate.merge.pr)
        return {"exit": 1, "dest": None, "said": f"refused #{candidate.merge.pr}"}

    monkeypatch.setattr(derive, "derive_one", fake)
    code, out, _ = _run(capsys, "--repo", str(upstream.path), "--json", "--derive", "2")
    assert code == 0
    document = json.loads(out)
    wanted = [
        c["pr"]
        for c in document["candidates"]
        if c["needed"] and not c["carried_by"] and c["from_pr"]["carryable"]
    ]
    assert asked == wanted[:2] and 6099 not in asked and 201 not in asked and 207 not in asked
    derived = {c["pr"]: c["derived"] for c in document["candidates"] if c["derived"]}
    assert derived == {n: {"exit": 1, "dest": None, "said": f"refused #{n}"} for n in asked}


def test_ctrl_c_is_130_with_nothing_printed(upstream, capsys, monkeypatch) -> None:
    from backports.megatron.authoring.candidates import history

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(history, "merges", interrupted)
    code, out, err = _run(capsys, "--repo", str(upstream.path))
    assert (code, out) == (130, "")
    assert err.strip() == "backports: interrupted"
