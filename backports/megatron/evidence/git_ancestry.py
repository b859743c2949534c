"""Does a source checkout of the target's distribution already contain an upstream commit?"""

from pathlib import Path
from typing import Any


def _git_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def commit_ancestry(
    package_dir: Path | None, commits: dict[str, str], *, distribution: str, package: str | None
) -> dict[str, Any]:
    """Evidence on whether ``HEAD`` of the checkout holding ``package_dir`` contains ``commits``.

    ``commits`` maps a role ("merge", "head") to a SHA. The checkout counts only if it *is*
    the distribution's source tree (``<root>/<package as a path>`` is ``package_dir``, e.g.
    ``<root>/megatron/core``): a venv inside a user's git project says nothing about the
    distribution's history. Each SHA gets True, False or None (unknown to this clone, e.g. a
    shallow one).
    """
    if package_dir is None or package is None:
        return {"checkout": False, "note": f"{distribution} not found on sys.path"}
    root = _git_root(package_dir)
    if root is None:
        return {"checkout": False, "note": f"{distribution} is not inside a git work tree"}
    if root.joinpath(*package.split(".")).resolve() != package_dir.resolve():
        return {
            "checkout": False,
            "note": f"{distribution} sits inside an unrelated git work tree ({root})",
        }
    try:
        import git
    except ImportError:
        return {"checkout": True, "root": str(root), "note": "gitpython not installed"}
    try:
        repo = git.Repo(root)
        head = repo.head.commit.hexsha
    except (git.GitError, ValueError) as exc:
        return {"checkout": True, "root": str(root), "note": f"unreadable repository: {exc}"}
    contains: dict[str, bool | None] = {}
    for role, sha in commits.items():
        try:
            contains[role] = bool(repo.is_ancestor(sha, head))
        except git.GitCommandError:
            contains[role] = None
    return {"checkout": True, "root": str(root), "head": head, "contains": contains}
