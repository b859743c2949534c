"""One-pass CUDA passes for the #7617 local changes, in Triton (torch's CUDA builds ship it).

Each writes its whole output in one launch where tensor ops take two or three. Each entry
point returns False where it cannot run (no Triton, a layout it does not handle, a build
failure), and the caller then takes the plain tensor ops, which are as right. After a
failure the passes stay off for the process; ``disabled_because`` says why.
"""

from typing import Any

import torch

_INDEX_BLOCK = 1024
_PAD_ROWS = 4
_LATENT = 512  # the first 512 of the kernel's 576 channels, then a 64-channel tail
_TAIL = 64
_SIGNED = (torch.int16, torch.int32, torch.int64)

_kernels: Any = None  # name -> Triton kernel once built; False once the passes are off
disabled_because: BaseException | None = None


def _build() -> Any:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return False

    @triton.jit
    def index_kernel(
        src,
        dst,
        seq,
        topk,
        padded,
        num_keys,
        stride_b,
        stride_s,
        stride_k,
        CLEAN: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # Destination row r = batch * seq + query row: the caller's [b, sq] order.
        row = tl.program_id(0).to(tl.int64)
        src_row = src + (row // seq) * stride_b + (row % seq) * stride_s
        dst_row = dst + row * padded
        for start in range(0, padded, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(src_row + cols * stride_k, mask=cols < topk, other=-1)
            if CLEAN:
                x = tl.where((x >= 0) & (x < num_keys), x, -1)
            tl.store(dst_row + cols, x.to(tl.int32), mask=cols < padded)

    @triton.jit
    def pad_kernel(
        src,
        dst,
        rows,
        seq,
        heads,
        stride_s,
        stride_b,
        stride_h,
        ROWS: tl.constexpr,
        LATENT: tl.constexpr,
        TAIL: tl.constexpr,
    ):
        # Destination row r = (batch * seq + s) * heads + head of a dense [b, s, h, 576]:
        # the copy and the zero channels in one write stream.
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        inside = (row < rows)[:, None]
        rest = row // heads
        src_row = src + (rest % seq) * stride_s + (rest // seq) * stride_b
        src_row += (row % heads) * stride_h
        dst_row = dst + row * (LATENT + TAIL)
        cols = tl.arange(0, LATENT)[None, :]
        x = tl.load(src_row[:, None] + cols, mask=inside)
        tl.store(dst_row[:, None] + cols, x, mask=inside)
        tail = LATENT + tl.arange(0, TAIL)[None, :]
        zeros = tl.zeros((ROWS, TAIL), dtype=dst.dtype.element_ty)
        tl.store(dst_row[:, None] + tail, zeros, mask=inside)

    return {"index": index_kernel, "pad": pad_kernel}


def _launch(name: str, grid: tuple[int], device: Any, *args: Any, **meta: Any) -> bool:
    global _kernels, disabled_because
    if _kernels is None:
        _kernels = _build()
    if _kernels is False:
        return False
    try:
        with torch.cuda.device(device):
            _kernels[name][grid](*args, **meta)
    except Exception as exc:  # a Triton that cannot build here: the plain path is as right
        _kernels, disabled_because = False, exc
        return False
    return True


def pad_to_kernel_layout(x: Any, buf: Any) -> bool:
    """``buf[b, s, h, :512] = x[s, b, h]``, ``buf[..., 512:] = 0``; buf dense, width 576."""
    s, b, h, d = x.shape
    if x.stride(-1) != 1 or d != _LATENT or not buf.is_contiguous():
        return False
    rows = b * s * h
    grid = (-(-rows // _PAD_ROWS),)
    args = (x, buf, rows, s, h, *x.stride()[:3])
    return _launch("pad", grid, x.device, *args, ROWS=_PAD_ROWS, LATENT=_LATENT, TAIL=_TAIL)


def kernel_indices(topk_indices: Any, out: Any, num_keys: int | None) -> bool:
    """``out[b, sq, 0, :topk]`` = the indices as int32 (outside ``[0, num_keys)`` -1 when
    ``num_keys`` is given), the rest of ``out`` -1; signed integer indices only."""
    if topk_indices.dtype not in _SIGNED:
        return False
    b, sq, topk = topk_indices.shape
    padded = out.size(-1)
    clean = num_keys is not None
    args = (topk_indices, out, sq, topk, padded, num_keys if clean else 0, *topk_indices.stride())
    return _launch("index", (b * sq,), topk_indices.device, *args, CLEAN=clean, BLOCK=_INDEX_BLOCK)
