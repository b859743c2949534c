"""GPU tests: skipped, with the reason, unless CUDA and TileLang's SparseMLA are here (or, in
a module with ``NEEDS_TILELANG = False``, unless CUDA is here).

On a GPU host the kernels the tests use are compiled up front, in parallel
(backports/megatron/testing/prewarm.py), and the errors each test saw against the FP32 reference are
written to the JSON file named by ``GPU_TEST_RECORD`` when the session ends.
"""

import functools
import importlib
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
SCALE = 0.0625  # one softmax scale everywhere: TileLang compiles one kernel set per scale
# Every (heads, top-k) the tests run; heads under 16 run on the 16-head kernel.
KERNEL_HEADS = (16, 32, 64)
KERNEL_TOPKS = (64, 65, 127, 2051)


@functools.cache
def why_not_gpu() -> str | None:
    """None when the real kernel can run here, else why the GPU tests are skipped."""
    try:
        import torch
    except ImportError as exc:
        return f"needs torch ({exc})"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False"
    try:
        import tilelang  # noqa: F401
    except Exception as exc:  # ImportError, or a broken native library (OSError)
        return f"needs TileLang: import tilelang failed ({exc!r})"
    try:
        module = importlib.import_module(TILELANG_DSA)
    except Exception as exc:
        return f"needs megatron-core 0.19.2's tilelang_dsa module ({exc!r})"
    if getattr(module, "SparseMLA", None) is None:
        return "megatron-core's TileLang SparseMLA kernel did not import"
    return None


@functools.cache
def why_not_cuda() -> str | None:
    """None when a CUDA GPU is here (what a test that needs no TileLang kernel asks)."""
    try:
        import torch
    except ImportError as exc:
        return f"needs torch ({exc})"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not item.get_closest_marker("gpu"):
            continue
        # A module that sets NEEDS_TILELANG = False needs CUDA alone (#5077's optimizer).
        needs_kernel = getattr(getattr(item, "module", None), "NEEDS_TILELANG", True)
        reason = why_not_gpu() if needs_kernel else why_not_cuda()
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def compiled_kernels() -> dict[str, Any]:
    from backports.megatron.testing.prewarm import CompileCounter, prewarm

    result = prewarm(KERNEL_HEADS, KERNEL_TOPKS, SCALE)
    print(f"\nTileLang prewarm: {result}")
    # Every compile from here on is one the prewarm missed: reported at the end.
    _LAZY_COMPILES.append(CompileCounter().attach())
    return result


_LAZY_COMPILES: list[Any] = []  # the CompileCounter, once the prewarm has run


def _lazy_compiles() -> int | None:
    return _LAZY_COMPILES[0].count if _LAZY_COMPILES else None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _LAZY_COMPILES:
        terminalreporter.write_line(
            f"TileLang kernels compiled after the prewarm: {_lazy_compiles()}"
        )


@pytest.fixture(scope="session")
def error_record() -> Iterator[dict[str, dict[str, float]]]:
    """name -> {quantity: relative error}: what the tolerances were measured against."""
    record: dict[str, dict[str, float]] = {}
    yield record
    path = os.environ.get("GPU_TEST_RECORD")
    if path and record:
        worst = {}
        for errors in record.values():
            for quantity, value in errors.items():
                worst[quantity] = max(worst.get(quantity, 0.0), value)
        with open(path, "w") as fh:
            summary = {"worst": worst, "cases": record, "lazy_compiles": _lazy_compiles()}
            json.dump(summary, fh, indent=1, sort_keys=True)
