"""Git ancestry evidence, on Megatron-LM-shaped checkouts built here with gitpython."""

from pathlib import Path

import git
import pytest

from backports.megatron.evidence.git_ancestry import commit_ancestry
from backports.megatron.evidence.versions import _version_from_package_info

CORE = {"distribution": "megatron-core", "package": "megatron.core"}

PACKAGE_INFO = 'MAJOR = 0\nMINOR = 19\nPATCH = 2\nPRE_RELEASE = "rc1"\n__version__ = "x"\n'


def _commit(repo: git.Repo, path: Path, text: str, message: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    repo.index.add([str(path)])
    return repo.index.commit(message).hexsha


@pytest.fixture
def checkout(tmp_path):
    """base -> fix (the PR's merge) -> later, plus an unrelated commit on a side branch."""
    repo = git.Repo.init(tmp_path / "Megatron-LM", initial_branch="main")
    core = Path(repo.working_tree_dir) / "megatron" / "core"
    shas = {"base": _commit(repo, core / "package_info.py", PACKAGE_INFO, "base")}
    _commit(repo, core / "__init__.py", "", "package")
    shas["fix"] = _commit(repo, core / "fix.py", "FIXED = True\n", "the fix")
    repo.git.checkout("-b", "side", shas["base"])
    shas["side"] = _commit(repo, core / "side.py", "", "side")
    repo.git.checkout("main")
    return repo, core, shas


def test_checkout_that_contains_the_merge(checkout):
    repo, core, shas = checkout
    evidence = commit_ancestry(core, {"merge": shas["fix"][:7], "head": shas["side"]}, **CORE)
    assert evidence["checkout"] is True
    assert evidence["contains"] == {"merge": True, "head": False}
    assert evidence["head"] == repo.head.commit.hexsha


def test_checkout_before_the_merge(checkout):
    repo, core, shas = checkout
    repo.git.checkout(shas["base"])
    (core / "__init__.py").write_text("")
    evidence = commit_ancestry(core, {"merge": shas["fix"]}, **CORE)
    assert evidence["contains"] == {"merge": False}


def test_unknown_commit_is_unknown_not_false(checkout):
    _, core, _ = checkout
    evidence = commit_ancestry(core, {"merge": "f77f360"}, **CORE)
    assert evidence["contains"] == {"merge": None}


def test_megatron_inside_a_users_project_is_no_evidence(tmp_path):
    """A venv inside a user's git project: megatron's +sha would name the user's commit."""
    project = git.Repo.init(tmp_path / "project")
    core = Path(project.working_tree_dir) / ".venv" / "site-packages" / "megatron" / "core"
    _commit(project, core / "package_info.py", PACKAGE_INFO, "vendored venv")
    evidence = commit_ancestry(core, {"merge": project.head.commit.hexsha}, **CORE)
    assert evidence["checkout"] is False
    assert "unrelated git work tree" in evidence["note"]


def test_not_a_checkout(tmp_path):
    core = tmp_path / "site-packages" / "megatron" / "core"
    core.mkdir(parents=True)
    assert commit_ancestry(core, {"merge": "f77f360"}, **CORE)["checkout"] is False


def test_version_read_from_package_info_without_executing_it(tmp_path):
    (tmp_path / "package_info.py").write_text(PACKAGE_INFO + "raise SystemExit('executed')\n")
    assert str(_version_from_package_info(tmp_path)) == "0.19.2rc1"
    assert _version_from_package_info(tmp_path / "missing") is None


def test_another_distributions_checkout_is_read_by_its_own_package(tmp_path):
    """Nothing assumes megatron/core: a target in another distribution's tree is looked up
    at <root>/<its package>, and the notes name that distribution."""
    repo = git.Repo.init(tmp_path / "other-project", initial_branch="main")
    package = Path(repo.working_tree_dir) / "otherpkg" / "sub"
    fix = _commit(repo, package / "__init__.py", "", "the fix")
    own = {"distribution": "other-dist", "package": "otherpkg.sub"}
    evidence = commit_ancestry(package, {"merge": fix}, **own)
    assert evidence["checkout"] is True and evidence["contains"] == {"merge": True}
    wrong = commit_ancestry(package, {"merge": fix}, **CORE)
    assert wrong["checkout"] is False and "megatron-core sits inside" in wrong["note"]
    missing = commit_ancestry(None, {"merge": fix}, **own)
    assert missing == {"checkout": False, "note": "other-dist not found on sys.path"}


@pytest.mark.parametrize(
    "text",
    [
        "MAJOR = " + " + ".join(["0"] * 10_000) + "\n",  # RecursionError in ast.parse
        "MAJOR = 0\n" + "#" * (64 * 1024) + "\n",  # bigger than megatron's ever is
        "MAJOR = '\xff'\n",  # not UTF-8 once written as latin-1
    ],
    ids=["too-deep", "too-big", "not-utf8"],
)
def test_a_package_info_that_cannot_be_read_is_no_evidence(tmp_path, text) -> None:
    (tmp_path / "package_info.py").write_text(PACKAGE_INFO + text, encoding="latin-1")
    assert _version_from_package_info(tmp_path) is None
