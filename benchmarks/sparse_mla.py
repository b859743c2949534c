"""SparseMLA at the GLM-5.3-Flash DSA shape: the backport against the kernel alone,
upstream's own way of calling it, and megatron's dense fallback.

Shape: 16 heads (one TP rank), q/k width 512 (NoPE), top-k 2051 (2048 + 3), bf16, int32
top-k indices (what megatron's TileLang indexer returns), each slot a uniformly random
key; batch 1 at 4k..64k tokens and batch 2 x 16k. Variants, all through megatron-core
0.19.2's TileLang ``SparseMLA``:

- ``backport``: the installed #7617 ``fused_sparse_mla_absorbed`` (the vendored function
  with this project's local changes, as ``apply()`` installs it) on the caller's
  ``[s, b, h, 512]`` / ``[s, b, 1, 512]`` / ``[b, s, 2051]`` tensors.
- ``backport_upstream_only``: the same, installed with ``apply(upstream_only=True)``: the
  vendored function alone.
- ``upstream_pr``: a hand-written adapter built exactly as #7617 builds its call:
  ``F.pad`` to 576 channels, ``permute(1, 0, 2, 3).contiguous()``, ``.to(torch.int32)``
  and ``F.pad(value=-1)`` of the indices, the output sliced and permuted back.
- ``kernel``: ``SparseMLA.apply`` on inputs already in the kernel's layout, padded to 576
  channels and 2112 slots: the limit for any adapter (it neither pads nor permutes).
- ``dense``: megatron's ``_unfused_absorbed_dsa_fn``, the path taken without the fix,
  until it runs out of memory.

Times are GPU time: medians of CUDA-event timings after warm-up, variants interleaved rep
by rep, each rep after an L2 flush and a GPU sleep that hides the host's launch latency.
Peak memory is ``max_memory_allocated`` minus what was allocated before the call (the
caller's own tensors). A compile check counts the TileLang kernels compiled by calls at
batch 2, 3 and 4 after a first call at batch 1. Results are rewritten to ``--json`` after
every section, with the commit and the sha256 of the measured sources.

    python benchmarks/sparse_mla.py --json benchmarks/results/sparse_mla.json \\
        --plot benchmarks/results/sparse_mla.png --md benchmarks/results/sparse_mla.md
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
HEADS, WIDTH, KERNEL_WIDTH, V = 16, 512, 576, 512
TOPK, KERNEL_TOPK = 2051, 2112
BACKPORT_ID = "megatron-lm-7617"
# Where the tensors live: "cuda" for measurements; "cpu" runs the same code path with a
# stand-in kernel (the CPU test's), timed by the wall clock, with no memory figures.
DEVICE = "cuda"
SCALE = 0.0625  # the GPU tests' scale: one compiled kernel set
GIB = 2**30
CONFIGS = [(1, 4096), (1, 8192), (1, 16384), (1, 32768), (1, 65536), (2, 16384)]
TARGET_CONFIGS = [(1, 32768), (2, 16384)]
# The sources whose code is what is measured: their sha256 goes into the JSON.
MEASURED_SOURCES = [
    "vendor/megatron_lm_7617/tilelang_dsa.py",
    "backports/megatron/local_changes/_sparse_mla_adapter.py",
    "backports/megatron/local_changes/_sparse_mla_triton.py",
    "benchmarks/sparse_mla.py",
]


def log(*args: Any) -> None:
    print(*args, flush=True)


# -- environment ---------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    cuda = DEVICE == "cuda"
    props = torch.cuda.get_device_properties(0) if cuda else None
    env = {
        "gpu": props.name if props else DEVICE,
        "gpu_memory_gib": round(props.total_memory / GIB, 1) if props else None,
        "sms": props.multi_processor_count if props else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tilelang": version("tilelang"),
        "triton": version("triton"),
        "megatron_core": version("megatron-core"),
        "python": platform.python_version(),
    }
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout.strip()
    except OSError:
        env["driver"] = None
    # The GPU host gets a copy of the tree whose own git (if any) is not this checkout's
    # history: a commit the caller names wins, and sources_sha256 below shows whether the
    # measured files are that commit's.
    env["commit"] = os.environ.get("BENCHMARK_COMMIT") or _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    env["commit_dirty"] = None if status is None else bool(status)
    env["sources_sha256"] = {
        name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest() for name in MEASURED_SOURCES
    }
    return env


def _git(*args: str) -> str | None:
    """git's answer in this checkout, or None where there is no git or no repository."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# -- timing --------------------------------------------------------------------------------


class Timer:
    def __init__(self) -> None:
        self.cuda = DEVICE == "cuda"
        self.flush = torch.empty(256 * 2**20 if self.cuda else 0, dtype=torch.int8, device=DEVICE)
        self.pending: list[tuple[list[float], torch.cuda.Event, torch.cuda.Event]] = []

    def time(self, fn: Callable[[], Any], into: list[float], sleep_cycles: int) -> None:
        if not self.cuda:  # the wall clock: CPU work is synchronous
            started = time.perf_counter()
            fn()
            into.append((time.perf_counter() - started) * 1e3)
            return
        self.flush.zero_()  # evict L2: every variant starts cold
        torch.cuda._sleep(sleep_cycles)  # the host queues fn's launches meanwhile
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        self.pending.append((into, start, end))

    def collect(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        for into, start, end in self.pending:
            into.append(start.elapsed_time(end))
        self.pending.clear()


def summary(times: list[float]) -> dict[str, Any]:
    qs = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "q1_ms": qs[0],
        "q3_ms": qs[2],
        "n": len(times),
    }


def peak_bytes(fn: Callable[[], Any]) -> int | None:
    if DEVICE != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return peak


def free() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# -- variants ------------------------------------------------------------------------------


class Inputs:
    """The caller's tensors and the kernel-layout copies (the kernel-alone variant's)."""

    def __init__(self, b: int, s: int, seed: int = 0) -> None:
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        self.b, self.s = b, s
        self.q = torch.randn(s, b, HEADS, WIDTH, generator=gen, device=DEVICE).bfloat16()
        self.k = torch.randn(s, b, 1, WIDTH, generator=gen, device=DEVICE).bfloat16()
        self.idx = torch.randint(
            0, s, (b, s, TOPK), generator=gen, device=DEVICE, dtype=torch.int32
        )
        self.grad = torch.randn(s, b, HEADS, V, generator=gen, device=DEVICE).bfloat16()
        self.q.requires_grad_(True)
        self.k.requires_grad_(True)
        self.qp = F.pad(self.q.detach(), (0, 64)).permute(1, 0, 2, 3).contiguous()
        self.kp = F.pad(self.k.detach(), (0, 64)).permute(1, 0, 2, 3).contiguous()
        self.ip = F.pad(self.idx, (0, -TOPK % 64), value=-1).unsqueeze(2).contiguous()
        self.grad_p = self.grad.permute(1, 0, 2, 3).contiguous()
        self.qp.requires_grad_(True)
        self.kp.requires_grad_(True)

    def zero_grads(self) -> None:
        for t in (self.q, self.k, self.qp, self.kp):
            t.grad = None

    def caller_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.k, self.idx))


def upstream_pr(sparse_mla: Any, query: Any, key: Any, topk_indices: Any) -> Any:
    """#7617's call of the kernel, written out: pad, permute, contiguous, int32, pad -1."""
    heads = query.size(2)
    query = F.pad(query, (0, KERNEL_WIDTH - query.size(-1)))
    key = F.pad(key, (0, KERNEL_WIDTH - key.size(-1)))
    q = query.permute(1, 0, 2, 3).contiguous()
    kv = key.permute(1, 0, 2, 3).contiguous()
    indices = topk_indices.unsqueeze(2).to(torch.int32)
    indices = F.pad(indices, (0, -indices.size(-1) % 64), value=-1).contiguous()
    out, _ = sparse_mla.apply(q, kv, indices, SCALE)
    return out[:, :, :heads].permute(1, 0, 2, 3).contiguous()


def make_variants(x: Inputs, tilelang_dsa: Any, installed: dict[str, Any]) -> dict[str, Any]:
    sparse_mla = tilelang_dsa.SparseMLA

    def backport(fn: Callable[..., Any]) -> Callable[[], Any]:
        def run() -> Any:
            return fn(x.q, x.k, x.idx, SCALE, V)

        return run

    def kernel() -> Any:
        return sparse_mla.apply(x.qp, x.kp, x.ip, SCALE)[0]

    variants: dict[str, tuple[Callable[[], Any], torch.Tensor]] = {
        name: (backport(fn), x.grad) for name, fn in installed.items()
    }
    variants["upstream_pr"] = (lambda: upstream_pr(sparse_mla, x.q, x.k, x.idx), x.grad)
    variants["kernel"] = (kernel, x.grad_p)
    return variants


def fwd_bwd(fn: Callable[[], Any], grad: torch.Tensor) -> Callable[[], Any]:
    def run() -> Any:
        out = fn()
        out.backward(grad)
        return out

    return run


def bench_fused(
    x: Inputs, variants: dict[str, Any], reps: int, bwd_reps: int, warmup: int
) -> dict[str, Any]:
    timer = Timer()
    names = list(variants)
    results: dict[str, Any] = {n: {} for n in names}
    sleep = int(4e6)  # ~2 ms of GPU sleep: longer than the host's launch work

    for mode in ("fwd", "fwd_bwd"):
        fns = {n: (variants[n][0] if mode == "fwd" else fwd_bwd(*variants[n])) for n in names}
        for n in names:
            for _ in range(warmup):
                fns[n]()
                x.zero_grads()
        times: dict[str, list[float]] = {n: [] for n in names}
        count = reps if mode == "fwd" else bwd_reps
        for rep in range(count):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for n in order:
                timer.time(fns[n], times[n], sleep)
                if mode == "fwd_bwd":
                    timer.collect()
                    x.zero_grads()
            timer.collect()
        for n in names:
            results[n][mode] = summary(times[n])
            x.zero_grads()
            results[n][f"{mode}_peak_bytes"] = peak_bytes(fns[n])
            x.zero_grads()
        free()

    # The backport must hand the kernel exactly what the kernel-alone variant gets.
    with torch.no_grad():
        ref = variants["kernel"][0]().permute(1, 0, 2, 3)
        for n in names:
            if n != "kernel":
                results[n]["bit_exact_vs_kernel"] = bool(torch.equal(variants[n][0](), ref))
    free()
    return results


def bench_dense(x: Inputs, dsa: Any, reps: int, skip: set[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def fwd() -> Any:
        return dsa._unfused_absorbed_dsa_fn(x.q, x.k, x.idx, SCALE, V)

    for mode, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd(fwd, x.grad))):
        if mode in skip:
            result[mode] = {"status": "skipped: out of memory at a smaller size"}
            continue
        try:
            fn()
            x.zero_grads()
            times: list[float] = []
            timer = Timer()
            for _ in range(reps):
                timer.time(fn, times, int(2e6))
                timer.collect()
                x.zero_grads()
            result[mode] = summary(times)
            result[f"{mode}_peak_bytes"] = peak_bytes(fn)
        except torch.cuda.OutOfMemoryError as exc:
            result[mode] = {"status": "out of memory", "error": str(exc).splitlines()[0]}
            skip.add(mode)
        finally:
            x.zero_grads()
            free()
    return result


# -- adapter pieces, timed alone -----------------------------------------------------------


def bench_pieces(x: Inputs, reps: int) -> dict[str, Any]:
    """Each step an adapter adds, alone: what the fused-call ratios are made of."""
    from backports.megatron.local_changes import _sparse_mla_adapter as adapter
    from backports.megatron.local_changes import _sparse_mla_triton as fused

    timer = Timer()
    q = x.q.detach()
    out_bshv = torch.empty(x.b, x.s, HEADS, V, device="cuda", dtype=torch.bfloat16).normal_()
    q_bytes = (q.numel() + x.qp.numel()) * 2
    idx_bytes = x.idx.numel() * 4 + x.ip.numel() * 4

    def tensor_ops(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:  # the local change's step with its fused Triton passes off
            saved, fused._kernels = fused._kernels, False
            try:
                return fn()
            finally:
                fused._kernels = saved

        return run

    pieces: dict[str, tuple[Callable[[], Any], int]] = {
        "copy_q_padded(reference)": (lambda: x.qp.detach().clone(), 2 * x.qp.numel() * 2),
        "q_layout/lean_copies": (lambda: adapter.to_kernel_layout(q), q_bytes),
        "q_layout/lean_copies_tensor_ops": (
            tensor_ops(lambda: adapter.to_kernel_layout(q)),
            q_bytes,
        ),
        "q_layout/upstream": (
            lambda: F.pad(q, (0, 64)).permute(1, 0, 2, 3).contiguous(),
            q_bytes,
        ),
        "indices/index_hygiene": (lambda: adapter.kernel_indices(x.idx, x.s), idx_bytes),
        "indices/index_hygiene_tensor_ops": (
            tensor_ops(lambda: adapter.kernel_indices(x.idx, x.s)),
            idx_bytes,
        ),
        "indices/lean_copies": (lambda: adapter.kernel_indices(x.idx, None), idx_bytes),
        "indices/upstream": (
            lambda: F.pad(x.idx.unsqueeze(2).to(torch.int32), (0, -TOPK % 64), value=-1),
            idx_bytes,
        ),
        "output_layout/upstream": (  # the kernel alone leaves the output in [b, s] order
            lambda: out_bshv.permute(1, 0, 2, 3).contiguous(),
            2 * out_bshv.numel() * 2,
        ),
        "output_layout/lean_copies": (
            lambda: adapter._ToCallerLayout.apply(out_bshv).permute(1, 0, 2, 3).contiguous(),
            2 * out_bshv.numel() * 2,
        ),
    }
    results: dict[str, Any] = {}
    with torch.no_grad():
        for name, (fn, nbytes) in pieces.items():
            times: list[float] = []
            for _ in range(3):
                fn()
            for _ in range(reps):
                timer.time(fn, times, int(1e6))
            timer.collect()
            s = summary(times)
            s["bytes"] = nbytes
            s["tb_per_s"] = nbytes / (s["median_ms"] * 1e-3) / 1e12
            results[name] = s
    free()
    return results


# -- compiles per batch size ---------------------------------------------------------------


def compile_check(function: Callable[..., Any], seq: int = 512) -> dict[str, Any]:
    """TileLang kernels compiled by the first forward+backward at batch 1, then 2, 3, 4."""
    from backports.megatron.testing.prewarm import CompileCounter

    counter = CompileCounter().attach()
    result: dict[str, Any] = {"seq": seq, "batches": {}}
    for b in (1, 2, 3, 4):
        x = Inputs(b, seq, seed=b)
        before = counter.count
        started = time.perf_counter()
        function(x.q, x.k, x.idx, SCALE, V).backward(x.grad)
        torch.cuda.synchronize()
        result["batches"][str(b)] = {
            "compiled": counter.count - before,
            "first_call_s": round(time.perf_counter() - started, 3),
        }
        del x
    result["compiled_after_batch_1"] = sum(
        v["compiled"] for k, v in result["batches"].items() if k != "1"
    )
    return result


# -- reporting -----------------------------------------------------------------------------


def label(b: int, s: int) -> str:
    size = f"{s // 1024}k" if s % 1024 == 0 else str(s)
    return size if b == 1 else f"{b}x{size}"


def fmt_ms(entry: dict[str, Any], mode: str) -> str:
    value = entry.get(mode, {})
    if "median_ms" in value:
        return f"{value['median_ms']:.2f}"
    return "OOM" if "out of memory" in value.get("status", "") else "-"


def fmt_gib(entry: dict[str, Any], mode: str) -> str:
    value = entry.get(f"{mode}_peak_bytes")
    return f"{value / GIB:.2f}" if value is not None else "-"


def ratio(rows: dict[str, Any], a: str, b: str, mode: str) -> float | None:
    try:
        return rows[a][mode]["median_ms"] / rows[b][mode]["median_ms"]
    except KeyError:
        return None


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for section in report["sections"]:
        rows = section["variants"]
        if (section["batch"], section["seq"]) not in TARGET_CONFIGS or "backport" not in rows:
            continue
        bound = rows["kernel"]["fwd_bwd_peak_bytes"] + section["padded_copy_bytes"]
        bound += section["index_copy_bytes"]
        out.append(
            {
                "config": label(section["batch"], section["seq"]),
                "fwd_backport_over_kernel": ratio(rows, "backport", "kernel", "fwd"),
                "fwd_bwd_backport_over_kernel": ratio(rows, "backport", "kernel", "fwd_bwd"),
                "fwd_backport_over_upstream_pr": ratio(rows, "backport", "upstream_pr", "fwd"),
                "fwd_bwd_backport_over_upstream_pr": ratio(
                    rows, "backport", "upstream_pr", "fwd_bwd"
                ),
                "fwd_upstream_only_over_kernel": ratio(
                    rows, "backport_upstream_only", "kernel", "fwd"
                ),
                "fwd_bwd_upstream_only_over_kernel": ratio(
                    rows, "backport_upstream_only", "kernel", "fwd_bwd"
                ),
                "fwd_bwd_peak_backport_bytes": rows["backport"]["fwd_bwd_peak_bytes"],
                # kernel alone + one padded copy of q and k + the int32 index copy
                "fwd_bwd_peak_bound_bytes": bound,
            }
        )
    return out


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"SparseMLA, 16 heads, width 512, top-k 2051, bf16, int32 indices; "
        f"{env['gpu']}, torch {env['torch']} (CUDA {env['cuda']}), TileLang {env['tilelang']}, "
        f"megatron-core {env['megatron_core']}. Median ms of "
        f"{'CUDA-event' if env['sms'] is not None else 'wall-clock'} timings "
        f"(fwd n={report['args']['reps']}, fwd+bwd n={report['args']['bwd_reps']}); "
        "peak GiB above the caller's tensors.",
        "",
        "| tokens | variant | fwd ms | fwd+bwd ms | fwd peak GiB | fwd+bwd peak GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for section in report["sections"]:
        name = label(section["batch"], section["seq"])
        for variant, entry in section["variants"].items():
            lines.append(
                f"| {name} | {variant} | {fmt_ms(entry, 'fwd')} | "
                f"{fmt_ms(entry, 'fwd_bwd')} | {fmt_gib(entry, 'fwd')} | "
                f"{fmt_gib(entry, 'fwd_bwd')} |"
            )
    rows = targets(report)
    if rows:
        lines += [
            "",
            "| tokens | backport / kernel fwd | backport / kernel fwd+bwd | "
            "backport / upstream_pr fwd | backport / upstream_pr fwd+bwd | "
            "fwd+bwd peak GiB (bound: kernel + padded q, k + int32 indices) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in rows:

            def f(v: float | None) -> str:
                return "-" if v is None else f"{v:.3f}"

            lines.append(
                f"| {r['config']} | {f(r['fwd_backport_over_kernel'])} | "
                f"{f(r['fwd_bwd_backport_over_kernel'])} | "
                f"{f(r['fwd_backport_over_upstream_pr'])} | "
                f"{f(r['fwd_bwd_backport_over_upstream_pr'])} | "
                f"{r['fwd_bwd_peak_backport_bytes'] / GIB:.2f} "
                f"({r['fwd_bwd_peak_bound_bytes'] / GIB:.2f}) |"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, all_axes = plt.subplots(1, 4, figsize=(21, 4.8))
    axes = all_axes[:3]
    panels = [
        ("fwd", "forward (ms)"),
        ("fwd_bwd", "forward + backward (ms)"),
        ("fwd_bwd_peak_bytes", "fwd+bwd peak memory (GiB)"),
    ]
    styles = {
        "backport": "o-",
        "backport_upstream_only": "v-",
        "kernel": "s--",
        "upstream_pr": "^-",
        "dense": "x-",
    }
    names = list(dict.fromkeys(n for sec in report["sections"] for n in sec["variants"]))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for variant in names:
            style = styles.get(variant, "d:")
            xs, ys, xb, yb = [], [], [], []
            for section in report["sections"]:
                entry = section["variants"].get(variant)
                if entry is None:
                    continue
                value = entry.get(key)
                if isinstance(value, dict):
                    value = value.get("median_ms")
                elif value is not None:
                    value = value / GIB
                if value is None:
                    continue
                tokens = section["batch"] * section["seq"]
                (xs if section["batch"] == 1 else xb).append(tokens)
                (ys if section["batch"] == 1 else yb).append(value)
            if xs:
                (line,) = ax.plot(xs, ys, style, label=variant)
                if xb:
                    ax.plot(
                        xb,
                        yb,
                        style[0],
                        mfc="none",
                        ms=11,
                        color=line.get_color(),
                        label=f"{variant}, batch 2",
                    )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens (batch x sequence)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)

    ratio_ax = all_axes[3]  # time over the kernel alone: the adapter's own cost
    for variant in names:
        if variant in ("kernel", "dense"):
            continue
        color = None  # one color per variant: fwd solid, fwd+bwd dotted
        for mode, style in (("fwd", "o-"), ("fwd_bwd", "s:")):
            ones, twos = [], []
            for section in report["sections"]:
                r = ratio(section["variants"], variant, "kernel", mode)
                if r is not None:
                    tokens = section["batch"] * section["seq"]
                    (ones if section["batch"] == 1 else twos).append((tokens, r))
            if ones:
                (line,) = ratio_ax.plot(
                    *zip(*ones, strict=True), style, color=color, label=f"{variant} {mode}"
                )
                color = line.get_color()
                for tokens, r in twos:  # batch 2: hollow, just right of its token count
                    ratio_ax.plot(
                        [tokens * 1.1], [r], style[0], mfc="none", ms=10, color=line.get_color()
                    )
    ratio_ax.axhline(1.02, color="red", lw=0.8, ls="--", label="target 1.02")
    ratio_ax.set_xscale("log", base=2)
    ratio_ax.set_xlabel("tokens (hollow: batch 2 x 16k)")
    ratio_ax.set_title("time / kernel alone")
    ratio_ax.grid(True, which="both", alpha=0.3)
    ratio_ax.legend(fontsize=7)
    env = report["environment"]
    fig.suptitle(
        f"SparseMLA h=16 d=512 top-k=2051 | {env['gpu']} | torch {env['torch']} | "
        f"TileLang {env['tilelang']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# -- main ----------------------------------------------------------------------------------


def installed_variants(tilelang_dsa: Any) -> dict[str, Any]:
    """The backport as apply() installs it in each mode (apply swaps the mode in place)."""
    from backports.megatron import apply

    found = {}
    for name, upstream_only in (("backport_upstream_only", True), ("backport", False)):
        # apply() reports on every catalog entry it was asked about: take #7617's by id.
        reports = apply(BACKPORT_ID, upstream_only=upstream_only)
        report = next(r for r in reports if r.id == BACKPORT_ID)
        log(f"apply(upstream_only={upstream_only}): {report.action} {report.verdict}")
        found[name] = tilelang_dsa.fused_sparse_mla_absorbed
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    global DEVICE, TOPK, KERNEL_TOPK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--plot")
    parser.add_argument("--md")
    parser.add_argument(
        "--configs",
        default=",".join(f"{b}x{s}" for b, s in CONFIGS),
        help="comma-separated BATCHxSEQ",
    )
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--bwd-reps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dense-reps", type=int, default=10)
    parser.add_argument("--no-dense", action="store_true")
    parser.add_argument("--no-compile-check", action="store_true")
    parser.add_argument(
        "--pieces",
        default="1x32768,2x16384",
        help="configs at which to time each adapter step alone",
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--topk", type=int, default=TOPK, help="top-k slots (2051: GLM-5.3-Flash)")
    args = parser.parse_args(argv)
    DEVICE, TOPK = args.device, args.topk
    KERNEL_TOPK = -(-TOPK // 64) * 64
    if DEVICE != "cuda":  # no TileLang compiles to count and no Triton passes to time
        args.no_compile_check, args.pieces = True, ""

    from megatron.core.transformer.experimental_attention_variant import dsa

    tilelang_dsa = importlib.import_module(TILELANG_DSA)
    installed = installed_variants(tilelang_dsa)
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",") if c]

    report: dict[str, Any] = {
        "environment": environment(),
        "args": vars(args),
        "sections": [],
        "pieces": {},
        "shape": {
            "heads": HEADS,
            "width": WIDTH,
            "topk": TOPK,
            "kernel_width": KERNEL_WIDTH,
            "kernel_topk": KERNEL_TOPK,
            "softmax_scale": SCALE,
            "index_dtype": "int32",
            "index_pattern": "uniform random keys, no -1",
        },
    }

    def save() -> None:
        report["targets"] = targets(report)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))

    if not args.no_compile_check:
        # Before the prewarm: batch 1 compiles the kernel set itself, then batches 2-4 must
        # find it (the key-group layout compiled a new set per batch size).
        report["compile_check"] = compile_check(installed["backport"])
        log("compile check:", report["compile_check"])
        save()
    if DEVICE == "cuda":
        from backports.megatron.testing.prewarm import prewarm

        log("prewarm:", prewarm([HEADS], [TOPK], SCALE))

    from backports.megatron.local_changes import _sparse_mla_triton as fused

    pieces_at = {tuple(int(v) for v in c.split("x")) for c in args.pieces.split(",") if c}
    dense_skip: set[str] = set()
    for b, s in configs:
        started = time.perf_counter()
        x = Inputs(b, s)
        variants = make_variants(x, tilelang_dsa, installed)
        section: dict[str, Any] = {
            "batch": b,
            "seq": s,
            "caller_bytes": x.caller_bytes(),
            "padded_copy_bytes": (x.qp.numel() + x.kp.numel()) * 2,
            "index_copy_bytes": x.ip.numel() * 4,
            "variants": bench_fused(x, variants, args.reps, args.bwd_reps, args.warmup),
        }
        section["fused_passes"] = (
            "on" if fused.disabled_because is None else f"off ({fused.disabled_because!r})"
        )
        if not args.no_dense:
            section["variants"]["dense"] = bench_dense(
                x, dsa, args.dense_reps, dense_skip if b == 1 else set()
            )
        if (b, s) in pieces_at:
            report["pieces"][label(b, s)] = bench_pieces(x, args.reps)
        section["seconds"] = round(time.perf_counter() - started, 1)
        report["sections"].append(section)
        save()
        rows = section["variants"]
        log(
            f"{label(b, s)}: "
            + "  ".join(
                f"{n} {fmt_ms(e, 'fwd')}/{fmt_ms(e, 'fwd_bwd')} ms" for n, e in rows.items()
            )
            + f"  [{section['seconds']} s, fused passes {section['fused_passes']}]"
        )
        del x, variants
        free()

    if args.md:
        Path(args.md).write_text(markdown(report))
    if args.plot:
        try:
            plot(report, args.plot)
        except Exception as exc:  # the numbers are saved already; say why there is no plot
            log(f"plot failed: {exc!r}")
    for name, pieces in report["pieces"].items():
        log(f"-- adapter steps alone at {name} (median ms, TB/s)")
        for piece, value in pieces.items():
            log(f"   {piece:40s} {value['median_ms']:8.3f} {value['tb_per_s']:6.2f}")
    for row in report["targets"]:
        log("target:", json.dumps(row))
    log(markdown(report))
    return report


if __name__ == "__main__":
    main()
