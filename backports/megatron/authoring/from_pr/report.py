"""Step seven: what was derived, and what a person must still write, as lines of text (the
command prints them; the plugin's README keeps them)."""

from typing import Any

from .budget import BUDGET
from .derivation import Derivation
from .model import Commit
from .sniff import ROUTES

HUMAN_TODO = (
    "the symptom a user sees without the fix (SYMPTOM in entry.py, and the README)",
    "bug_since: the first release with the bug (the derivation only knows the installed one)",
    "the severity, and target_since (entry.py says 0: the probe decides from the target)",
)


def _commit(commit: Commit) -> str:
    state = "verified" if commit.verified else "NOT verified"
    return f"  {commit.role:<5} {commit.sha} {state}: {commit.how}"


def _located(d: Derivation) -> list[str]:
    lines = []
    routes = d.sniffed.results if d.sniffed else {}
    for loc in d.located:
        symbol = loc.symbol
        if symbol.kind in ("comment", "import", "inert"):
            continue
        where = {
            "identical": "identical to the pull request's base",
            "drifted": "drifted since the base: only this pull request's hunks merged in",
            "new": "new: carried along",
        }.get(loc.status, f"{loc.status}: {loc.how}")
        if loc.status == "new" and symbol.kind in ("new method", "new class attribute"):
            where = f"new: {loc.how}"
        if loc.how and loc.status in ("identical", "drifted") and loc.how != "same path":
            where += f" ({loc.how})"
        line = f"  {symbol.shown}  [{', '.join(symbol.tags)}]  {where}"
        result = routes.get(loc.qualname or "")
        if result is not None:
            line += f"; sniff: route {result['route']}" if result.get("route") else "; not sniffed"
        lines.append(line)
    return lines


def _inert(d: Derivation) -> list[str]:
    """The changes dropped as inert: listed, so a reader sees nothing was lost."""
    dropped = [loc.symbol for loc in d.located if loc.symbol.kind == "inert"]
    if not dropped:
        return []
    lines = [f"dropped as inert (nothing at run time), {len(dropped)}:"]
    return lines + [f"  {s.shown}  [{s.tags[0].removeprefix('inert: ')}]" for s in dropped]


def _sniff(d: Derivation) -> list[str]:
    if d.sniffed is None:
        return []
    lines = [f"sniff ({d.sniffed.seconds:.1f} s in a child interpreter):"]
    if d.focus:
        lines.append(f"  names the pull request's tests observe: {', '.join(d.focus)}")
    for target, result in d.sniffed.results.items():
        route = result.get("route")
        if route == "a":
            lines.append(f"  {target}: route a, {ROUTES['a']}: {result['test']['id']}")
        elif route:
            o = result["observation"]
            lines.append(
                f"  {target}: route {route}, {ROUTES[route]}: {len(o['fixed'])} fact(s) only "
                f"the fixed code shows, {len(o['needed'])} only the installed; {result['runs']} "
                f"runs, {result['attributes']} stand-in attributes discovered, "
                f"{result['seconds']:.1f} s"
            )
            for fact in [*o["fixed"][:2], *o["needed"][:1]]:
                lines.append(f"      {'fixed' if fact in o['fixed'] else 'installed'}: {fact}")
        else:
            lines.append(f"  {target}: no route tells the versions apart on CPU")
        lines += _soundness(result)
        lines += [f"      tried {why}" for why in result.get("tried", []) if not route]
    return lines


def _soundness(result: dict[str, Any]) -> list[str]:
    """How the target's rewrites judged its sniff (and the candidates before it)."""
    r = result.get("rewrites")
    if not r:
        return []
    shown = [f"installed: {', '.join(r['installed']) or 'none'}"]
    shown.append(f"fixed: {', '.join(r['fixed']) or 'none'}")
    passed = f"{r['passed']} passed" if result.get("route") else "none kept"
    lines = [
        f"      rewrites ({'; '.join(shown)}): {passed}, "
        f"{r['discarded']} candidate sniff(s) discarded"
    ]
    lines += [f"        discarded: {why}" for why in r.get("why", [])]
    return lines


def report_lines(d: Derivation) -> list[str]:
    lines: list[str] = []
    if d.pr is not None:
        lines.append(f"pull request #{d.pr.number}: {d.title}")
        lines += [_commit(c) for c in (d.pr.head, d.pr.merge, d.pr.base) if c is not None]
        if d.pr.merge is None:
            lines.append("  (open: not merged into main in this clone)")
        if d.pr.twins:
            twins = ", ".join(t[:12] for t in d.pr.twins)
            lines.append(f"  discarded (name #{d.pr.number} but are not on main): {twins}")
    if d.located:
        figures = f": {d.figures}" if d.figures else ""
        lines.append(f"symbols{figures} (budget: {BUDGET})")
        lines += _located(d)
        lines += _inert(d)
    if d.vendored is not None:
        for why in d.vendored.left_out:
            lines.append(f"  left out: {why}")
        carried = ", ".join(d.vendored.carried) or "nothing"
        lines.append(
            f"vendored: {d.vendored.file} ({d.vendored.origin}), "
            f"{len(d.vendored.targets)} target(s), carried along: {carried}"
        )
    if d.changes is not None and d.changes.other_files:
        others = ", ".join(d.changes.other_files[:6])
        more = (
            f" and {len(d.changes.other_files) - 6} more" if len(d.changes.other_files) > 6 else ""
        )
        lines.append(
            f"other files it changes, not carried (docs, configs, test helpers): {others}{more}"
        )
    if d.changes is not None:
        lines.append(f"upstream tests the pull request adds or changes: {len(d.changes.tests)}")
        lines += [f"  {t}" for t in d.changes.tests[:8]]
        if len(d.changes.tests) > 8:
            lines.append(f"  ... and {len(d.changes.tests) - 8} more (all in UPSTREAM.toml)")
    lines += _sniff(d)
    if d.proof:
        lines.append("proof:")
        lines += [f"  {line}" for line in d.proof]
    if d.upstream_tests:
        lines.append("backports upstream-tests:")
        lines += [f"  {line}" for line in d.upstream_tests]
    if d.seconds:
        steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in d.seconds.items())
        lines.append(f"time per step: {steps}")
    lines.append("a person must still write:")
    lines += [f"  - {todo}" for todo in HUMAN_TODO]
    return lines
