"""Stock megatron-core 0.19.2 against the backport, from two ``dsa_training.py`` runs.

Writes one JSON (per shape: tokens/s, peak memory, which attention ran, or out of memory;
and the loss / gradient-norm agreement at the shape both ran), a Markdown table and a
plot of tokens/s and peak memory. Nothing here measures; it reads what the runs wrote.

Agreement tolerance (bf16): the two runs differ only in the sparse attention's arithmetic
(the fused kernel accumulates P.V in FP32 from bf16 inputs; the dense fallback rounds its
FP32 softmax to bf16 before a bf16 P.V), a difference of the order of bf16's unit
roundoff (2^-8 = 0.4%) per layer, which 20 AdamW steps carry forward. Stated bounds: at
every step, |loss_stock - loss_backport| <= 1% of the stock loss, and the gradient norms
within 5% of each other.

    python benchmarks/dsa_training_report.py --backport B.json --stock S.json \\
        --json benchmarks/results/dsa_training.json --md ... --plot ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

GIB = 2**30
LOSS_RTOL = 1e-2
GRAD_NORM_RTOL = 5e-2


def label(b: int, s: int) -> str:
    size = f"{s // 1024}k" if s % 1024 == 0 else str(s)
    return size if b == 1 else f"{b}x{size}"


def by_shape(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {label(r["batch"], r["seq"]): r for r in run["shapes"]}


def attention_ran(shape: dict[str, Any]) -> str:
    calls = shape.get("calls", {})
    if calls.get("kernel") and not calls.get("dense"):
        return "fused kernel"
    if calls.get("dense") and not calls.get("kernel"):
        return "dense fallback"
    return "mixed" if calls.get("kernel") else "none"


def summary(shape: dict[str, Any] | None) -> dict[str, Any]:
    if shape is None:
        return {"status": "not run"}
    peak = shape.get("peak_bytes")
    return {
        "status": shape["status"],
        "error": shape.get("error"),
        "steps_done": len(shape["steps"]),
        "attention": attention_ran(shape),
        "calls": shape.get("calls"),
        "tokens_per_s": shape.get("tokens_per_s"),
        "median_step_s": shape.get("median_step_s"),
        "peak_gib": None if peak is None else peak / GIB,
    }


def agreement(stock: dict[str, Any], backport: dict[str, Any]) -> dict[str, Any]:
    """Step-by-step loss and gradient-norm differences, against the stated bounds."""
    pairs = list(zip(stock["steps"], backport["steps"], strict=False))
    loss_rel = [abs(s["loss"] - b["loss"]) / abs(s["loss"]) for s, b in pairs]
    grad_rel = [
        abs(s["grad_norm"] - b["grad_norm"]) / max(abs(s["grad_norm"]), 1e-12) for s, b in pairs
    ]
    both_ok = stock["status"] == backport["status"] == "ok"
    return {
        "steps": len(pairs),
        "loss_rtol": LOSS_RTOL,
        "grad_norm_rtol": GRAD_NORM_RTOL,
        "max_loss_rel_diff": max(loss_rel, default=None),
        "max_grad_norm_rel_diff": max(grad_rel, default=None),
        "within_tolerance": both_ok
        and len(pairs) >= 20
        and max(loss_rel) <= LOSS_RTOL
        and max(grad_rel) <= GRAD_NORM_RTOL,
        "stock": [(s["loss"], s["grad_norm"]) for s, _ in pairs],
        "backport": [(b["loss"], b["grad_norm"]) for _, b in pairs],
        "first_loss": [pairs[0][0]["loss"], pairs[0][1]["loss"]] if pairs else None,
        "last_loss": [pairs[-1][0]["loss"], pairs[-1][1]["loss"]] if pairs else None,
    }


def compare(backport: dict[str, Any], stock: dict[str, Any]) -> dict[str, Any]:
    b_shapes, s_shapes = by_shape(backport), by_shape(stock)
    names = list(dict.fromkeys([*b_shapes, *s_shapes]))
    rows = []
    for name in names:
        row = {
            "shape": name,
            "backport": summary(b_shapes.get(name)),
            "stock": summary(s_shapes.get(name)),
        }
        bt, st = row["backport"]["tokens_per_s"], row["stock"]["tokens_per_s"]
        row["speedup"] = bt / st if bt and st and row["stock"]["status"] == "ok" else None
        rows.append(row)
    agree = {
        name: agreement(s_shapes[name], b_shapes[name])
        for name in names
        if name in s_shapes
        and name in b_shapes
        and s_shapes[name]["status"] == b_shapes[name]["status"] == "ok"
    }
    return {
        "environment": {"backport": backport["environment"], "stock": stock["environment"]},
        "installed_backports": {
            "backport": backport["installed_backports"],
            "stock": stock["installed_backports"],
        },
        "model": backport["args"],
        "rows": rows,
        "agreement": agree,
    }


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]["backport"]
    args = report["model"]
    lines = [
        f"DSA training through megatron-core {env['megatron_core']} modules: "
        f"{args['layers']} layers, hidden {args['hidden']}, 16 heads, NoPE MLA width 512, "
        f"top-k {args['topk']}, {args['steps']} AdamW steps; {env['device']}, "
        f"torch {env['torch']}, TileLang {env['tilelang']}. tokens/s: median step after "
        f"{args['warmup']} warm-up steps; peak: max_memory_allocated over the run.",
        "",
        "| tokens | variant | attention ran | status | tokens/s | peak GiB | backport speed-up |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for row in report["rows"]:
        for variant in ("backport", "stock"):
            s = row[variant]
            status = s["status"] if s["status"] == "ok" else f"**{s['status']}**"
            lines.append(
                f"| {row['shape']} | {variant} | {s.get('attention', '-')} | {status} | "
                f"{num(s.get('tokens_per_s'), '.0f')} | {num(s.get('peak_gib'), '.1f')} | "
                f"{num(row['speedup'], '.2f') if variant == 'backport' else ''} |"
            )
    for name, a in report["agreement"].items():
        lines += [
            "",
            f"Agreement at {name} over {a['steps']} steps: max |loss diff| / loss "
            f"{num(a['max_loss_rel_diff'], '.2e')} (bound {a['loss_rtol']:.0e}), max grad-norm "
            f"relative diff {num(a['max_grad_norm_rel_diff'], '.2e')} (bound "
            f"{a['grad_norm_rtol']:.0e}): {'within' if a['within_tolerance'] else 'OUTSIDE'} "
            "tolerance.",
        ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = [r["shape"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    width = 0.38
    for k, (key, title, unit) in enumerate(
        (("tokens_per_s", "training throughput", "tokens/s"), ("peak_gib", "peak memory", "GiB"))
    ):
        ax = axes[k]
        for j, variant in enumerate(("stock", "backport")):
            xs = [i + (j - 0.5) * width for i in range(len(names))]
            vals = [r[variant].get(key) or 0.0 for r in rows]
            bars = ax.bar(xs, vals, width, label=variant, color=("#c44e52", "#4c72b0")[j])
            for bar, r in zip(bars, rows, strict=True):
                if r[variant]["status"] != "ok":
                    ax.text(bar.get_x() + width / 2, 0, "OOM", ha="center", va="bottom",
                            color="#c44e52", fontsize=9, fontweight="bold")  # fmt: skip
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.legend()
    ax = axes[2]
    for name, a in report["agreement"].items():
        steps = range(1, a["steps"] + 1)
        ax.plot(steps, [v[0] for v in a["stock"]], "o-", color="#c44e52", ms=3,
                label=f"stock {name}")  # fmt: skip
        ax.plot(steps, [v[0] for v in a["backport"]], "x--", color="#4c72b0", ms=4,
                label=f"backport {name}")  # fmt: skip
    ax.set_title("loss per step (same seeds)")
    ax.set_xlabel("step")
    ax.legend()
    env = report["environment"]["backport"]
    fig.suptitle(
        f"DSA training, megatron-core {env['megatron_core']} modules, stock vs backport | "
        f"{env['device']} | TileLang {env['tilelang']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backport", required=True)
    parser.add_argument("--stock", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--md")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    report = compare(
        json.loads(Path(args.backport).read_text()), json.loads(Path(args.stock).read_text())
    )
    Path(args.json).write_text(json.dumps(report, indent=1))
    text = markdown(report)
    if args.md:
        Path(args.md).write_text(text)
    if args.plot:
        try:
            plot(report, args.plot)
        except Exception as exc:  # the numbers are saved already; say why there is no plot
            print(f"plot failed: {exc!r}")
    print(text)
    return report


if __name__ == "__main__":
    main()
