"""Rehearse a CUDA-only megatron code path on a CPU host: the GPU's memory stands in as CPU.

megatron-core 0.19.2's ``DistributedDataParallel`` and ``DistributedOptimizer`` cannot be
built without a GPU: they allocate with ``device=torch.cuda.current_device()`` and
``device='cuda'``, move tensors with ``.cuda()``, accept parameters only where
``tensor.type()`` names a ``torch.cuda.*Tensor``, and order streams. ``install()`` makes
each of those a CPU placement, so the same megatron code runs over gloo on CPU:

- a ``TorchFunctionMode`` rewrites a CUDA ``device`` argument (``'cuda'``, ``'cuda:N'``,
  an index) to ``'cpu'``, makes ``Tensor.cuda()`` and ``.to('cuda')`` stay on the CPU, and
  answers ``Tensor.type()`` with the CUDA name of the CPU tensor's type;
- ``torch.cuda.current_device`` says 0; ``synchronize``, ``empty_cache`` and the current
  stream's ``wait_stream`` do nothing (CPU work is done when the call returns).

No kernel is replaced and nothing is computed differently: every operation is torch's own
CPU operation on the same values. It exists so that a GPU script is rehearsed on CPU before
a GPU's scarce minutes are spent on it; results on the GPU come from the GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["install"]

_CPU = torch.device("cpu")


def _on_cpu(device: Any) -> Any:
    if isinstance(device, int) and not isinstance(device, bool):
        return _CPU
    if isinstance(device, str | torch.device) and torch.device(device).type == "cuda":
        return _CPU
    return device


class _CudaOnCpu(TorchFunctionMode):
    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = str(func(*args))
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to:  # .to(0), .to('cuda'), .to(torch.device('cuda', 1))
            args = (args[0], *(_on_cpu(a) for a in args[1:]))
        return func(*args, **kwargs)


class _DoneStream:
    """torch.cuda.current_stream() on CPU: every operation has finished when it returns."""

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def install() -> None:
    """For the rest of the process (a rehearsal job's own interpreter, never a user's)."""
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.current_stream = lambda device=None: _DoneStream()
    _CudaOnCpu().__enter__()
