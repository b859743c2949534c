"""Does a Megatron-LM source checkout already contain an upstream commit?"""

from pathlib import Path
from typing import Any

__all__ = ["commit_ancestry"]


def _git_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def commit_ancestry(package_dir: Path | None, commits: dict[str, str]) -> dict[str, Any]:
    """Evidence on whether ``HEAD`` of the checkout holding ``package_dir`` contains ``commits``.

    ``commits`` maps a role ("merge", "head") to a SHA. The checkout counts only if it *is*
    Megatron-LM (``<root>/megatron/core`` is the package): a venv inside a user's git
    project says nothing about megatron's history. Each SHA gets True, False or None
    (unknown to this clone, e.g. a shallow one).
    """
    if package_dir is None:
        return {"checkout": False, "note": "megatron-core not found on sys.path"}
    root = _git_root(package_dir)
    if root is None:
        return {"checkout": False, "note": "megatron-core is not inside a git work tree"}
    if (root / "megatron" / "core").resolve() != package_dir.resolve():
        return {
            "checkout": False,
            "note": f"megatron-core sits inside an unrelated git work tree ({root})",
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
