"""Step one: the range of upstream merges to look at, and each merge in it.

The range starts at the installed release's branch point: the merge-base of main and the
release's tag (``core_v0.19.2``, ``v0.19.2``) where the clone has one, else of main and its
release branch (``core_r0.19.0`` for any 0.19.x: the branch every 0.19 release is cut
from), else of main and the newest tag of the same minor release. ``--since REF`` replaces
it (the merge-base of main and REF, so a release-branch commit works too). The merges are
main's first-parent commits after that point, newest first: a squash merge each, as
upstream merges pull requests.
"""

import re

from packaging.version import InvalidVersion, Version

from ..from_pr.clone import Clone
from .errors import CannotRead
from .model import Merge, Range

_PR = re.compile(r"\(#(\d+)\)\s*$")
_RECORD, _FIELD = "\x1e", "\x1f"
# Where a clone keeps a branch: its own heads (a mirror) or origin's (a plain clone).
_BRANCH_PREFIXES = ("refs/heads/", "refs/remotes/origin/")


def _release(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion as exc:
        raise CannotRead(f"the installed megatron-core has no release version: {version}") from exc


def _first_ref(clone: Clone, refs: list[str]) -> str | None:
    return next((ref for ref in refs if clone.ref_sha(ref) is not None), None)


def _short(ref: str) -> str:
    return re.sub(r"^refs/(heads|tags|remotes)/", "", ref)


def _same_minor_tags(clone: Clone, release: Version) -> list[tuple[Version, str]]:
    """(version, ref) of the clone's tags of ``release``'s minor series not newer than it."""
    out = str(clone.git.for_each_ref("--format=%(refname)", "refs/tags/"))
    found = []
    for ref in out.split():
        match = re.fullmatch(r"refs/tags/(?:core_)?v(\d+\.\d+\.\d+\S*)", ref)
        try:
            tagged = Version(match.group(1)) if match else None
        except InvalidVersion:
            tagged = None
        if tagged and tagged.release[:2] == release.release[:2] and tagged <= release:
            found.append((tagged, ref))
    return sorted(found, reverse=True)


def _release_branch(clone: Clone, release: Version) -> str | None:
    name = f"core_r{release.major}.{release.minor}.0"
    return _first_ref(clone, [prefix + name for prefix in _BRANCH_PREFIXES])


def _release_point(clone: Clone, release: Version, main: str) -> tuple[str, str, str]:
    """(the ref the branch point comes from, its merge-base with main, why that ref)."""
    exact = _first_ref(clone, [f"refs/tags/core_v{release}", f"refs/tags/v{release}"])
    branch = _release_branch(clone, release)
    older = _same_minor_tags(clone, release)
    if exact is not None:
        ref, why = exact, f"the tag {_short(exact)} of the installed release"
    elif branch is not None:
        ref = branch
        why = (
            f"no tag core_v{release} or v{release} in the clone: the release branch "
            f"{_short(branch)}, which every {release.major}.{release.minor}.x is cut from"
        )
    elif older:
        ref = older[0][1]
        why = (
            f"no tag of {release} and no branch core_r{release.major}.{release.minor}.0 in "
            f"the clone: the tag {_short(ref)}, the newest of the same minor release"
        )
    else:
        raise CannotRead(
            f"{clone.path} has no tag core_v{release} or v{release} and no branch "
            f"core_r{release.major}.{release.minor}.0: cannot find megatron-core {release}'s "
            "branch point (give --since REF)"
        )
    base = clone.merge_base(ref, main)
    if base is None:
        raise CannotRead(f"{_short(ref)} shares no history with {_short(main)} in {clone.path}")
    return ref, base, why


def _since(clone: Clone, since: str, main: str) -> tuple[str, str]:
    if since.startswith("-") or clone.ref_sha(since) is None:
        raise CannotRead(f"--since {since}: no such commit or ref in {clone.path}")
    base = clone.merge_base(since, main)
    if base is None:
        raise CannotRead(f"--since {since} shares no history with {_short(main)}")
    return base, f"--since {since}" + ("" if base == clone.ref_sha(since) else " (its merge-base)")


def find_range(clone: Clone, version: str, since: str | None) -> Range:
    """The range: after the installed release's branch point (or ``since``) up to main."""
    try:
        main = clone.main_ref()
    except Exception as exc:
        raise CannotRead(str(exc).splitlines()[0]) from exc
    tip = clone.ref_sha(main)
    assert tip is not None
    release = _release(version)
    branch = _release_branch(clone, release)
    if since is not None:
        base, how = _since(clone, since, main)
        return Range(base, tip, main, how, branch)
    ref, base, why = _release_point(clone, release, main)
    return Range(base, tip, main, f"merge-base of {_short(main)} and {_short(ref)} ({why})", branch)


def merges(clone: Clone, span: Range) -> list[Merge]:
    """Main's first-parent commits after ``span.base``, newest first, with their files."""
    fmt = _FIELD.join(["%H", "%P", "%cI", "%s", "%b"])
    out = str(
        clone.git.log(
            "--first-parent",
            "--diff-merges=first-parent",
            "--name-only",
            f"--format={_RECORD}{fmt}{_FIELD}",
            f"{span.base}..{span.tip}",
            "--",
        )
    )
    found = []
    for record in out.split(_RECORD)[1:]:
        sha, parents, date, subject, body, names = record.split(_FIELD, 5)
        number = _PR.search(subject)
        first_parent = parents.split()[0] if parents.split() else None
        found.append(
            Merge(
                sha=sha,
                parent=first_parent,
                pr=int(number.group(1)) if number else None,
                subject=subject,
                body=body.strip(),
                date=date,
                files=tuple(line for line in names.splitlines() if line.strip()),
            )
        )
    return found


def release_commits(clone: Clone, span: Range) -> dict[int, str]:
    """Pull-request number -> the commit on the release branch that names it (upstream's
    cherry-pick bot writes ``cp: `subject (N)` into core_r0.19.0 (#M)``)."""
    if span.release_branch is None:
        return {}
    out = str(clone.git.log("--format=%H %s", span.release_branch, f"^{span.base}", "--"))
    named: dict[int, str] = {}
    for line in out.splitlines():
        sha, _, subject = line.partition(" ")
        for number in re.findall(r"\(#?(\d+)\)", subject):
            named.setdefault(int(number), sha)
    return named
