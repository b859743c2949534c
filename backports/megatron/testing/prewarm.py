"""Compile the TileLang SparseMLA kernels a run will need, in parallel, before first use.

TileLang compiles each kernel on its first call (about ten seconds apiece), keyed by the
kernel's head count, key groups, top-k width and softmax scale, one at a time under
megatron-core's cache lock. The backport calls the kernel as upstream does, with one key
group at every batch size, so one set serves every batch. Here each kernel factory is
called on a thread pool (lowering releases the GIL, nvcc is a subprocess) with exactly
the arguments, in exactly the call form, that megatron-core's ``_get_*_kernel`` helpers
use, so the compiled kernel lands in the factory's own cache, which megatron-core's first
calls then hit.

An earlier version elaborated each kernel here and compiled it with ``tilelang.compile``:
the small pre/post-processing kernels were then found in TileLang's kernel cache, but the
forward and backward kernels were compiled a second time on first use (seen on an H200,
2026-12-03), so only the factories' call path is trusted now. Failures are reported,
never raised: the lazy path still works.
"""

import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DIM, TAIL = 512, 64  # the kernels' latent and rope channels (576 in all)
BLOCK_I, NUM_STAGES, THREADS, MAX_BLOCK_H = 64, 2, 256, 32  # megatron-core 0.19.2's defaults


def _plans(
    heads: Iterable[int], topks: Iterable[int], scale: float
) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """(factory, args, kwargs) for every kernel, in megatron-core's own call form."""
    from megatron.core.transformer.experimental_attention_variant.ops import (
        tilelang_sparse_mla_bwd as bwd,
    )
    from megatron.core.transformer.experimental_attention_variant.ops import (
        tilelang_sparse_mla_fwd as fwd,
    )

    # Heads under 16 run on the 16-head kernel; one key group (kv_group 1) at every batch.
    groups = sorted({(max(16, h), 1) for h in heads})
    padded_topks = sorted({-(-t // 64) * 64 for t in topks})
    plans: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    for h, g in groups:
        for t in padded_topks:
            # As _get_sparse_mla_fwd_kernel / _get_bwd_kernel call them.
            plans.append(
                (
                    fwd.sparse_mla_fwd,
                    (h, DIM, TAIL, t, g, scale),
                    dict(block_I=BLOCK_I, num_stages=NUM_STAGES, threads=THREADS),
                )
            )
            plans.append((bwd.bwd, (h, DIM, TAIL, t, g, scale), dict(max_block_h=MAX_BLOCK_H)))
    plans += [(bwd.preprocess, (h, DIM), {}) for h in sorted({h for h, _ in groups})]
    plans += [(bwd.postprocess, (DIM, TAIL, 1), {})]
    return plans


def prewarm(
    heads: Iterable[int],
    topks: Iterable[int],
    scale: float,
    workers: int = 16,
) -> dict[str, Any]:
    """Compile fwd, bwd, preprocess and postprocess kernels for every (heads, top-k)."""
    started = time.perf_counter()
    try:
        plans = _plans(heads, topks, scale)
    except Exception as exc:  # report, let the lazy path compile
        return {"ok": False, "error": repr(exc), "seconds": time.perf_counter() - started}

    errors = []
    with ThreadPoolExecutor(max(1, min(workers, len(plans)))) as pool:
        futures = [pool.submit(factory, *args, **kwargs) for factory, args, kwargs in plans]
        for (factory, args, kwargs), fut in zip(plans, futures, strict=True):
            try:
                fut.result()
            except Exception as exc:
                name = getattr(getattr(factory, "func", None), "__name__", "kernel")
                errors.append(f"{name}{args}{kwargs}: {exc!r}")
    return {
        "ok": not errors,
        "kernels": len(plans),
        "errors": errors,
        "seconds": round(time.perf_counter() - started, 1),
    }


class CompileCounter(logging.Handler):
    """Counts the TileLang kernel compiles that start while it is attached.

    ``Handler.handle`` holds the handler's own lock around ``emit``, so compiles logged
    from several threads are counted without another lock.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "begins to compile" in record.getMessage():
            self.count += 1

    def attach(self) -> "CompileCounter":
        logging.getLogger("tilelang.jit.kernel").addHandler(self)
        return self
