"""SparseMLA at the GLM-5.3-Flash DSA shape: the backport against the kernel alone, a naive
adapter and megatron's dense fallback.

Shape: 16 heads (one TP rank), q/k width 512 (NoPE), top-k 2051 (2048 + 3), bf16, int32
top-k indices (what megatron's TileLang indexer returns), each slot a uniformly random
key; batch 1 at 4k..64k tokens and batch 2 x 16k. Variants, all through megatron-core
0.19.2's TileLang ``SparseMLA``:

- ``backport``: the installed #7617 ``fused_sparse_mla_absorbed`` on the caller's
  ``[s, b, h, 512]`` / ``[s, b, 1, 512]`` / ``[b, s, 2051]`` tensors.
- ``kernel``: ``SparseMLA.apply`` on inputs already in the kernel's layout, padded to 576
  channels and 2112 slots: the limit for any adapter (it neither pads nor permutes).
- ``naive``: ``F.pad`` then ``permute().contiguous()`` for q and k, ``F.pad`` for the
  indices, ``permute().contiguous()`` for the output: a hand-written backport.
- ``dense``: megatron's ``_unfused_absorbed_dsa_fn``, the path taken without the fix,
  until it runs out of memory.
- ``NAME`` (with ``--extra-adapter NAME=FILE``): another adapter module (another version
  of the vendored file, or a proposal such as benchmarks/proposals/batch_folded_adapter.py).

Times are medians of CUDA-event timings after warm-up, variants interleaved rep by rep,
each rep after an L2 flush and a GPU sleep that hides the host's launch latency. Peak
memory is ``max_memory_allocated`` minus what was allocated before the call (the
caller's own tensors). Results are rewritten to ``--json`` after every section.

    python benchmarks/sparse_mla.py --json benchmarks/results/sparse_mla.json \\
        --plot benchmarks/results/sparse_mla.png --md benchmarks/results/sparse_mla.md
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
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
SCALE = 0.0625  # the GPU tests' scale: one compiled kernel set
GIB = 2**30
CONFIGS = [(1, 4096), (1, 8192), (1, 16384), (1, 32768), (1, 65536), (2, 16384)]
TARGET_CONFIGS = [(1, 32768), (2, 16384)]


def log(*args: Any) -> None:
    print(*args, flush=True)


# -- environment ---------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    props = torch.cuda.get_device_properties(0)
    env = {
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / GIB, 1),
        "sms": props.multi_processor_count,
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
    try:
        env["commit"] = (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout.strip()
            or None
        )
    except OSError:
        env["commit"] = None
    return env


# -- timing --------------------------------------------------------------------------------


class Timer:
    def __init__(self) -> None:
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
        self.pending: list[tuple[list[float], torch.cuda.Event, torch.cuda.Event]] = []

    def time(self, fn: Callable[[], Any], into: list[float], sleep_cycles: int) -> None:
        self.flush.zero_()  # evict L2: every variant starts cold
        torch.cuda._sleep(sleep_cycles)  # the host queues fn's launches meanwhile
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        self.pending.append((into, start, end))

    def collect(self) -> None:
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


def peak_bytes(fn: Callable[[], Any]) -> int:
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
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# -- variants ------------------------------------------------------------------------------


class Inputs:
    """The caller's tensors and the kernel-layout copies (the kernel-alone variant's)."""

    def __init__(self, b: int, s: int, seed: int = 0) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.b, self.s = b, s
        self.q = torch.randn(s, b, HEADS, WIDTH, generator=gen, device="cuda").bfloat16()
        self.k = torch.randn(s, b, 1, WIDTH, generator=gen, device="cuda").bfloat16()
        self.idx = torch.randint(
            0, s, (b, s, TOPK), generator=gen, device="cuda", dtype=torch.int32
        )
        self.grad = torch.randn(s, b, HEADS, V, generator=gen, device="cuda").bfloat16()
        self.q.requires_grad_(True)
        self.k.requires_grad_(True)
        self.qp = F.pad(self.q.detach(), (0, 64)).permute(1, 0, 2, 3).contiguous()
        self.kp = F.pad(self.k.detach(), (0, 64)).permute(1, 0, 2, 3).contiguous()
        self.ip = F.pad(self.idx, (0, KERNEL_TOPK - TOPK), value=-1).unsqueeze(2).contiguous()
        self.grad_p = self.grad.permute(1, 0, 2, 3).contiguous()
        self.qp.requires_grad_(True)
        self.kp.requires_grad_(True)
        # At batch > 1 the same inputs in two more layouts (at batch 1 all three are one, so
        # no second padded copy is made): the batch as the kernel's key groups
        # ([1, s, b * h, 576] and so on, the kernel call the backport makes), and the batch
        # folded into the sequence ([1, s * b, h, 576], key k of batch j at row k * b + j),
        # which shares the key-group copies' memory and runs a kv_group-1 kernel.
        self.qg, self.kg, self.ig = self.qp, self.kp, self.ip
        self.qs, self.ks, self.is_ = self.qp, self.kp, self.ip
        if b > 1:
            self.qg = F.pad(self.q.detach(), (0, 64)).view(1, s, b * HEADS, KERNEL_WIDTH)
            self.kg = F.pad(self.k.detach(), (0, 64)).view(1, s, b, KERNEL_WIDTH)
            self.ig = self.ip[:, :, 0].transpose(0, 1).contiguous().unsqueeze(0)
            self.qg.requires_grad_(True)
            self.kg.requires_grad_(True)
            self.qs = self.qg.detach().view(1, s * b, HEADS, KERNEL_WIDTH).requires_grad_(True)
            self.ks = self.kg.detach().view(1, s * b, 1, KERNEL_WIDTH).requires_grad_(True)
            batch_of_slot = torch.arange(b, device="cuda", dtype=torch.int32).view(1, 1, b, 1)
            folded = torch.where(self.ig >= 0, self.ig * b + batch_of_slot, -1)
            self.is_ = folded.view(1, s * b, 1, KERNEL_TOPK)

    def zero_grads(self) -> None:
        for t in (self.q, self.k, self.qp, self.kp, self.qg, self.kg, self.qs, self.ks):
            t.grad = None

    def caller_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.k, self.idx))


def make_variants(x: Inputs, tilelang_dsa: Any, extras: dict[str, Any]) -> dict[str, Any]:
    sparse_mla = tilelang_dsa.SparseMLA

    def backport(fn: Callable[..., Any]) -> Callable[[], Any]:
        def run() -> Any:
            return fn(x.q, x.k, x.idx, SCALE, V)

        return run

    def kernel() -> Any:
        return sparse_mla.apply(x.qp, x.kp, x.ip, SCALE)[0]

    def kernel_groups() -> Any:  # its output is the caller's [s, b, h, v] as it stands
        return sparse_mla.apply(x.qg, x.kg, x.ig, SCALE)[0].view(x.s, x.b, HEADS, V)

    def kernel_seqfold() -> Any:  # its output is the caller's [s, b, h, v] as it stands
        return sparse_mla.apply(x.qs, x.ks, x.is_, SCALE)[0].view(x.s, x.b, HEADS, V)

    def naive() -> Any:
        qp = F.pad(x.q, (0, 64)).permute(1, 0, 2, 3).contiguous()
        kp = F.pad(x.k, (0, 64)).permute(1, 0, 2, 3).contiguous()
        ip = F.pad(x.idx, (0, KERNEL_TOPK - TOPK), value=-1).unsqueeze(2)
        out, _ = sparse_mla.apply(qp, kp, ip.to(torch.int32).contiguous(), SCALE)
        return out.permute(1, 0, 2, 3).contiguous()

    variants: dict[str, tuple[Callable[[], Any], torch.Tensor]] = {
        "backport": (backport(tilelang_dsa.fused_sparse_mla_absorbed), x.grad),
        "kernel": (kernel, x.grad_p),
        "naive": (naive, x.grad),
    }
    if x.b > 1:
        variants["kernel_groups"] = (kernel_groups, x.grad)
        variants["kernel_seqfold"] = (kernel_seqfold, x.grad)
    for name, module in extras.items():
        variants[name] = (backport(module.fused_sparse_mla_absorbed), x.grad)
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


def bench_pieces(
    x: Inputs, vendored: Any, extra: tuple[str, Any] | None, reps: int
) -> dict[str, Any]:
    """Each step an adapter adds, alone: what the fused-call ratios are made of."""
    timer = Timer()
    q = x.q.detach()
    # What the kernel returns to the backport: [1, s, b * h, v] and [1, s, b * h, 576].
    out_k = torch.empty(1, x.s, x.b * HEADS, V, device="cuda", dtype=torch.bfloat16).normal_()
    dq_k = torch.empty(x.s, x.b, HEADS, KERNEL_WIDTH, device="cuda", dtype=torch.bfloat16)
    dq_k.normal_()
    out_bshv = out_k.view(x.b, x.s, HEADS, V)  # what a [b, s, ...] kernel call returns
    idx64 = x.idx.long()

    def tensor_ops(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:  # the vendored step with its fused Triton passes off
            saved, vendored._fused = vendored._fused, False
            try:
                return fn()
            finally:
                vendored._fused = saved

        return run

    def idx_tensor_ops(src: torch.Tensor) -> Callable[[], Any]:
        return tensor_ops(lambda: vendored._kernel_indices(src, x.s))

    def int64_words(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            saved, vendored._WORDS = vendored._WORDS, (torch.int64,)
            try:
                return fn()
            finally:
                vendored._WORDS = saved

        return run

    def dq_words() -> Any:
        g = torch.empty_like(q)
        vendored._copy(g, dq_k[:, :, :, :WIDTH])
        return g

    pieces: dict[str, tuple[Callable[[], Any], int]] = {
        "copy_q_padded(reference)": (lambda: x.qp.detach().clone(), 2 * x.qp.numel() * 2),
        "q_layout/backport": (
            lambda: vendored._to_kernel_layout(q, HEADS, KERNEL_WIDTH),
            (q.numel() + x.qp.numel()) * 2,
        ),
        "q_layout/backport_tensor_ops": (
            tensor_ops(lambda: vendored._to_kernel_layout(q, HEADS, KERNEL_WIDTH)),
            (q.numel() + x.qp.numel()) * 2,
        ),
        "q_layout/backport_tensor_ops_int64_words": (
            int64_words(tensor_ops(lambda: vendored._to_kernel_layout(q, HEADS, KERNEL_WIDTH))),
            (q.numel() + x.qp.numel()) * 2,
        ),
        "q_layout/naive": (
            lambda: F.pad(q, (0, 64)).permute(1, 0, 2, 3).contiguous(),
            (q.numel() + x.qp.numel()) * 2,
        ),
        "indices_int32/backport_fused": (
            lambda: vendored._kernel_indices(x.idx, x.s),
            x.idx.numel() * 4 + x.ip.numel() * 4,
        ),
        "indices_int32/backport_tensor_ops": (
            idx_tensor_ops(x.idx),
            x.idx.numel() * 4 + x.ip.numel() * 4,
        ),
        "indices_int64/backport_fused": (
            lambda: vendored._kernel_indices(idx64, x.s),
            x.idx.numel() * 8 + x.ip.numel() * 4,
        ),
        "indices_int64/backport_tensor_ops": (
            idx_tensor_ops(idx64),
            x.idx.numel() * 8 + x.ip.numel() * 4,
        ),
        "indices_int32/naive": (
            lambda: (
                F.pad(x.idx, (0, KERNEL_TOPK - TOPK), value=-1)
                .unsqueeze(2)
                .to(torch.int32)
                .contiguous()
            ),
            x.idx.numel() * 4 + x.ip.numel() * 4,
        ),
        "output_layout/backport": (  # a view at any batch: nothing moves
            lambda: vendored._from_kernel_layout(out_k, x.s, x.b, HEADS),
            2 * out_k.numel() * 2,
        ),
        "output_layout/naive": (
            lambda: out_bshv.permute(1, 0, 2, 3).contiguous(),
            2 * out_k.numel() * 2,
        ),
        "dq_to_caller/backport": (dq_words, 2 * q.numel() * 2),
        "dq_to_caller/bf16_clone": (
            lambda: dq_k[:, :, :, :WIDTH].contiguous(),
            2 * q.numel() * 2,
        ),
    }
    if extra is not None:  # an earlier adapter's steps, where it has them
        name, module = extra
        layout = getattr(module, "_ToKernelLayout", None)  # the [b, s, ...] adapter's
        q_layout = getattr(module, "_to_kernel_layout", None) if layout is None else layout.apply
        if q_layout is not None:
            pieces[f"q_layout/{name}"] = (
                lambda: q_layout(q, HEADS, KERNEL_WIDTH),
                (q.numel() + x.qp.numel()) * 2,
            )
        indices = getattr(module, "_kernel_indices", None)
        if indices is not None:
            pieces[f"indices_int32/{name}"] = (
                lambda: indices(x.idx, x.s),
                x.idx.numel() * 4 + x.ip.numel() * 4,
            )
        out_layout = getattr(module, "_from_kernel_layout", None)
        if out_layout is not None and layout is not None:  # the [b, s, ...] adapter's
            pieces[f"output_layout/{name}"] = (
                lambda: out_layout(out_bshv, HEADS),
                2 * out_k.numel() * 2,
            )
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


# -- reporting -----------------------------------------------------------------------------


def label(b: int, s: int) -> str:
    return f"{s // 1024}k" if b == 1 else f"{b}x{s // 1024}k"


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
        extra = section["padded_copy_bytes"]
        bound = rows["kernel"]["fwd_bwd_peak_bytes"] + extra
        out.append(
            {
                "config": label(section["batch"], section["seq"]),
                "fwd_backport_over_kernel": ratio(rows, "backport", "kernel", "fwd"),
                "fwd_bwd_backport_over_kernel": ratio(rows, "backport", "kernel", "fwd_bwd"),
                # batch > 1: against the very kernel call the backport makes (key groups)
                "fwd_backport_over_kernel_groups": ratio(rows, "backport", "kernel_groups", "fwd"),
                "fwd_bwd_backport_over_kernel_groups": ratio(
                    rows, "backport", "kernel_groups", "fwd_bwd"
                ),
                "fwd_backport_over_naive": ratio(rows, "backport", "naive", "fwd"),
                "fwd_bwd_backport_over_naive": ratio(rows, "backport", "naive", "fwd_bwd"),
                "fwd_bwd_peak_backport_bytes": rows["backport"]["fwd_bwd_peak_bytes"],
                "fwd_bwd_peak_bound_bytes": bound,
                "index_copy_bytes": section["index_copy_bytes"],
            }
        )
    return out


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"SparseMLA, 16 heads, width 512, top-k 2051, bf16, int32 indices; "
        f"{env['gpu']}, torch {env['torch']} (CUDA {env['cuda']}), TileLang {env['tilelang']}, "
        f"megatron-core {env['megatron_core']}. Median ms of CUDA-event timings "
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
            "backport / naive fwd | backport / naive fwd+bwd | "
            "fwd+bwd peak GiB (bound: kernel + padded q, k) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in rows:

            def f(v: float | None) -> str:
                return "-" if v is None else f"{v:.3f}"

            lines.append(
                f"| {r['config']} | {f(r['fwd_backport_over_kernel'])} | "
                f"{f(r['fwd_bwd_backport_over_kernel'])} | {f(r['fwd_backport_over_naive'])} | "
                f"{f(r['fwd_bwd_backport_over_naive'])} | "
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
    styles = {"backport": "o-", "kernel": "s--", "naive": "^-", "dense": "x-"}
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


def load_extra(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"sparse_mla_adapter_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.__target_module__ = TILELANG_DSA
    return module


def main() -> None:
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
    parser.add_argument(
        "--pieces",
        default="1x32768,2x16384",
        help="configs at which to time each adapter step alone",
    )
    parser.add_argument(
        "--extra-adapter",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="another adapter module to time as variant NAME (repeatable)",
    )
    args = parser.parse_args()

    from megatron.core.transformer.experimental_attention_variant import dsa

    from backports.megatron import apply

    tilelang_dsa = importlib.import_module(TILELANG_DSA)
    (report_apply,) = apply()
    log(f"apply: {report_apply.action} {report_apply.verdict}")
    vendored = sys.modules[tilelang_dsa.fused_sparse_mla_absorbed.__module__]
    extras = {
        name: load_extra(name, path)
        for name, path in (spec.split("=", 1) for spec in args.extra_adapter)
    }
    # The first extra adapter's steps are timed alone beside the vendored ones.
    extra = next(iter(extras.items()), None)
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",") if c]

    from tests.gpu.prewarm import prewarm

    log("prewarm:", prewarm([HEADS], [TOPK], SCALE, batches=sorted({b for b, _ in configs})))

    env = environment()
    # What was measured, whatever the checkout's HEAD says: the vendored file's hash.
    env["vendored_sha256"] = hashlib.sha256(Path(vendored.__file__).read_bytes()).hexdigest()
    report: dict[str, Any] = {
        "environment": env,
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

    pieces_at = {tuple(int(v) for v in c.split("x")) for c in args.pieces.split(",") if c}
    dense_skip: set[str] = set()
    for b, s in configs:
        started = time.perf_counter()
        x = Inputs(b, s)
        variants = make_variants(x, tilelang_dsa, extras)
        section: dict[str, Any] = {
            "batch": b,
            "seq": s,
            "caller_bytes": x.caller_bytes(),
            "padded_copy_bytes": (x.qp.numel() + x.kp.numel()) * 2,
            "index_copy_bytes": x.ip.numel() * 4,
            "variants": bench_fused(x, variants, args.reps, args.bwd_reps, args.warmup),
        }
        section["index_path"] = (
            "fused"
            if vendored._fused not in (None, False)
            else f"tensor ops ({vendored._fused_error!r})"
        )
        if not args.no_dense:
            section["variants"]["dense"] = bench_dense(
                x, dsa, args.dense_reps, dense_skip if b == 1 else set()
            )
        if (b, s) in pieces_at:
            report["pieces"][label(b, s)] = bench_pieces(x, vendored, extra, args.reps)
        section["seconds"] = round(time.perf_counter() - started, 1)
        report["sections"].append(section)
        save()
        rows = section["variants"]
        log(
            f"{label(b, s)}: "
            + "  ".join(
                f"{n} {fmt_ms(e, 'fwd')}/{fmt_ms(e, 'fwd_bwd')} ms" for n, e in rows.items()
            )
            + f"  [{section['seconds']} s, index path {section['index_path']}]"
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
    log(markdown(report))


if __name__ == "__main__":
    main()
