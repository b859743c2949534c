"""Whether the installed release already carries a pull request's change.

A fix cherry-picked onto the release branch (or a release cut after the merge) leaves every
symbol the pull request changes *drifted* from its base, and equal to the pull request's
own text: there is nothing to carry, and ``--from-pr`` says so in one line instead of
"drifted ... write the sniff by hand".
"""

from .clone import Clone
from .locate import Installed, _same, module_of
from .model import Located, PullRequest
from .units import map_units, segment

# Kinds that change nothing a swap carries (a comment, an import line): they do not vote.
_INERT = ("comment", "import", "inert")


def _fixed_text(loc: Located, clone: Clone, pr: PullRequest) -> str | None:
    text = clone.text(pr.new.sha, loc.symbol.path)
    return None if text is None else segment(text, map_units(text), loc.symbol.qualname)


def _installed_text(loc: Located, installed: Installed) -> str | None:
    if loc.status == "new":  # a helper the pull request adds: installed where it adds it?
        return installed.text_of(loc.symbol.path, loc.symbol.qualname)
    if loc.status != "drifted" or loc.module is None or loc.qualname is None:
        return None  # identical to the base (so without the change), absent, not shipped
    path = next((p for p in installed.files if module_of(p) == loc.module), None)
    return None if path is None else installed.text_of(path, loc.qualname)


def already_present(
    located: list[Located], clone: Clone, pr: PullRequest, installed: Installed
) -> bool:
    """True when every installed symbol the pull request changes reads as its fixed text
    (formatting aside), and there is at least one: the release already has the change."""
    voting = [
        loc for loc in located if loc.symbol.kind not in _INERT and loc.status != "not shipped"
    ]
    if not voting:
        return False
    for loc in voting:
        fixed = _fixed_text(loc, clone, pr)
        here = _installed_text(loc, installed)
        if fixed is None or here is None or _same(fixed, here) is None:
            return False
    return True
