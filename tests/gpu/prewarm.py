"""Compile the TileLang SparseMLA kernels a run will need, in parallel, before first use.

TileLang compiles each kernel on its first call (about ten seconds apiece), keyed by the
kernel's head count, key groups, top-k width and softmax scale, one at a time under
megatron-core's cache lock. The GPU tests need 42 of them (the backport runs batch 2 as
two key groups). Here each kernel is elaborated in this thread and then compiled on a
thread pool (lowering releases the GIL, nvcc is a subprocess); the results land in
TileLang's in-memory and on-disk kernel cache, which megatron-core's own first calls then
hit. Failures are reported, never raised: the lazy path still works.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DIM, TAIL = 512, 64  # the kernels' latent and rope channels (576 in all)


def _plans(
    heads: Iterable[int], topks: Iterable[int], batches: Iterable[int], scale: float
) -> list[tuple[Any, dict]]:
    from megatron.core.transformer.experimental_attention_variant.ops import (
        tilelang_sparse_mla_bwd as bwd,
    )
    from megatron.core.transformer.experimental_attention_variant.ops import (
        tilelang_sparse_mla_fwd as fwd,
    )

    # The backport folds batch b into b key groups: b * heads query heads, kv_group b.
    groups = sorted({(b * max(16, h), b) for h in heads for b in batches})
    padded_topks = sorted({-(-t // 64) * 64 for t in topks})
    plans: list[tuple[Any, dict]] = []
    for h, g in groups:
        for t in padded_topks:
            # Exactly the arguments _get_sparse_mla_fwd_kernel / _get_bwd_kernel pass.
            plans.append(
                (
                    fwd.sparse_mla_fwd,
                    dict(
                        heads=h,
                        dim=DIM,
                        tail_dim=TAIL,
                        topk=t,
                        kv_group=g,
                        sm_scale=scale,
                        block_I=64,
                        num_stages=2,
                        threads=256,
                    ),
                )
            )
            plans.append(
                (
                    bwd.bwd,
                    dict(
                        H=h, D=DIM, D_tail=TAIL, topk=t, kv_group=g, sm_scale=scale, max_block_h=32
                    ),
                )
            )
    plans += [(bwd.preprocess, dict(H=h, D=DIM)) for h in sorted({h for h, _ in groups})]
    plans += [(bwd.postprocess, dict(D=DIM, D_tail=TAIL, kv_group=g)) for g in sorted(set(batches))]
    return plans


def prewarm(
    heads: Iterable[int],
    topks: Iterable[int],
    scale: float,
    batches: Iterable[int] = (1,),
    workers: int = 16,
) -> dict[str, Any]:
    """Compile fwd, bwd, preprocess and postprocess kernels for every (heads, top-k, batch)."""
    started = time.perf_counter()
    try:
        import tilelang  # tilelang.jit is the decorator; tilelang.compile the compiler

        plans = _plans(heads, topks, batches, scale)
        funcs = [(impl, impl.get_tir(**kwargs)) for impl, kwargs in plans]
    except Exception as exc:  # report, let the lazy path compile
        return {"ok": False, "error": repr(exc), "seconds": time.perf_counter() - started}
    elaborated = time.perf_counter() - started

    def build(item):
        impl, func = item
        return tilelang.compile(
            func,
            out_idx=impl.out_idx,
            execution_backend=impl.execution_backend,
            target=impl.target,
            target_host=impl.target_host,
            verbose=impl.verbose,
            pass_configs=impl.pass_configs,
            compile_flags=impl.compile_flags,
        )

    errors = []
    with ThreadPoolExecutor(max(1, min(workers, len(funcs)))) as pool:
        for (impl, kwargs), fut in zip(plans, [pool.submit(build, f) for f in funcs], strict=True):
            try:
                fut.result()
            except Exception as exc:
                errors.append(f"{getattr(impl.func, '__name__', 'kernel')}{kwargs}: {exc!r}")
    return {
        "ok": not errors,
        "kernels": len(funcs),
        "errors": errors,
        "elaborate_s": round(elaborated, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }
