"""How big a fix a derived backport may carry, and the figures of one pull request.

A backport swaps functions and methods, with the helpers and constants they call. A change
no kind carries (a dataclass field, a Triton kernel object, a changed module statement) is
refused as such (``shape``), whatever its size; a fix with many pieces across files is
better waited for (``over-budget``): its backport would be a fork. The refusal names the
figure over its limit and the limit. Inert changes (docstrings, comments) count for nothing.
"""

from dataclasses import dataclass

from .errors import Reason, Refused
from .model import Located

# Kinds that change nothing at run time, or that the vendored file repeats (imports).
IGNORED = frozenset({"comment", "import", "inert"})


@dataclass(frozen=True)
class Budget:
    symbols: int = 8  # targets, new helpers and new constants carried
    files: int = 3  # upstream files they come from
    lines: int = 300  # diff lines inside them

    def __str__(self) -> str:
        return (
            f"at most {self.symbols} carried symbols (targets, new helpers, constants) from "
            f"{self.files} files, {self.lines} changed lines in them"
        )


BUDGET = Budget()


@dataclass(frozen=True)
class Figures:
    symbols: int
    files: int
    lines: int
    uncarriable: tuple[str, ...]  # "path::qualname (kind)"
    inert: int = 0  # changes dropped: docstrings, comments, bare annotations

    def __str__(self) -> str:
        text = f"{self.symbols} symbols from {self.files} files, {self.lines} changed lines"
        if self.uncarriable:
            text += f", {len(self.uncarriable)} no kind carries"
        if self.inert:
            text += f", {self.inert} inert change(s) dropped"
        return text


def figures(located: list[Located]) -> Figures:
    carried = [loc for loc in located if loc.symbol.carriable and loc.symbol.kind not in IGNORED]
    other = [loc for loc in located if not loc.symbol.carriable and loc.symbol.kind not in IGNORED]
    return Figures(
        symbols=len(carried),
        files=len({loc.symbol.path for loc in carried}),
        lines=sum(loc.symbol.lines for loc in carried),
        uncarriable=tuple(f"{loc.symbol.shown} ({loc.symbol.kind})" for loc in other),
        inert=sum(1 for loc in located if loc.symbol.kind == "inert"),
    )


def _refuse_shapes(seen: Figures) -> None:
    """A change no kind carries: named, whatever the size (a 3-symbol fix is not big)."""
    if not seen.uncarriable:
        return
    shown = "; ".join(seen.uncarriable[:4])
    more = f" and {len(seen.uncarriable) - 4} more" if len(seen.uncarriable) > 4 else ""
    raise Refused(
        f"{len(seen.uncarriable)} change(s) no backport kind carries: {shown}{more}; "
        f"{Reason.SHAPE.next_step}",
        Reason.SHAPE,
    )


def check_budget(located: list[Located], budget: Budget = BUDGET) -> Figures:
    """The pull request's figures; ``Refused`` naming the figure over its limit
    (``over-budget``), or else a change no kind carries (``shape``)."""
    seen = figures(located)
    over = []
    if seen.symbols > budget.symbols:
        over.append(f"{seen.symbols} carried symbols (limit {budget.symbols})")
    if seen.files > budget.files:
        over.append(f"{seen.files} files (limit {budget.files})")
    if seen.lines > budget.lines:
        over.append(f"{seen.lines} changed lines in them (limit {budget.lines})")
    if over:
        raise Refused(
            f"over the size budget: {', '.join(over)}; the budget: {budget}; "
            f"{Reason.OVER_BUDGET.next_step}",
            Reason.OVER_BUDGET,
        )
    _refuse_shapes(seen)  # within the size budget: a change no kind carries is named as such
    return seen
