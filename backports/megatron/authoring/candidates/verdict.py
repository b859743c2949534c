"""Step five: what ``backports new --from-pr`` would say of a merge, up to where its first
child would start: the budget (``from_pr.budget``), then the shape checks its vendoring
step makes (a changed symbol the release lacks, nothing installed to swap, a drifted
symbol whose hunks do not apply by ``from_pr.merge``'s three-way merge). No code of the
merge runs; whether a sniff and the proof succeed only ``--derive`` finds out.
"""

from ..from_pr.budget import check_budget
from ..from_pr.errors import FromPrError, Reason
from ..from_pr.merge import merge_symbol
from ..from_pr.model import Located, Symbol
from ..from_pr.symbols import Changes
from .model import FromPrVerdict, Merge, SymbolState
from .states import Texts

# A symbol's state as ``from_pr.locate`` names it (the installed text against the base).
_LOCATED = {
    "missing": "identical",
    "drifted": "drifted",
    "present": "drifted",
    "absent": "absent",
    "new": "new",
    "not shipped": "not shipped",
}


def _located(symbols: tuple[Symbol, ...], states: tuple[SymbolState, ...]) -> list[Located]:
    return [
        Located(symbol, _LOCATED.get(state.state, "identical"))
        for symbol, state in zip(symbols, states, strict=True)
    ]


def _conflict(state: SymbolState, merge: Merge, texts: Texts) -> str | None:
    """Why the merge's hunks do not apply to the installed text of a drifted symbol."""
    assert merge.parent is not None
    parent = texts.symbol_at(merge.parent, state.path, state.qualname)
    new = texts.symbol_at(merge.sha, state.path, state.qualname)
    here, _ = texts.installed_symbol(state.path, state.qualname)
    if parent is None or new is None or here is None:
        return None
    try:
        merge_symbol(here, parent, new, f"{state.path}::{state.qualname}")
    except FromPrError as exc:
        return str(exc).splitlines()[0]
    return None


def _swappable(state: SymbolState) -> bool:
    return state.kind in ("function", "method") and state.state in ("missing", "drifted")


def from_pr_verdict(
    merge: Merge,
    changes: Changes | None,
    states: tuple[SymbolState, ...],
    merge_state: str,
    texts: Texts,
) -> FromPrVerdict:
    """The verdict (see the module's doc)."""
    if merge.pr is None:
        return FromPrVerdict("no pr", "the subject names no pull request (#N)")
    if changes is None:
        return FromPrVerdict("no swap", "its diff could not be read")
    if merge_state == "present":
        return FromPrVerdict("present", "the installed release already has it: nothing to carry")
    try:
        figures = str(check_budget(_located(changes.symbols, states)))
    except FromPrError as exc:  # over the size budget, or a change no kind carries
        verdict = "too big" if exc.reason is Reason.OVER_BUDGET else "no swap"
        return FromPrVerdict(verdict, str(exc).splitlines()[0])
    compared = [s for s in states if s.kind not in ("comment", "import", "inert")]
    absent = [s for s in compared if s.state == "absent"]
    if absent:
        shown = f"{absent[0].path}::{absent[0].qualname}"
        return FromPrVerdict("absent", f"{shown} is not installed: nothing to patch", figures)
    if not any(_swappable(s) for s in compared):
        return FromPrVerdict("no swap", "it changes no installed function or method", figures)
    for state in compared:
        why = (
            _conflict(state, merge, texts)
            if _swappable(state) and state.state == "drifted"
            else None
        )
        if why is not None:
            return FromPrVerdict("conflict", why, figures)
    drifted = sum(1 for s in compared if s.state == "drifted")
    how = f"{drifted} drifted symbol(s) merged by its hunks" if drifted else "no drift"
    return FromPrVerdict("carryable", f"within the budget; {how}; the sniff decides", figures)
