"""Fused elementwise kernels (Triton) for WaveGlow's coupling layers on CUDA.

Between a WN layer's two matrix products, the plain formulation makes ~8
passes over memory (cond slice copy, tanh, sigmoid, product, residual and skip
adds, masking, padding and concatenation of the shifted taps). These kernels do
that work in two passes:

* ``gate``: acts = tanh(z[:, :C] + cond[:, :C]) * sigmoid(z[:, C:] + cond[:, C:]),
  reading the layer's conditioning slice in place;
* ``residual_taps``: x += res, and the next layer's shifted taps
  [x(t-d) | x(t) | x(t+d)] (zero past each item's length and outside the
  sequence) written straight from registers.

``available()`` is False without Triton or CUDA; callers then use plain torch.
"""
from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the plain torch path runs instead
    triton = None


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:
    @triton.jit
    def _gate_kernel(z_ptr, cond_ptr, out_ptr, n_rows, cond_stride, cond_offset, out_stride,
                     C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        mask = rows < n_rows
        rows64 = rows.to(tl.int64)
        z = z_ptr + rows64 * (2 * C) + cols
        cond = cond_ptr + rows64 * cond_stride + cond_offset + cols
        t_in = tl.load(z, mask=mask).to(tl.float32) + tl.load(cond, mask=mask).to(tl.float32)
        s_in = tl.load(z + C, mask=mask).to(tl.float32) + tl.load(cond + C, mask=mask).to(tl.float32)
        acts = (2.0 * tl.sigmoid(2.0 * t_in) - 1.0) * tl.sigmoid(s_in)   # tanh(a) = 2 sigmoid(2a) - 1
        tl.store(out_ptr + rows64 * out_stride + cols, acts.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _residual_taps_kernel(res_ptr, x_ptr, keep_ptr, taps_ptr, n_rows, seq_len, dilation,
                              C: tl.constexpr, HAS_RES: tl.constexpr,
                              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        mask = rows < n_rows
        rows64 = rows.to(tl.int64)
        x = tl.load(x_ptr + rows64 * C + cols, mask=mask).to(tl.float32)
        if HAS_RES:
            x = x + tl.load(res_ptr + rows64 * C + cols, mask=mask).to(tl.float32)
            tl.store(x_ptr + rows64 * C + cols, x.to(x_ptr.dtype.element_ty), mask=mask)
        v = (x * tl.load(keep_ptr + rows, mask=rows < n_rows, other=0.0).to(tl.float32))
        v = v.to(taps_ptr.dtype.element_ty)
        t = rows % seq_len
        zero = tl.zeros_like(v)
        taps = taps_ptr + cols
        tl.store(taps + rows64 * (3 * C) + C, v, mask=mask)
        # x(t) is tap 0 (x(t'-d)) of row t' = t + d, and tap 2 (x(t'+d)) of row t' = t - d
        tl.store(taps + (rows64 + dilation) * (3 * C), v, mask=mask & (t + dilation < seq_len))
        tl.store(taps + (rows64 - dilation) * (3 * C) + 2 * C, v, mask=mask & (t >= dilation))
        tl.store(taps + rows64 * (3 * C), zero, mask=mask & (t < dilation))
        tl.store(taps + rows64 * (3 * C) + 2 * C, zero, mask=mask & (t + dilation >= seq_len))


_BLOCK_R, _BLOCK_C = 32, 64


def _grid(n_rows: int, c: int):
    return (triton.cdiv(n_rows, _BLOCK_R), triton.cdiv(c, _BLOCK_C))


def gate(z: Tensor, cond: Tensor, layer: int, out: Tensor) -> Tensor:
    """z: (N, 2C); cond: (N, 2CL) whose columns [2Ci, 2C(i+1)) are this layer's;
    out: (N, C), rows may be strided (a column block of a wider buffer)."""
    n, two_c = z.shape
    c = two_c // 2
    assert out.stride(1) == 1 and cond.stride(1) == 1 and z.is_contiguous()
    _gate_kernel[_grid(n, c)](z, cond, out, n, cond.stride(0), two_c * layer, out.stride(0),
                              C=c, BLOCK_R=_BLOCK_R, BLOCK_C=_BLOCK_C)
    return out


def residual_taps(res: Tensor | None, x: Tensor, keep: Tensor, taps: Tensor,
                  seq_len: int, dilation: int) -> None:
    """x += res; taps = [x(t-d) | x(t) | x(t+d)] of keep * x. With ``res`` None
    only the taps are written. Rows are (item, t) with t < seq_len."""
    n, c = x.shape
    assert x.is_contiguous() and taps.is_contiguous() and (res is None or res.is_contiguous())
    _residual_taps_kernel[_grid(n, c)](res if res is not None else x, x, keep, taps, n, seq_len,
                                       dilation, C=c, HAS_RES=res is not None,
                                       BLOCK_R=_BLOCK_R, BLOCK_C=_BLOCK_C)
