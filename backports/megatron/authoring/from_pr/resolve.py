"""Step one: a pull-request number to the three commits the derivation rests on.

- head: ``refs/pull/N/head``;
- merge: the commit on main whose subject names ``(#N)`` (a squash merge); commits that
  name it but are not ancestors of main (a twin cherry-picked onto another branch, as
  #6114's ``98be7da3`` on #6514's) are discarded and listed;
- base: ``merge^`` for a merged pull request, ``merge-base(head, main)`` for an open one.

A merge commit (an octopus too) titled ``(#N)`` is used only where it merges the pull
request's head and nothing else new: else it is refused, never used "NOT verified".

A plain ``git clone`` has main's history but no ``refs/pull/*``: a merged pull request
resolves from main alone (the commit naming ``(#N)`` on main's first-parent line, its parent
the base; a merge commit's second parent stands for the head, a squash merge's head is then
not known). Only an open pull request needs ``refs/pull/N/head``: its refusal (exit 2)
prints the command that fetches it.

A number above the clone's newest pull ref is refused in one line: the clone predates it.
"""

import re

from .clone import Clone
from .errors import BadInput, FromPrError, Reason, Refused
from .model import Commit, PullRequest


def _head(clone: Clone, number: int) -> Commit | None:
    sha = clone.ref_sha(f"refs/pull/{number}/head")
    if sha is None:
        return None
    return Commit("head", sha, clone.is_commit(sha), f"refs/pull/{number}/head")


def _no_head_nor_merge(clone: Clone, number: int, main: str) -> FromPrError:
    """Neither merged into main here nor fetched: one line with the command that fetches it."""
    fetch = f"git fetch origin pull/{number}/head:refs/pull/{number}/head"
    known = clone.pull_numbers()
    if known and number > known[-1]:
        return Refused(
            f"#{number} is newer than this clone (its newest pull ref is #{known[-1]}): "
            f"fetch it first ({fetch})",
            Reason.NOT_IN_CLONE,
        )
    return BadInput(
        f"#{number} is not merged into {main} in {clone.path}, and an open pull request needs "
        f"its head: {fetch}"
    )


def _head_of_merge_commit(clone: Clone, number: int, merge: Commit) -> Commit | None:
    """Without refs/pull/N/head, a merge commit's second parent is the branch it brought in."""
    parents = clone.parents(merge.sha)
    if len(parents) < 2:
        return None
    how = f"merge^2 (the branch the merge brings in; this clone has no refs/pull/{number}/head)"
    return Commit("head", parents[1], True, how)


def _merge_on_main_line(clone: Clone, number: int, merge: Commit, main: str) -> Commit:
    """A squash merge with no head to compare with: verified by landing on main itself."""
    lacks = f"its head is not in this clone (no refs/pull/{number}/head), not needed once merged"
    if clone.on_first_parent_line(merge.sha, main):
        return Commit(merge.role, merge.sha, True, f"{merge.how}, first-parent on {main}; {lacks}")
    return Commit(merge.role, merge.sha, False, f"{merge.how}, NOT first-parent on {main}; {lacks}")


def _merge(clone: Clone, number: int, main: str) -> tuple[Commit | None, tuple[str, ...]]:
    """The squash merge on main, and the twins (commits naming #N off main) discarded."""
    tag = f"(#{number})"
    naming = [(sha, subject) for sha, subject in clone.commits_naming(tag) if tag in subject]
    on_main = [sha for sha, _ in naming if clone.is_ancestor(sha, main)]
    twins = tuple(sha for sha, _ in naming if sha not in on_main)
    # A revert names the pull request inside quotes; the merge itself ends with the tag.
    merges = [sha for sha in on_main if re.search(re.escape(tag) + r"\s*$", clone.subject(sha))]
    if not merges:
        return None, twins
    sha = merges[0]  # newest first, as git log lists them
    how = f"the commit on {main} whose subject ends with {tag}"
    if len(merges) > 1:
        how += f" (the newest of {len(merges)}: {', '.join(m[:12] for m in merges[1:])} older)"
    return Commit("merge", sha, clone.is_commit(sha), how), twins


def _base(clone: Clone, head: Commit | None, merge: Commit | None, main: str) -> Commit:
    if merge is not None:
        parents = clone.parents(merge.sha)
        if not parents:
            raise Refused(
                f"the merge {merge.sha} has no parent to diff against", Reason.NOT_IN_CLONE
            )
        return Commit("base", parents[0], True, "merge^ (the squash merge's parent)")
    assert head is not None  # resolve_pull_request refuses neither merged nor fetched
    sha = clone.merge_base(head.sha, main)
    if sha is None:
        raise Refused(f"refs/pull/{head.how} shares no history with {main}", Reason.NOT_IN_CLONE)
    return Commit("base", sha, True, f"merge-base(head, {main}) (the pull request is open)")


def _merge_checked(clone: Clone, merge: Commit, head: Commit, base: Commit) -> Commit:
    """Verified: the merge changes the files the pull request's own commits change."""
    pr_base = clone.merge_base(head.sha, merge.sha) or base.sha
    merged = {p for pair in clone.changed_files(base.sha, merge.sha) for p in pair if p}
    proposed = {p for pair in clone.changed_files(pr_base, head.sha) for p in pair if p}
    if merged == proposed:
        return Commit(merge.role, merge.sha, True, f"{merge.how}; changes the head's files")
    differ = ", ".join(sorted(merged ^ proposed)[:3])
    why = f"{merge.how}; NOT the same files as the head changes (differ: {differ})"
    return Commit(merge.role, merge.sha, False, why)


def _merge_commit_checked(clone: Clone, number: int, merge: Commit, head: Commit) -> Commit:
    """A merge commit (two parents or more) titled ``(#N)``: its change against its first
    parent holds every branch it merges. Used only where one of those is the pull request's
    head, every other brings nothing main or the head lacks, and the files match the head's;
    else ``Refused``: an octopus merge would drag another change in."""
    first, *merged = clone.parents(merge.sha)
    where = f"{merge.sha[:12]}, the merge titled (#{number}),"
    todo = f"write this backport by hand (backports new --pr {number} --repo ... --target ...)"
    if head.sha not in merged:
        raise Refused(
            f"{where} does not merge refs/pull/{number}/head ({head.sha[:12]}): what it brings "
            f"cannot be told to be the pull request's; {todo}"
        )
    for other in merged:
        if other != head.sha and not (
            clone.is_ancestor(other, first) or clone.is_ancestor(other, head.sha)
        ):
            raise Refused(
                f"{where} also merges {other[:12]} ({clone.subject(other)}), which is not the "
                f"pull request's: its change would be carried too; {todo}"
            )
    pr_base = clone.merge_base(head.sha, first) or first
    merged_files = {p for pair in clone.changed_files(first, merge.sha) for p in pair if p}
    proposed = {p for pair in clone.changed_files(pr_base, head.sha) for p in pair if p}
    if merged_files != proposed:
        differ = ", ".join(sorted(merged_files ^ proposed)[:3])
        raise Refused(f"{where} changes other files than its head ({differ}); {todo}")
    how = f"{merge.how}; merges the head and nothing else, changing its files"
    return Commit(merge.role, merge.sha, True, how)


def resolve_pull_request(clone: Clone, number: int) -> PullRequest:
    """The head, merge and base commits of pull request ``number`` in ``clone``."""
    if number <= 0:
        raise BadInput(f"--from-pr must be a positive pull-request number, not {number}")
    main = clone.main_ref()
    head = _head(clone, number)
    merge, twins = _merge(clone, number, main)
    if head is None and merge is None:
        raise _no_head_nor_merge(clone, number, main)
    if head is None and merge is not None:
        head = _head_of_merge_commit(clone, number, merge)
    base = _base(clone, head, merge, main)
    if merge is not None and head is None:
        merge = _merge_on_main_line(clone, number, merge, main)
    elif merge is not None and head is not None and len(clone.parents(merge.sha)) > 1:
        merge = _merge_commit_checked(clone, number, merge, head)
    elif merge is not None and head is not None:
        merge = _merge_checked(clone, merge, head, base)
    return PullRequest(number, head, merge, base, main, twins)
