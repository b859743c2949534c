#!/usr/bin/env python3
"""Write docs/performance.md from the benchmark JSON committed under benchmarks/results/.

Every figure on the page is read from a JSON file a benchmark script wrote, and so is where it
was measured (machine, date, commit, card): a field the script did not record reads "not
recorded", never a value typed here. After a benchmark writes new JSON, re-run this script;
``--check`` (run by tests/project/test_performance_doc.py) exits 1 while the page differs from what
this script would write, so a stale page cannot be committed unnoticed.

    python tools/performance_doc.py           # rewrite docs/performance.md
    python tools/performance_doc.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
PACKAGE = ROOT / "backports" / "megatron"
NOT_RECORDED = "not recorded"

Json = dict[str, Any]


def _get(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...``, or None where any level is missing (older JSON lacks fields)."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _text(value: Any) -> str:
    return NOT_RECORDED if value in (None, "") else str(value)


def _num(value: Any, digits: int = 2) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:,.{digits}f}"


def _rel(value: Any) -> str:
    """A relative difference, small or zero, in two significant digits."""
    return "-" if not isinstance(value, int | float) else f"{value:.2g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _where(machine: Any, date: Any, commit: Any, card: Any) -> str:
    """The one provenance line under each section heading."""
    return (
        f"Measured on: machine {_text(machine)}; date {_text(date)}; "
        f"commit {_text(commit)}; card {_text(card)}."
    )


# One renderer per results file: (file name, section title, what the script is, renderer).
# A renderer gets the parsed JSON and returns the section's lines after the heading.


def _cli_timing(after: Json) -> list[str]:
    before = _load("cli_timing_before.json") or {}
    machine = _get(after, "machine")
    lines = [
        _where(
            f"{_get(machine, 'cpus')} CPUs, Python {_get(machine, 'python')}" if machine else None,
            _get(after, "date"),
            _get(after, "git", "commit"),
            None,
        ),
        "",
        f"`benchmarks/cli_timing.py`, median of {_text(_get(after, 'runs_per_case'))} runs per "
        "case; cold = the verdict cache empty, warm = filled by the run before. The "
        f"`before` column: {_text(_get(before, 'note'))}.",
        "",
    ]
    rows = []
    for case in sorted(_get(after, "medians") or {}):
        now, was = _get(after, "medians", case), _get(before, "medians", case)
        rows.append(
            [
                f"`{case}`",
                _num(_get(now, "wall_s")),
                _num(_get(now, "user_s")),
                _num(_get(was, "wall_s")),
            ]
        )
    return lines + _table(["command", "wall s", "user CPU s", "wall s before"], rows)


def _startup(data: Json) -> list[str]:
    lines = [
        _where(
            f"{_text(_get(data, 'machine'))}, Python {_text(_get(data, 'python'))}",
            _get(data, "date"),
            _get(data, "commit"),
            None,
        ),
        "",
        f"`benchmarks/startup.py`: `python -c pass`, median of {_text(_get(data, 'runs'))} "
        "runs, in a venv as pip builds it with torch (`pip_built`) and in a bare venv holding "
        "only this package (`bare`).",
        "",
    ]
    rows = []
    for venv in ("pip_built", "bare"):
        medians = _get(data, "python_c_pass", venv, "median_ms") or {}
        ratios = _get(data, "python_c_pass", venv, "ratio_to_no_hook") or {}
        for case in medians:
            rows.append([venv, f"`{case}`", _num(medians[case]), _num(ratios.get(case), 3)])
    lines += _table(["venv", "case", "median ms", "x no hook"], rows)
    target = _get(data, "target_import_after_shared_modules_median_ms")
    if target:
        lines += [
            "",
            f"In a process that imports megatron (median of {_text(_get(target, 'runs'))}): the "
            f"hook adds {_num(_get(target, 'cpu', 'hook_adds'), 1)} ms of CPU at the target's "
            f"import ({_num(_get(target, 'cpu', 'hook_cache_off_adds'), 1)} ms with the verdict "
            f"cache off); megatron's own import takes {_num(_get(data, 'megatron_import_s'))} s.",
        ]
    return lines


def _gpu_environment(env: Any) -> tuple[Any, Any]:
    """(machine, card) from a GPU script's ``environment`` block."""
    card = _get(env, "gpu") or _get(env, "device")
    parts = [f"{k} {env[k]}" for k in ("torch", "tilelang", "megatron_core", "python") if k in env]
    return (", ".join(parts) or None) if isinstance(env, dict) else None, card


def _sparse_mla(data: Json) -> list[str]:
    env = _get(data, "environment") or {}
    machine, card = _gpu_environment(env)
    dirty = " (uncommitted changes)" if _get(env, "commit_dirty") else ""
    commit = _get(env, "commit")
    lines = [
        _where(machine, _get(env, "date"), f"{commit}{dirty}" if commit else None, card),
        "",
        "`benchmarks/sparse_mla.py`: #7617's fused sparse MLA, GPU time in ms (median of "
        "CUDA-event timings), forward / forward+backward. Full table and plot: "
        "[benchmarks/results/sparse_mla.md](../benchmarks/results/sparse_mla.md).",
        "",
    ]
    variants = ["backport", "backport_upstream_only", "upstream_pr", "kernel", "dense"]

    def cell(variant: Any) -> str:
        fwd, both = _get(variant, "fwd", "median_ms"), _get(variant, "fwd_bwd", "median_ms")
        if fwd is None:
            return _text(_get(variant, "fwd", "status"))
        return f"{_num(fwd)} / {_num(both)}"

    rows = []
    for section in _get(data, "sections") or []:
        shape = f"{section.get('batch')} x {section.get('seq')}"
        rows.append([shape] + [cell(_get(section, "variants", v)) for v in variants])
    lines += _table(["batch x tokens"] + [f"`{v}`" for v in variants], rows)
    compiled = _get(data, "compile_check")
    if compiled:
        lines += [
            "",
            f"Kernels compiled after batch 1: {_text(compiled.get('compiled_after_batch_1'))}.",
        ]
    return lines


def _dsa_training(data: Json) -> list[str]:
    env = _get(data, "environment", "backport") or {}
    machine, card = _gpu_environment(env)
    model = _get(data, "model") or {}
    lines = [
        _where(machine, _get(env, "date"), _get(env, "commit"), card),
        "",
        "`benchmarks/dsa_training.py` through megatron-core's own modules "
        f"({_text(model.get('layers'))} layers, hidden {_text(model.get('hidden'))}, top-k "
        f"{_text(model.get('topk'))}, {_text(model.get('steps'))} AdamW steps), with the "
        "backport and stock (`MEGATRON_BACKPORTS=0`). Report: "
        "[benchmarks/results/dsa_training.md](../benchmarks/results/dsa_training.md).",
        "",
    ]

    def cell(run: Any) -> str:
        if _get(run, "status") != "ok":
            return _text(_get(run, "status"))
        return (
            f"{_text(_get(run, 'attention'))}, {_num(_get(run, 'tokens_per_s'), 0)} tokens/s, "
            f"peak {_num(_get(run, 'peak_gib'), 1)} GiB"
        )

    rows = [
        [_text(r.get("shape")), cell(r.get("backport")), cell(r.get("stock"))]
        for r in _get(data, "rows") or []
    ]
    lines += _table(["tokens", "backport", "stock 0.19.2"], rows)
    for shape, agree in (_get(data, "agreement") or {}).items():
        lines += [
            "",
            f"At {shape} over {_text(agree.get('steps'))} steps: loss within "
            f"{_rel(agree.get('max_loss_rel_diff'))} relative (bound "
            f"{_text(agree.get('loss_rtol'))}), gradient norm within "
            f"{_rel(agree.get('max_grad_norm_rel_diff'))} (bound "
            f"{_text(agree.get('grad_norm_rtol'))}).",
        ]
    return lines


def _gpu_tolerances(data: Json) -> list[str]:
    worst = _get(data, "worst") or {}
    lines = [
        _where(None, _get(data, "date"), _get(data, "commit"), _get(data, "gpu")),
        "",
        f"`tests/gpu/`: the largest error seen per quantity over {len(_get(data, 'cases') or {})} "
        "cases (relative to an FP32 reference; `*_vs_upstream_only`: local changes against "
        f"upstream-only mode). Kernels compiled lazily: {_text(_get(data, 'lazy_compiles'))}.",
        "",
    ]
    rows = [[f"`{k}`", f"{v:.2e}" if isinstance(v, float) else str(v)] for k, v in worst.items()]
    return lines + _table(["quantity", "worst"], rows)


def _from_pr(data: Json) -> list[str]:
    machine = _get(data, "machine") or {}
    lines = [
        _where(
            ", ".join(f"{k} {v}" for k, v in machine.items()) or None,
            _get(data, "date"),
            _get(data, "commit"),
            None,
        ),
        "",
        f"{_text(_get(data, 'what'))}; the Megatron-LM mirror's main at "
        f"{_text(_get(data, 'mirror_main'))}.",
        "",
    ]
    rows = [
        [
            f"#{_text(r.get('pr'))}",
            _text(r.get("case")),
            _text(r.get("exit")),
            _num(r.get("wall_seconds"), 1),
            _text(_get(r, "independent_check", "check_exit")),
        ]
        for r in _get(data, "runs") or []
    ]
    return lines + _table(["PR", "outcome", "exit", "wall s", "`backports check` exit"], rows)


def _mutation(data: Json) -> list[str]:
    lines = [
        _where(
            f"Python {_get(data, 'python')}" if _get(data, "python") else None,
            _get(data, "date"),
            # the script records "<short sha> <subject>": the commit is the first word
            str(_get(data, "git_head") or "").split(" ")[0] or None,
            None,
        ),
        "",
        f"`{_text(_get(data, 'command')).strip()}`: each mutant is one small edit of the code; "
        f"killed = a test failed. {_num(_get(data, 'seconds'), 0)} s in all.",
        "",
    ]
    summary = _get(data, "summary") or {}
    rows = [
        [kind, _text(s.get("mutants")), _text(s.get("killed")), _text(s.get("survived"))]
        for kind, s in summary.items()
    ]
    lines += _table(["mutants", "count", "killed", "survived"], rows)
    survived = [m.get("id") for m in _get(data, "mutants") or [] if m.get("status") == "survived"]
    # A mutant is named by "<file under backports/megatron>:<line>:<col>:<edit>": one in a file
    # that has since moved is counted, not named (the page names no file that is gone).
    here = [m for m in survived if (PACKAGE / str(m).split(":")[0]).is_file()]
    if here:
        lines += ["", "Survived: " + ", ".join(f"`{m}`" for m in here) + "."]
    moved = len(survived) - len(here)
    if moved:
        lines += [
            "",
            f"{moved} more survived in modules that have since moved or been split (named in "
            "the JSON as they stood at that commit).",
        ]
    return lines


def _machine_line(data: Json) -> str:
    machine = _get(data, "machine") or {}
    shown = {k: machine.get(k) for k in ("cpu_count", "platform", "load_average_before")}
    text = ", ".join(f"{k} {v}" for k, v in shown.items() if v is not None) or None
    return _where(text, _get(data, "date"), _get(data, "git", "commit"), None)


def _status_entries(data: Json) -> list[str]:
    lines = [_machine_line(data), "", f"{_text(_get(data, 'what'))}.", ""]
    rows = [
        [case, _num(m.get("wall_s"), 2), _num(m.get("cpu_s"), 2)]
        for case, m in sorted((_get(data, "medians") or {}).items())
    ]
    goal = _get(data, "goal") or {}
    lines += _table(["case (median)", "wall s", "CPU s (user+sys)"], rows)
    lines += ["", "Goal: " + ", ".join(f"{k}: {v}" for k, v in goal.items()) + "."]
    return lines


def _status_cold_warm(data: Json) -> list[str]:
    """Issue 43's figures: what a user waits for, the proof store off and warm."""
    lines = [_machine_line(data), "", f"{_text(_get(data, 'what'))}.", ""]
    off = (
        "proof store off (`MEGATRON_BACKPORTS_CACHE=0`): every sniff runs, as on a fresh CI "
        "runner; sniff children forked from one zygote, which the command forks from itself "
        "(torch imported once for both)"
    )
    fresh = (
        "the same, each sniff child a fresh interpreter (`MEGATRON_BACKPORTS_ZYGOTE=0`: how "
        "every child started before)"
    )
    warm = "the proof store filled by an earlier run: no child starts"
    meaning = {
        **{f"{n} off": off for n in ("11", "all")},
        **{f"{n} off-fresh": fresh for n in ("11", "all")},
        **{f"{n} warm": warm for n in ("11", "all")},
    }
    rows = [
        [f"`{case}`", meaning.get(case, ""), _num(m.get("wall_s"), 2), _num(m.get("cpu_s"), 2)]
        for case, m in sorted((_get(data, "medians") or {}).items())
    ]
    runs = _get(data, "runs_per_case")
    lines += _table(["case", "what it is", "wall s", "CPU s (user+sys, children incl.)"], rows)
    loads = [
        run["load_average_before"][0]
        for timed in (_get(data, "runs") or {}).values()
        for run in timed
        if isinstance(run.get("load_average_before"), list)
    ]
    load = (
        f"from {min(loads):.2f} to {max(loads):.2f} (1-minute load average before each run)"
        if loads
        else NOT_RECORDED
    )
    lines += [
        "",
        f"Entries judged: {_entries(_get(data, 'entries'))}. Command: "
        f"`{_text(_get(data, 'command'))}`. Medians of {_text(runs)} runs per case, "
        "interleaved. CPU seconds count the command and every process it waited for: the "
        "figure that matters here. Wall seconds grow with the machine's load, and this "
        f"machine was shared with other work while it was measured: load {load}. The "
        "wall goals hold on an otherwise idle machine.",
        "",
        "Goal: " + ", ".join(f"{k}: {v}" for k, v in (_get(data, "goal") or {}).items()) + ".",
    ]
    return lines


def _entries(counts: Any) -> str:
    """How many entries each run judged (one number where every run judged as many)."""
    if isinstance(counts, list) and counts:
        return " / ".join(str(count) for count in counts)
    return _text(counts)


def _sniff_costs(data: Json) -> list[str]:
    lines = [_machine_line(data), "", f"{_text(_get(data, 'what'))}.", ""]
    rows = []
    for entry in _get(data, "entries") or []:
        installed = entry.get("installed") or {}
        vendored = entry.get("vendored_upstream_only") or {}
        wall = _get(installed, "median", "wall_s")
        child = _get(installed, "median", "children_cpu_s")
        rows.append(
            [
                f"`{_text(entry.get('id'))}`",
                "child" if entry.get("sniff_in_child") else "in process",
                _num(wall * 1000 if isinstance(wall, int | float) else None, 2),
                _num(child, 2),
                _text(installed.get("verdict")),
                _text(vendored.get("verdict")),
            ]
        )
    header = ["entry", "where", "installed: median ms", "children CPU s", "installed", "vendored"]
    return lines + _table(header, rows)


def _from_pr_vs_handwritten(data: Json) -> list[str]:
    lines = [_machine_line(data), "", f"{_text(_get(data, 'what'))}.", ""]
    rows = []
    for r in _get(data, "results") or []:
        sniffs = r.get("sniffs") or {}
        hand, derived = sniffs.get("handwritten") or {}, sniffs.get("derived") or {}
        rows.append(
            [
                f"#{_text(r.get('pr'))}",
                _text(r.get("exit")),
                _text(derived.get("route")),
                f"{_text(_get(hand, 'installed_0_19_2', 'verdict'))} / "
                f"{_text(_get(derived, 'installed_0_19_2', 'verdict'))}",
                f"{_text(_get(hand, 'own_merged_code', 'verdict'))} / "
                f"{_text(_get(derived, 'own_merged_code', 'verdict'))}",
            ]
        )
    header = ["PR", "derivation exit", "route", "0.19.2: hand / derived", "merged: hand / derived"]
    return lines + _table(header, rows)


SECTIONS: list[tuple[str, str, Callable[[Json], list[str]]]] = [
    (
        "status_cold_warm.json",
        "`backports status`, every entry: proof store off and warm (CPU)",
        _status_cold_warm,
    ),
    ("cli_timing_after.json", "`backports` commands (CPU)", _cli_timing),
    ("startup.json", "The start-up hook's cost (CPU)", _startup),
    ("sparse_mla.json", "#7617: fused sparse MLA (GPU)", _sparse_mla),
    ("dsa_training.json", "#7617: DSA training through megatron-core (GPU)", _dsa_training),
    ("gpu_tolerances.json", "GPU tests: numerical agreement", _gpu_tolerances),
    ("from_pr.json", "`backports new --from-pr` on real pull requests (CPU)", _from_pr),
    (
        "from_pr_vs_handwritten.json",
        "Derived sniffs against the handwritten ones (CPU)",
        _from_pr_vs_handwritten,
    ),
    (
        "status_entries_warm.json",
        "`backports status`, 11 entries against 7, warm (CPU)",
        _status_entries,
    ),
    (
        "status_entries.json",
        "`backports status`, 11 entries against 7, cold and warm (CPU)",
        _status_entries,
    ),
    ("sniff_costs.json", "Each sniff's cost on megatron-core 0.19.2 (CPU)", _sniff_costs),
    ("mutation.json", "Mutation testing: can the tests fail?", _mutation),
]


def _load(name: str) -> Json | None:
    path = RESULTS / name
    if not path.is_file():
        return None
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else None


def render() -> str:
    lines = [
        "# Performance",
        "",
        "<!-- Generated by tools/performance_doc.py from benchmarks/results/*.json: do not edit;",
        "     re-run the benchmark, then `python tools/performance_doc.py`. -->",
        "",
        "Every figure below is read from the JSON a benchmark script wrote into",
        "`benchmarks/results/`; so is where it was measured. A field the script did not record",
        f'reads "{NOT_RECORDED}". GPU figures come from `tools/gpu_run.sh` on a CUDA host.',
    ]
    for name, title, section in SECTIONS:
        lines += ["", f"## {title}", "", f"Source: `benchmarks/results/{name}`.", ""]
        data = _load(name)
        lines += section(data) if data is not None else ["No results committed yet."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run tools/performance_doc.py")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
