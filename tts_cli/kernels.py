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

And two matrix products with that work fused into them (``FastWaveGlow`` with
``kernels_mode="matmul"``), which leave no elementwise pass at all:

* ``taps_gate``: the dilated convolution read straight from x (the taps
  buffer is never written: each K block of the product reads x's rows shifted
  by -d, 0 or +d) with the gate in its epilogue;
* ``residual_update``: x += acts @ W_res + b_res, the add in the epilogue.

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


# ---------------------------------------------------------------------------
# Matrix products with the elementwise work fused in (kernels_mode="matmul").

if triton is not None:
    @triton.jit(do_not_specialize=["n_rows", "seq_len", "dilation"])
    def _taps_gate_kernel(x_ptr, keep_ptr, cond_ptr, w_ptr, out_ptr, n_rows, seq_len, dilation,
                          cond_stride, cond_offset, out_stride,
                          C: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # One program: rows [m, m+BM) x columns [n, n+BN) of both halves of z.
        # Column blocks of one row block are neighbours in launch order, so
        # they read the same rows of x from L2.
        pid = tl.program_id(0)
        pid_m = pid // (C // BLOCK_N)
        pid_n = pid % (C // BLOCK_N)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows64 = rows.to(tl.int64)
        in_rows = rows < n_rows
        t = rows % seq_len
        # Tap j reads source row r + (j-1)d: present when inside [0, T) and kept
        # (keep is 0 or 1, so "times keep" is a load mask).
        ok_prev = in_rows & (t >= dilation)
        ok_prev = ok_prev & (tl.load(keep_ptr + rows64 - dilation, mask=ok_prev, other=0) != 0)
        ok_mid = in_rows & (tl.load(keep_ptr + rows64, mask=in_rows, other=0) != 0)
        ok_next = in_rows & (t + dilation < seq_len)
        ok_next = ok_next & (tl.load(keep_ptr + rows64 + dilation, mask=ok_next, other=0) != 0)
        ks = tl.arange(0, BLOCK_K)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        w_block = w_ptr + ks[:, None] * (2 * C) + cols[None, :]
        acc_tanh = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_sigmoid = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, 3 * C, BLOCK_K):     # K = 3C; a block lies inside one tap (C % BK == 0)
            tap = k // C
            ok = tl.where(tap == 0, ok_prev, tl.where(tap == 1, ok_mid, ok_next))
            src = rows64 + (tap - 1) * dilation
            a = tl.load(x_ptr + src[:, None] * C + (k - tap * C) + ks[None, :], mask=ok[:, None], other=0.0)
            w = w_block + k * (2 * C)
            acc_tanh = tl.dot(a, tl.load(w), acc_tanh, input_precision=DOT_PRECISION)
            acc_sigmoid = tl.dot(a, tl.load(w + C), acc_sigmoid, input_precision=DOT_PRECISION)
        mask = in_rows[:, None]
        cond = cond_ptr + rows64[:, None] * cond_stride + cond_offset + cols[None, :]
        a_in = acc_tanh + tl.load(cond, mask=mask, other=0.0).to(tl.float32)
        s_in = acc_sigmoid + tl.load(cond + C, mask=mask, other=0.0).to(tl.float32)
        acts = (2.0 * tl.sigmoid(2.0 * a_in) - 1.0) * tl.sigmoid(s_in)   # tanh(a) = 2 sigmoid(2a) - 1
        tl.store(out_ptr + rows64[:, None] * out_stride + cols[None, :],
                 acts.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["n_rows"])
    def _residual_update_kernel(a_ptr, w_ptr, b_ptr, x_ptr, n_rows, a_stride,
                                C: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        pid_m = pid // (C // BLOCK_N)
        pid_n = pid % (C // BLOCK_N)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows64 = rows.to(tl.int64)
        mask = (rows < n_rows)[:, None]
        ks = tl.arange(0, BLOCK_K)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        a_block = a_ptr + rows64[:, None] * a_stride + ks[None, :]
        w_block = w_ptr + ks[:, None] * C + cols[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, C, BLOCK_K):
            a = tl.load(a_block + k, mask=mask, other=0.0)
            acc = tl.dot(a, tl.load(w_block + k * C), acc, input_precision=DOT_PRECISION)
        acc += tl.load(b_ptr + cols).to(tl.float32)[None, :]
        x = x_ptr + rows64[:, None] * C + cols[None, :]
        acc += tl.load(x, mask=mask, other=0.0).to(tl.float32)
        tl.store(x, acc.to(x_ptr.dtype.element_ty), mask=mask)

    def _config(block_m, block_n, block_k, warps, stages):
        return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k},
                             num_warps=warps, num_stages=stages)

    # Few configs: every one is compiled and timed once per (C, dtypes) at
    # start-up (FastWaveGlow's constructor, ``tune``), inside a 20 s budget.
    _TAPS_GATE_CONFIGS = [_config(128, 128, 64, 8, 3), _config(128, 128, 64, 8, 4),
                          _config(128, 128, 32, 8, 4), _config(128, 64, 64, 4, 4),
                          _config(64, 128, 64, 4, 4), _config(64, 64, 64, 4, 3)]
    # Memory bound (K = C): a block as wide as C reads each row of acts once.
    _RESIDUAL_CONFIGS = [_config(64, 256, 64, 8, 3), _config(128, 128, 64, 8, 3),
                         _config(64, 128, 64, 4, 3), _config(128, 64, 64, 4, 4)]
    # float32 (the exactness reference, not a speed mode) runs one small tile:
    # its dot products are exact FMA loops, slow to compile in large tiles.
    _FLOAT32_CONFIG = _config(64, 64, 32, 4, 3)

    def _fitting(configs, named_args, **kwargs):
        """The configs whose blocks tile C exactly; one small tile in float32."""
        args = {**named_args, **kwargs}
        c = args["C"]
        if args["DOT_PRECISION"] == "ieee":
            return [_FLOAT32_CONFIG]
        fit = [k for k in configs
               if c % k.kwargs["BLOCK_N"] == 0 and c % k.kwargs["BLOCK_K"] == 0]
        return fit or [_FLOAT32_CONFIG]

    _taps_gate_tuned = triton.autotune(_TAPS_GATE_CONFIGS, key=["C"],
                                       prune_configs_by={"early_config_prune": _fitting})(_taps_gate_kernel)
    # Timing a config runs it many times: x is restored after each.
    _residual_update_tuned = triton.autotune(_RESIDUAL_CONFIGS, key=["C"], restore_value=["x_ptr"],
                                             prune_configs_by={"early_config_prune": _fitting}
                                             )(_residual_update_kernel)

# One fixed launch config instead of autotuning, e.g. {"BLOCK_M": 16,
# "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2}: for tests
# under Triton's CPU interpreter, where autotuning would run every config.
_FIXED_CONFIG: dict | None = None


def _launch(tuned, raw, n_rows: int, c: int, *args, **constexprs) -> None:
    """The autotuned kernel ``tuned``, or ``raw`` with _FIXED_CONFIG, over a
    1-D grid: row blocks x column blocks of C, the column blocks innermost."""
    if _FIXED_CONFIG is None:
        grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_M"]) * (c // meta["BLOCK_N"]),)
        tuned[grid](*args, **constexprs)
        return
    cfg = dict(_FIXED_CONFIG)
    assert c % cfg["BLOCK_N"] == 0 and c % cfg["BLOCK_K"] == 0, (c, cfg)
    raw[(triton.cdiv(n_rows, cfg["BLOCK_M"]) * (c // cfg["BLOCK_N"]),)](*args, **constexprs, **cfg)


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 stays float32 (no TF32); the setting is moot for 16-bit inputs.
    return "ieee" if dtype == torch.float32 else "tf32"


def taps_gate(x: Tensor, keep: Tensor, cond: Tensor, layer: int, w_taps: Tensor,
              seq_len: int, dilation: int, out: Tensor) -> Tensor:
    """One WN layer's gated activations straight from x, without a taps buffer:

        z = [x'(t-d) | x'(t) | x'(t+d)] @ w_taps,   x' = keep * x, zero outside [0, T)
        out = tanh(z[:, :C] + cond[:, 2Ci : 2Ci+C]) * sigmoid(z[:, C:] + cond[:, 2Ci+C : 2C(i+1)])

    x: (N, C) contiguous, rows (item, t) with t = row % seq_len; keep: (N,) of
    0 and 1 (a row whose keep is 0 is read as zeros); cond: (N, 2CL), row
    stride free; w_taps: (3C, 2C) contiguous, rows [x(t-d) | x(t) | x(t+d)];
    out: (N, C), row stride free (a column block of the (N, L*C) activations).
    One matrix product with two float32 accumulators per tile (the tanh and
    the sigmoid columns) and the gate in its epilogue. C must be a multiple
    of 16. Returns ``out``."""
    n, c = x.shape
    assert x.is_contiguous() and w_taps.is_contiguous() and keep.is_contiguous()
    assert w_taps.shape == (3 * c, 2 * c) and keep.shape == (n,) and c % 16 == 0
    assert cond.stride(1) == 1 and out.stride(1) == 1 and out.shape == (n, c)
    assert x.dtype == w_taps.dtype
    _launch(_taps_gate_tuned, _taps_gate_kernel, n, c,
            x, keep, cond, w_taps, out, n, seq_len, dilation,
            cond.stride(0), 2 * c * layer, out.stride(0),
            C=c, DOT_PRECISION=_dot_precision(x.dtype))
    return out


def residual_update(acts: Tensor, w_res: Tensor, b_res: Tensor, x: Tensor) -> Tensor:
    """x += acts @ w_res + b_res, in place, as one matrix product whose
    epilogue adds the bias and x's tile (float32 accumulation, one rounding).

    acts: (N, C), row stride free (a column block of the activations);
    w_res: (C, C) contiguous; b_res: (C,); x: (N, C) contiguous. C must be a
    multiple of 16. Returns ``x``."""
    n, c = x.shape
    assert x.is_contiguous() and w_res.is_contiguous() and b_res.is_contiguous()
    assert acts.shape == (n, c) and acts.stride(1) == 1 and w_res.shape == (c, c) and c % 16 == 0
    assert acts.dtype == w_res.dtype
    _launch(_residual_update_tuned, _residual_update_kernel, n, c,
            acts, w_res, b_res, x, n, acts.stride(0),
            C=c, DOT_PRECISION=_dot_precision(x.dtype))
    return x


def tune(c: int, dtype: torch.dtype, device: torch.device, rows: int = 1 << 18) -> None:
    """Autotune ``taps_gate`` and ``residual_update`` for width ``c`` and
    ``dtype`` on scratch tensors of ``rows`` rows (autotuning keys on C and
    the dtypes only, so this choice holds for every later call: tuning on
    the first real call instead could pick a tile for a tiny warm-up batch)."""
    if _FIXED_CONFIG is not None:
        return
    x = torch.randn(rows, c, device=device).to(dtype)
    keep = torch.ones(rows, device=device, dtype=dtype)
    cond = torch.randn(rows, 2 * c, device=device).to(dtype)
    w_taps = (torch.randn(3 * c, 2 * c, device=device) / (3 * c) ** 0.5).to(dtype)
    out = torch.empty(rows, c, device=device, dtype=dtype)
    taps_gate(x, keep, cond, 0, w_taps, seq_len=1024, dilation=1, out=out)
    w_res = (torch.randn(c, c, device=device) / c ** 0.5).to(dtype)
    residual_update(out, w_res, torch.zeros(c, device=device, dtype=dtype), x)
