"""``backports candidates --repo CLONE``: the named steps, and the one output.

    range -> merges -> symbol states -> signals -> carriers -> from-pr verdict -> rank
    -> (--derive) -> table or JSON

Nothing is printed before every step is done: a clone that cannot be read is one line on
stderr and exit 2 (the command runner prints ``CannotRead``), never half a table. Nothing
here prints: ``listing`` returns the text and the commands wing prints it.
"""

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

from ..from_pr.clone import open_clone
from ..from_pr.errors import BadInput
from ..from_pr.locate import installed_distribution
from . import derive, history, signals, states
from .carriers import carried_by, catalog_records
from .errors import CannotRead
from .model import Candidate, Merge, Range
from .ranking import ranked
from .render import document, table
from .verdict import from_pr_verdict


def _candidate(
    merge: Merge, span: Range, texts: states.Texts, records: list[Any], released: dict[int, str]
) -> Candidate:
    changes, found, unread = states.symbol_states(merge, span.main_ref, texts)
    state = states.merge_state(found) if unread is None else "unread"
    return Candidate(
        merge=merge,
        symbols=found,
        state=state,
        fix=signals.fix_signal(merge),
        reach=signals.reach(merge),
        carried_by=carried_by(merge, records),
        release_commit=released.get(merge.pr) if merge.pr else None,
        from_pr=from_pr_verdict(merge, changes, found, state, texts),
        notes=(unread,) if unread else (),
    )


def collect(clone_path: str, since: str | None) -> tuple[list[Candidate], dict[str, Any]]:
    """Every candidate, ranked, and what the header says of the range."""
    start = time.monotonic()
    try:
        clone = open_clone(clone_path)
        installed = installed_distribution()
    except BadInput as exc:
        raise CannotRead(str(exc).splitlines()[0]) from exc
    span = history.find_range(clone, installed.version, since)
    try:
        in_range = history.merges(clone, span)
        released = history.release_commits(clone, span)
    except Exception as exc:  # git could not read the history
        raise CannotRead(f"cannot read {clone.path}'s history: {exc}".splitlines()[0]) from exc
    code = [m for m in in_range if states.touches_code(m)]
    texts = states.Texts(clone, installed)
    records = catalog_records()
    with warnings.catch_warnings():  # upstream's own invalid escapes, as it parses
        warnings.simplefilter("ignore", SyntaxWarning)
        candidates = ranked([_candidate(m, span, texts, records, released) for m in code])
    head = {
        "installed": f"{installed.name} {installed.version}",
        "clone": str(clone.path),
        "range": span,
        "counts": {
            "merges": len(in_range),
            "listed": len(code),
            "left_out": len(in_range) - len(code),
            "carried": sum(1 for c in candidates if c.carried_by),
            "present": sum(1 for c in candidates if c.state == "present"),
            "needed": sum(1 for c in candidates if c.needed),
        },
        "seconds": round(time.monotonic() - start, 1),
    }
    return candidates, head


def listing(args: argparse.Namespace, progress: derive.Progress) -> str:
    """The table (or with ``--json`` the document) of every candidate; ``CannotRead`` where
    the clone or the installed release cannot be read. ``--derive``'s progress goes to
    ``progress``, a line per child; the commands wing prints both."""
    if args.repo is None:
        raise CannotRead("candidates needs --repo: the path of a Megatron-LM clone")
    if args.derive is not None and args.derive < 0:
        raise CannotRead(f"--derive takes a count of candidates, not {args.derive}")
    candidates, head = collect(args.repo, args.since)
    if args.derive:
        derive.derive(candidates, args.derive, Path(head["clone"]), Path.cwd(), progress)
    return document(candidates, head) if args.json else table(candidates, head)
