"""``--from-pr`` on a fix the installed release already has, and on a hunk that needs an
earlier upstream change: the fixture repository (tests/from_pr_fixture.py), plainly cloned
and given one more commit on main here."""

import tempfile
from pathlib import Path

import git
import pytest

from backports.megatron import cli
from tests.from_pr_fixture import UTILS, Upstream, edit, shared

# #115 dropped this clause from a function of utils.py that megatron-core 0.19.2 has.
_UNDO_115 = (
    "p.name == name for p in params",
    "p.name == name or p.kind == inspect.Parameter.VAR_KEYWORD for p in params",
)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


@pytest.fixture(autouse=True)
def _scratch_in_the_tests_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _clone_with(upstream: Upstream, where: Path, subject: str, utils: str) -> Path:
    """A plain clone of the fixture whose main gains one commit setting ``UTILS``."""
    repo = upstream.repo.clone(str(where), multi_options=["--no-local", "--quiet"])
    (where / UTILS).write_text(utils, encoding="utf-8")
    repo.git.add(UTILS)
    env = {"GIT_AUTHOR_NAME": "F", "GIT_AUTHOR_EMAIL": "f@x", "GIT_COMMITTER_NAME": "F"}
    with repo.git.custom_environment(**env, GIT_COMMITTER_EMAIL="f@x"):
        repo.git.commit("--quiet", "-m", subject)
    return where


def test_a_change_the_release_already_has_is_one_line_and_nothing_written(
    upstream, tmp_path, capsys
) -> None:
    """#130 puts back the installed text of the function #115 changed: the installed text
    is #130's fixed text (and differs from its base), so there is nothing to carry."""
    main_utils = git.Repo(upstream.path).commit("main").tree / UTILS
    utils = edit(main_utils.data_stream.read().decode(), *_UNDO_115)
    clone = _clone_with(upstream, tmp_path / "clone", "Accept **kwargs again (#130)", utils)
    dest = tmp_path / "plugin"
    argv = ["new", "--from-pr", "130", "--repo", str(clone), "--dest", str(dest)]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    said = [line for line in (out + err).splitlines() if not line.startswith("note: ")]
    assert len(said) == 1 and "already has #130's change" in said[0], out + err
    assert "megatron-core 0.19.2" in said[0] and "nothing written" in said[0]
    assert not dest.exists()


def test_a_conflicting_hunk_names_the_upstream_change_it_needs_first(
    upstream, tmp_path, capsys
) -> None:
    """#103's hunk rewrites a line an earlier upstream commit wrote (the installed release
    predates it): the refusal names that commit and its pull request."""
    line = "input, bias = ctx.saved_tensors[0], ctx.saved_tensors[1]"
    base = upstream.sha("merge103") + "^"
    # The reference: the newest commit of the base whose diff adds or removes that line.
    wrote = upstream.repo.git.log("-n1", "--format=%H %s", f"-S{line}", base, "--").split()
    dest = tmp_path / "plugin"
    argv = ["new", "--from-pr", "103", "--repo", str(upstream.path), "--dest", str(dest)]
    assert cli.main(argv) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert "do not apply to the installed text" in first
    assert f"last changed upstream by {wrote[0][:12]} {wrote[-1]}" in first, (wrote, first)
    assert first.endswith("nothing written") and not dest.exists()
