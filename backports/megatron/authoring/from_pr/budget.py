"""How big a fix a derived backport may carry, and the figures of one pull request.

A backport swaps functions and methods, with the helpers and constants they call. A fix
with many new pieces, state across files, or changes a swap cannot carry (a dataclass
field, a new method on a class, a Triton kernel object, a changed module statement) is
better waited for: its backport would be a fork. The budget is printed with the figures,
so a refusal says by how much.
"""

from dataclasses import dataclass

from .errors import Refused
from .model import Located

# Kinds that change nothing at run time, or that the vendored file repeats (imports).
IGNORED = frozenset({"comment", "import"})


@dataclass(frozen=True)
class Budget:
    symbols: int = 8  # targets, new helpers and new constants carried
    files: int = 3  # upstream files they come from
    lines: int = 300  # diff lines inside them

    def __str__(self) -> str:
        return (
            f"at most {self.symbols} symbols from {self.files} files, {self.lines} changed "
            "lines, and nothing a function swap cannot carry"
        )


BUDGET = Budget()


@dataclass(frozen=True)
class Figures:
    symbols: int
    files: int
    lines: int
    uncarriable: tuple[str, ...]  # "path::qualname (kind)"

    def __str__(self) -> str:
        text = f"{self.symbols} symbols from {self.files} files, {self.lines} changed lines"
        if self.uncarriable:
            text += f", {len(self.uncarriable)} a swap cannot carry"
        return text


def figures(located: list[Located]) -> Figures:
    carried = [loc for loc in located if loc.symbol.carriable and loc.symbol.kind not in IGNORED]
    other = [loc for loc in located if not loc.symbol.carriable and loc.symbol.kind not in IGNORED]
    return Figures(
        symbols=len(carried),
        files=len({loc.symbol.path for loc in carried}),
        lines=sum(loc.symbol.lines for loc in carried),
        uncarriable=tuple(f"{loc.symbol.shown} ({loc.symbol.kind})" for loc in other),
    )


def check_budget(located: list[Located], budget: Budget = BUDGET) -> Figures:
    """The pull request's figures; ``Refused`` with them when they exceed ``budget``."""
    seen = figures(located)
    over = []
    if seen.symbols > budget.symbols:
        over.append(f"{seen.symbols} symbols > {budget.symbols}")
    if seen.files > budget.files:
        over.append(f"{seen.files} files > {budget.files}")
    if seen.lines > budget.lines:
        over.append(f"{seen.lines} changed lines > {budget.lines}")
    if seen.uncarriable:
        shown = "; ".join(seen.uncarriable[:4])
        more = f" and {len(seen.uncarriable) - 4} more" if len(seen.uncarriable) > 4 else ""
        over.append(f"{len(seen.uncarriable)} changes a swap cannot carry: {shown}{more}")
    if over:
        raise Refused(f"too big to carry as a backport ({', '.join(over)}); the budget: {budget}")
    return seen
