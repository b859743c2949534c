"""``--from-pr`` step one: a pull-request number to its head, merge and base commits, on the
fixture repository (tests/from_pr_fixture.py): merged, open, a twin off main, unknown."""

from pathlib import Path

import pytest

from backports.megatron.authoring.from_pr.clone import Clone, open_clone
from backports.megatron.authoring.from_pr.errors import BadInput, Refused
from backports.megatron.authoring.from_pr.resolve import resolve_pull_request
from tests.from_pr_fixture import NEWEST, Upstream, shared


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


@pytest.fixture(scope="module")
def clone(upstream: Upstream) -> Clone:
    return open_clone(str(upstream.path))


def test_a_merged_pull_request_has_its_head_merge_and_base(upstream, clone) -> None:
    pr = resolve_pull_request(clone, 102)
    assert pr.head.sha == upstream.sha("head102") and pr.head.verified
    assert pr.merge is not None and pr.merge.sha == upstream.sha("merge102")
    assert pr.merge.verified, pr.merge.how
    # A squash merge's base is its parent (#91, after the branch point #90): what main did
    # meanwhile is in the base, not in the change.
    assert pr.base.sha == upstream.sha("docs91")
    assert pr.new == pr.merge
    assert all(len(c.sha) == 40 for c in (pr.head, pr.merge, pr.base))


def test_an_open_pull_request_is_diffed_from_its_merge_base(upstream, clone) -> None:
    pr = resolve_pull_request(clone, 105)
    assert pr.merge is None
    assert pr.head.sha == upstream.sha("head105")
    assert pr.base.sha == upstream.sha("merge107")  # where its branch left main
    assert pr.new == pr.head


def test_a_twin_off_main_is_discarded(upstream, clone) -> None:
    """#101's squash commit was cherry-picked onto release with the same subject: the
    one on main is the merge; the twin is listed as discarded."""
    pr = resolve_pull_request(clone, 101)
    assert pr.merge is not None and pr.merge.sha == upstream.sha("merge101")
    assert pr.twins == (upstream.sha("twin101"),)


def test_a_pull_request_newer_than_the_clone_is_refused_in_one_line(clone) -> None:
    with pytest.raises(Refused) as caught:
        resolve_pull_request(clone, NEWEST + 1)
    message = str(caught.value)
    assert "\n" not in message
    assert f"#{NEWEST + 1} is newer than this clone" in message
    assert f"#{NEWEST}" in message


def test_a_number_neither_merged_nor_fetched_prints_the_fetch_command(clone) -> None:
    with pytest.raises(BadInput) as caught:
        resolve_pull_request(clone, 100)
    assert str(caught.value).endswith("git fetch origin pull/100/head:refs/pull/100/head")
    assert caught.value.exit_code == 2


@pytest.fixture(scope="module")
def plain_clone(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Clone:
    """``git clone`` of the fixture: main's history, no refs/pull/* (as GitHub serves it)."""
    path = tmp_path_factory.mktemp("plain") / "Megatron-LM"
    upstream.repo.git.clone("--quiet", "--no-local", str(upstream.path), str(path))
    plain = open_clone(str(path))
    assert plain.pull_numbers() == []
    return plain


def test_a_plain_clone_resolves_a_merged_pull_request_from_main_alone(upstream, plain_clone):
    pr = resolve_pull_request(plain_clone, 102)
    assert pr.merge is not None and pr.merge.sha == upstream.sha("merge102")
    assert pr.merge.verified and "first-parent on" in pr.merge.how, pr.merge.how
    assert pr.base.sha == upstream.sha("docs91")  # the squash merge's parent
    assert pr.head is None and pr.new == pr.merge


def test_a_plain_clone_refuses_an_open_pull_request_with_the_fetch_command(plain_clone):
    with pytest.raises(BadInput) as caught:
        resolve_pull_request(plain_clone, 105)
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 2
    assert message.endswith("git fetch origin pull/105/head:refs/pull/105/head"), message


def test_a_plain_clone_still_refuses_an_octopus_merge(upstream, plain_clone) -> None:
    """Without the pull ref, the merge's second parent stands for the head: the octopus
    still brings another branch and is refused."""
    with pytest.raises(Refused, match=f"also merges {upstream.sha('other116')[:12]}"):
        resolve_pull_request(plain_clone, 116)


@pytest.mark.parametrize("number", [0, -3])
def test_a_number_that_is_no_pull_request_is_bad_input(clone, number: int) -> None:
    with pytest.raises(BadInput, match="positive"):
        resolve_pull_request(clone, number)


def test_a_folder_that_is_no_clone_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="not a git repository"):
        open_clone(str(tmp_path))


def test_a_merge_that_changes_other_files_than_its_head_is_not_verified(upstream, clone) -> None:
    """A commit on main that names #N but changes files the head never touched is used,
    and recorded as not verified."""
    import git

    repo = git.Repo(upstream.path)
    main = repo.commit("main").hexsha
    repo.git.checkout("--quiet", "--force", "--detach", "main")
    (upstream.path / "UNRELATED.md").write_text("x\n")
    repo.git.add("UNRELATED.md")
    repo.git.commit("--quiet", "-m", "Something else entirely (#105)")
    sha = repo.head.commit.hexsha
    repo.git.update_ref("refs/heads/main", sha)
    try:
        pr = resolve_pull_request(open_clone(str(upstream.path)), 105)
        assert pr.merge is not None and pr.merge.sha == sha
        assert not pr.merge.verified and "NOT the same files" in pr.merge.how
    finally:
        repo.git.update_ref("refs/heads/main", main)
        repo.git.checkout("--quiet", "--force", "main")


def test_an_octopus_merge_bringing_another_change_is_refused_in_one_line(upstream, clone) -> None:
    """#116's merge on main is an octopus that also brings a branch of no pull request
    (its change to GeLU's backward): refused, not used "NOT verified"."""
    with pytest.raises(Refused) as caught:
        resolve_pull_request(clone, 116)
    message = str(caught.value)
    assert "\n" not in message
    assert f"also merges {upstream.sha('other116')[:12]} (Another change)" in message
    assert "write this backport by hand" in message


def test_a_merge_commit_of_the_head_alone_is_verified(tmp_path, upstream) -> None:
    """A plain two-parent merge of refs/pull/116/head titled (#116): its change against
    main is the head's, so it is used, verified, with main as its base."""
    copy = tmp_path / "clone"
    upstream.repo.git.clone("--quiet", "--mirror", str(upstream.path), str(copy))
    repo = open_clone(str(copy))
    main = upstream.sha("merge115")
    tree = upstream.repo.commit(upstream.sha("head116")).tree.hexsha
    env = {"GIT_AUTHOR_NAME": "F", "GIT_AUTHOR_EMAIL": "f@x", "GIT_COMMITTER_NAME": "F"}
    env["GIT_COMMITTER_EMAIL"] = "f@x"
    with repo.git.custom_environment(**env):
        merge = repo.git.commit_tree(
            tree, "-p", main, "-p", upstream.sha("head116"), "-m", "Merge (#116)"
        ).strip()
    repo.git.update_ref("refs/heads/main", merge)
    pr = resolve_pull_request(repo, 116)
    assert pr.merge is not None and pr.merge.sha == merge and pr.merge.verified, pr.merge
    assert pr.base.sha == main


@pytest.mark.parametrize(
    ("origins", "recorded"),
    [
        ([], "NVIDIA/Megatron-LM"),  # no origin: the upstream, not the clone's folder
        (
            ["https://user:t0ken@github.com/NVIDIA/Megatron-LM.git"],
            "https://github.com/NVIDIA/Megatron-LM.git",
        ),
        (["git@github.com:acme/Megatron-LM.git"], "git@github.com:acme/Megatron-LM.git"),
        (
            ["file://MIRROR", "https://example.com/Megatron-LM.git"],
            "https://example.com/Megatron-LM.git",
        ),
        (["MIRROR"], "NVIDIA/Megatron-LM"),  # a chain of local folders: no path is written
    ],
)
def test_the_recorded_repo_is_never_a_path_of_this_machine(tmp_path, origins, recorded) -> None:
    """``repo`` in a generated plugin's UPSTREAM.toml: the first network URL along the
    clone's chain of origins, without credentials, else ``NVIDIA/Megatron-LM``."""
    import git

    from backports.megatron.authoring.from_pr.derivation import repo_name

    clone = git.Repo.init(tmp_path / "clone")
    mirror = git.Repo.init(tmp_path / "mirror", bare=True)
    if origins:
        clone.create_remote("origin", origins[0].replace("MIRROR", str(tmp_path / "mirror")))
    if len(origins) > 1:
        mirror.create_remote("origin", origins[1])
    url = open_clone(str(tmp_path / "clone")).origin_url()
    assert url == recorded and str(tmp_path) not in url
    assert repo_name(url) in ("NVIDIA/Megatron-LM", "acme/Megatron-LM", "Megatron-LM")
