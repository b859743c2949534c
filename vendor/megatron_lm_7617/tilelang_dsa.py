# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     7617 (head 3d07347, merged as f77f360)
# path:   megatron/core/transformer/experimental_attention_variant/ops/tilelang_dsa.py
# symbol: fused_sparse_mla_absorbed
# origin: handwritten in this repository from the pull request's described behaviour and
#         megatron-core 0.19.2's function; not a byte copy of upstream source.
"""PR-head ``fused_sparse_mla_absorbed``: NoPE width 512 and any top-k width.

The function keeps megatron-core 0.19.2's name, signature and contract. Module-global
names of the target module (``SparseMLA`` and the two helpers) are read from the live
target module at call time, so a kernel or helper replaced there is seen here.
"""

import sys

import torch

# The module whose globals this function reads. The applier rebinds it when megatron-core
# defines the function elsewhere (upstream's planned move under megatron/core/ops/).
__target_module__ = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"

# The TileLang kernels are compiled for 512 latent + 64 rope channels, top-k in blocks of
# 64, and at least 16 query heads per key group.
_KERNEL_WIDTH = 576
_NOPE_WIDTH = 512
_TOPK_BLOCK = 64
_MIN_KERNEL_HEADS = 16


def _live_target():
    return sys.modules[__target_module__]


# Word types a bf16 copy may move instead of 2-byte elements: 16 bytes, else 8.
_WORDS = (torch.complex128, torch.int64)


def _as_words(*tensors):
    """The same bytes as words of one type, or None where no layout allows it."""
    for word in _WORDS:
        try:
            return [t.view(word) for t in tensors]
        except RuntimeError:
            continue
    return None


def _copy(dst, src):
    """``dst.copy_(src)`` for bf16 tensors, moved as 16- or 8-byte words where both allow.

    A strided copy of 2-byte elements runs well below the memory bandwidth; the same bytes
    as words (last stride 1, the other strides and the offset multiples of the word) run
    close to it. Anything else takes the plain copy.
    """
    words = _as_words(dst, src)
    if words is None:
        dst.copy_(src)
    else:
        words[0].copy_(words[1])


def _zero(t):
    words = _as_words(t)
    (t if words is None else words[0]).zero_()


# The kernel's layout is [batch, s, heads, width] with `kv_group` key heads sharing
# `heads // kv_group` query heads each. The caller's [s, b, h, d] is, in memory, already
# [1, s, b * h, d]: with the batch folded into the key-group axis (group i = batch i's one
# key head) the kernel reads the caller's rows where they lie and writes its output in the
# caller's layout, so no tensor is ever transposed, at any batch size. Each (row, group)
# is the same work the kernel would do for (batch, row): the same blocks, the same result.


class _Padded(torch.autograd.Function):
    """``[s, b, h, d]`` -> zero-padded ``[s, b, heads, width]`` in a single copy.

    ``F.pad`` of channels and heads writes the tensor once per pad, and autograd's slice
    backward zero-fills and copies the whole padded gradient; here the forward writes each
    element once and the backward is one slice copy into the caller's layout, contiguous,
    so a leaf's ``.grad`` takes it without another copy.
    """

    @staticmethod
    def forward(ctx, x, heads, width):
        s, b, h, d = x.shape
        ctx.real_shape = (h, d)
        buf = x.new_empty((s, b, heads, width))
        if heads == h and x.is_cuda and _pad_fused(x, buf):
            return buf
        if heads > h:
            _zero(buf[:, :, h:])
        if width > d:
            _zero(buf[:, :, :h, d:])
        _copy(buf[:, :, :h, :d], x)
        return buf

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        h, d = ctx.real_shape
        grad_x = grad.new_empty((*grad.shape[:2], h, d))
        _copy(grad_x, grad[:, :, :h, :d])
        return grad_x, None, None


def _to_kernel_layout(x, heads, width):
    """``[s, b, h, d]`` -> the kernel's ``[1, s, b * heads, width]``: a view where it can be."""
    s, b = x.shape[:2]
    if not (x.size(2) == heads and x.size(3) == width and x.is_contiguous()):
        x = _Padded.apply(x, heads, width)
    return x.view(1, s, b * heads, width)


class _DropHeads(torch.autograd.Function):
    """``[s, b, heads, v]`` -> the caller's ``[s, b, h, v]``: one copy each way.

    Slicing the padded heads off and calling ``contiguous()`` would copy the output, and in
    backward zero-fill a full gradient and copy into it before the kernel copies it again.
    """

    @staticmethod
    def forward(ctx, out, h):
        s, b, heads, v = out.shape
        ctx.kernel_heads = heads
        result = out.new_empty((s, b, h, v))
        _copy(result, out[:, :, :h])
        return result

    @staticmethod
    def backward(ctx, grad):
        s, b, h, v = grad.shape
        grad_out = grad.new_empty((s, b, ctx.kernel_heads, v))
        _zero(grad_out[:, :, h:])
        _copy(grad_out[:, :, :h], grad)
        return grad_out, None


def _from_kernel_layout(out, sq, batch, heads):
    """The kernel's ``[1, s, b * kernel_heads, v]`` -> the caller's ``[s, b, h, v]``."""
    out = out.reshape(sq, batch, -1, out.size(-1))  # a view: the kernel's output is dense
    return out if out.size(2) == heads else _DropHeads.apply(out, heads)


# Fused passes on CUDA, in Triton (which torch's CUDA builds ship): each writes its whole
# output in one launch where tensor ops take two or three, and the plain path stays as the
# fallback everywhere else.
_INDEX_BLOCK = 1024
_PAD_ROWS = 4
_fused = None  # name -> Triton kernel once built; False where Triton is unavailable
_fused_error = None  # why the fused passes were turned off, if they were


def _build_fused():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return False

    @triton.jit
    def index_kernel(
        src, dst, batch, topk, padded, num_keys, stride_b, stride_s, stride_k, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)  # destination row: query row * batch + batch
        src_row = src + (row % batch) * stride_b + (row // batch) * stride_s
        dst_row = dst + row * padded
        for start in range(0, padded, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(src_row + cols * stride_k, mask=cols < topk, other=-1)
            keep = (x >= 0) & (x < num_keys)
            tl.store(dst_row + cols, tl.where(keep, x, -1).to(tl.int32), mask=cols < padded)

    @triton.jit
    def pad_kernel(
        src,
        dst,
        rows,
        batch,
        heads,
        stride_s,
        stride_b,
        stride_h,
        D: tl.constexpr,
        TAIL: tl.constexpr,
        ROWS: tl.constexpr,
    ):
        # Whole rows of D + TAIL channels: the copy and the zero tail in one write stream.
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        keep = (row < rows)[:, None]
        rest = row // heads
        src_row = src + (rest // batch) * stride_s + (rest % batch) * stride_b
        src_row += (row % heads) * stride_h
        dst_row = dst + row * (D + TAIL)
        cols = tl.arange(0, D)[None, :]
        x = tl.load(src_row[:, None] + cols, mask=keep)
        tl.store(dst_row[:, None] + cols, x, mask=keep)
        tail = D + tl.arange(0, TAIL)[None, :]
        zeros = tl.zeros((ROWS, TAIL), dtype=src.dtype.element_ty)
        tl.store(dst_row[:, None] + tail, zeros, mask=keep)

    return {"index": index_kernel, "pad": pad_kernel}


def _launch(name, grid, device, *args, **meta):
    """Run a fused pass; False (and the plain path from then on) where it cannot run."""
    global _fused, _fused_error
    if _fused is None:
        _fused = _build_fused()
    if _fused is False:
        return False
    try:
        with torch.cuda.device(device):
            _fused[name][grid](*args, **meta)
    except Exception as exc:  # a Triton that cannot build here: the plain path is as right
        _fused, _fused_error = False, exc
        return False
    return True


def _is_power_of_two(n):
    return n > 0 and n & (n - 1) == 0


def _pad_fused(x, buf):
    """``buf[..., :d] = x``, ``buf[..., d:] = 0`` in one pass (no padded heads)."""
    d, width = x.size(-1), buf.size(-1)
    if x.stride(-1) != 1 or not (_is_power_of_two(d) and _is_power_of_two(width - d)):
        return False
    s, b, h = x.shape[:3]
    rows = s * b * h
    grid = (-(-rows // _PAD_ROWS),)
    args = (x, buf, rows, b, h, *x.stride()[:3])
    return _launch("pad", grid, x.device, *args, D=d, TAIL=width - d, ROWS=_PAD_ROWS)


def _kernel_indices_fused(topk_indices, indices, num_keys):
    """The whole index conversion in one pass."""
    b, sq, topk = topk_indices.shape
    args = (topk_indices, indices, b, topk, indices.size(-1), num_keys, *topk_indices.stride())
    return _launch("index", (b * sq,), topk_indices.device, *args, BLOCK=_INDEX_BLOCK)


def _kernel_indices(topk_indices, num_keys):
    """``[b, sq, topk]`` -> int32 ``[1, sq, b, topk']``, topk' the next multiple of 64.

    The kernel treats only exactly -1 as an empty slot and checks no upper bound, so every
    index outside ``[0, num_keys)`` becomes -1 here, in the int32 copy the kernel needs
    anyway: no host sync, and the caller's tensor is never written. On CUDA one fused
    pass does the copy, the bounds and the -1 padding; elsewhere three tensor ops do.
    """
    b, sq, topk = topk_indices.shape
    padded = -(-topk // _TOPK_BLOCK) * _TOPK_BLOCK
    indices = torch.empty((1, sq, b, padded), dtype=torch.int32, device=topk_indices.device)
    if topk_indices.is_cuda and _kernel_indices_fused(topk_indices, indices, num_keys):
        return indices
    if padded > topk:
        indices[..., topk:].fill_(-1)
    slots = indices[0, :, :, :topk]
    topk_indices = topk_indices.transpose(0, 1)  # [sq, b, topk], the slots' order
    # Clamp in the caller's dtype before narrowing, so a huge int64 index cannot wrap
    # into a valid int32 one; every negative index is then -1 and every index past the
    # end is num_keys, which the last step clears. A bound past the dtype's range is no
    # bound at all (int16 indices, more than 32767 keys).
    high = min(num_keys, torch.iinfo(topk_indices.dtype).max)
    if topk_indices.dtype == torch.int32:
        torch.clamp(topk_indices, min=-1, max=high, out=slots)
    else:
        slots.copy_(topk_indices.clamp(min=-1, max=high))
    slots.masked_fill_(slots == num_keys, -1)
    return indices


def fused_sparse_mla_absorbed(
    query: torch.Tensor,
    key: torch.Tensor,
    topk_indices: torch.Tensor,
    softmax_scale: float,
    v_channels: int,
) -> torch.Tensor | None:
    """Run fused SparseMLA kernel for absorbed-MLA path (NoPE and unaligned top-k too)."""
    target = _live_target()
    sparse_mla = target.SparseMLA
    if sparse_mla is None:
        return None

    if query.ndim != 4 or key.ndim != 4 or topk_indices.ndim != 3:
        return None
    if not target._all_bfloat16(query, key):
        return None
    if key.size(2) != 1:
        return None
    if query.size(1) != key.size(1) or topk_indices.size(0) != query.size(1):
        return None
    if topk_indices.size(1) != query.size(0):
        return None
    if query.size(-1) != key.size(-1):
        return None
    if query.size(-1) not in (_NOPE_WIDTH, _KERNEL_WIDTH) or v_channels != _NOPE_WIDTH:
        return None
    if topk_indices.dtype not in (torch.int16, torch.int32, torch.int64):
        return None
    if query.numel() == 0 or key.numel() == 0 or topk_indices.size(-1) == 0:
        return None
    query_heads = query.size(2)
    if query_heads <= 0:
        return None
    kernel_heads = max(query_heads, _MIN_KERNEL_HEADS)
    # One kernel call for the whole batch, batch i as key group i (see _to_kernel_layout).
    sq, batch = query.shape[:2]
    if not target._is_supported_sparse_mla_head_count(batch * kernel_heads, kv_group=batch):
        return None

    # NoPE: zero channels 512..575 add nothing to q.k, so the caller's softmax_scale is
    # passed on unchanged; the value is still key's first 512 channels.
    query_k = _to_kernel_layout(query, kernel_heads, _KERNEL_WIDTH)
    key_k = _to_kernel_layout(key, 1, _KERNEL_WIDTH)
    indices_k = _kernel_indices(topk_indices, key.size(0))
    out, _ = sparse_mla.apply(query_k, key_k, indices_k, softmax_scale)
    if out.shape != (1, sq, batch * kernel_heads, v_channels):
        return None
    return _from_kernel_layout(out, sq, batch, query_heads)
