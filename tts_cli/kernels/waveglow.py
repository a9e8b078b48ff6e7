"""WaveGlow's coupling layers on CUDA: two Triton matrix products per WN layer.

``FastWaveGlow`` (waveglow_fast.py) runs each layer of a flow's WN as

* ``taps_cond_gate``: the dilated convolution and the layer's share of the
  folded conditioning as one product, the gate in its epilogue::

      z = [x'(t-d) | x'(t) | x'(t+d) | window(q)] @ [W_taps ; W_cond[p]] + b
      acts = tanh(z_tanh) * sigmoid(z_sigmoid)          t = P q + p

  x' is x zeroed past each item's length, read straight from x (no shifted
  copy is ever stored); window(q) is mel frames q-J+1..q (J x n_mel values),
  which reach group step t through phase p's weights. So that a row block
  shares one phase's weights, the rows are phase-major (``PhaseRows``). The
  tanh and sigmoid columns are paired (``paired_gate_columns``), so each
  tile is one accumulator, split in the epilogue;
* ``residual_update``: x += acts @ W_res + b_res, the add in the epilogue.

Shapes: the channel count C and the window width must be multiples of
``CHANNELS_MULTIPLE``, which every launch config tiles exactly. FastWaveGlow
pads a narrower model with zero channels, which changes none of its outputs.
The wrappers check every shape and refuse anything else, so a kernel never
runs outside the shapes it was proven on.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from tts_cli.kernels import Launch, dot_precision, triton

if triton is not None:
    import triton.language as tl

# Every config's BLOCK_N and BLOCK_K divide this, so they tile any channel
# count and window width that is a multiple of it.
CHANNELS_MULTIPLE = 64
# A phase's block of rows is a multiple of this, so no row block straddles two
# phases: every config's BLOCK_M divides it.
PHASE_ROWS_MULTIPLE = 128


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class PhaseRows:
    """Where a batch's rows lie in the phase-major layout: ``items`` items of
    ``frames`` frames, ``phases`` group steps per frame. Group step t = P q + p
    of item b is row p R + (b F + q), where R (``phase_rows``) is items x
    frames rounded up to PHASE_ROWS_MULTIPLE: each phase's block ends in
    dummy rows that no step maps to."""
    items: int
    frames: int
    phases: int

    @property
    def item_rows(self) -> int:
        return self.items * self.frames

    @property
    def phase_rows(self) -> int:
        return round_up(self.item_rows, PHASE_ROWS_MULTIPLE)

    @property
    def n_rows(self) -> int:
        return self.phases * self.phase_rows

    def gather(self, y: Tensor) -> Tensor:
        """(items, frames * phases, n) time-major -> (n_rows, n) phase-major, dummy rows 0."""
        n = y.shape[-1]
        y = y.reshape(self.items, self.frames, self.phases, n).permute(2, 0, 1, 3)
        out = y.new_zeros(self.phases, self.phase_rows, n)
        out[:, : self.item_rows] = y.reshape(self.phases, self.item_rows, n)
        return out.view(self.n_rows, n)

    def scatter(self, y: Tensor) -> Tensor:
        """``gather``'s inverse: (n_rows, n) -> (items, frames * phases, n)."""
        n = y.shape[-1]
        y = y.view(self.phases, self.phase_rows, n)[:, : self.item_rows]
        return y.reshape(self.phases, self.items, self.frames, n).permute(1, 2, 0, 3).reshape(
            self.items, self.frames * self.phases, n)


def paired_gate_columns(w: Tensor, channels: int) -> Tensor:
    """(..., 2C) [tanh columns | sigmoid columns] -> (..., 2 channels) with
    tanh j at column 2j and sigmoid j at 2j + 1, zero columns for the
    channels past C (channels >= C)."""
    c = w.shape[-1] // 2
    pad = [0, channels - c]
    halves = (torch.nn.functional.pad(w[..., :c], pad), torch.nn.functional.pad(w[..., c:], pad))
    return torch.stack(halves, dim=-1).flatten(-2)


if triton is not None:
    @triton.jit
    def _phase_major_source(t, item_base, ok, phase_rows, PHASES: tl.constexpr):
        """The phase-major row of group step t of the item whose rows start at
        item_base (item * frames), clamped to a real row where ``ok`` is False."""
        t = tl.where(ok, t, 0)
        return (t % PHASES).to(tl.int64) * phase_rows + item_base + t // PHASES

    @triton.jit
    def _fast_tanh(x):
        """The GPU's float32 tanh instruction: relative error at most 2^-10.99
        (PTX ISA), under the rounding of the 16-bit activations it feeds."""
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)

    @triton.jit(do_not_specialize=["n_rows", "phase_rows", "item_rows", "frames", "dilation"])
    def _taps_cond_gate_kernel(x_ptr, keep_ptr, win_ptr, wc_ptr, bias_ptr, w_ptr, out_ptr,
                               n_rows, phase_rows, item_rows, frames, dilation, out_stride,
                               C: tl.constexpr, WIN: tl.constexpr, PHASES: tl.constexpr,
                               DOT_PRECISION: tl.constexpr, FAST_TANH: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # One program: a row block (one phase) x BN channels of both halves,
        # paired. K = 3C taps, then WIN window columns against the block's
        # phase's conditioning weights. Column blocks of one row block are
        # neighbours in launch order, so they read the same rows of x from L2.
        pid = tl.program_id(0)
        pid_m = pid // (C // BLOCK_N)
        pid_n = pid % (C // BLOCK_N)
        phase = (pid_m * BLOCK_M) // phase_rows
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows64 = rows.to(tl.int64)
        s = rows - phase * phase_rows                 # item * frames + q
        in_rows = s < item_rows
        item_base = (s // frames).to(tl.int64) * frames
        t = (s % frames) * PHASES + phase
        # tap j reads step t + (j-1)d, present when inside the item and kept
        # (keep is 0 or 1, so "times keep" is a load mask)
        ok_prev = in_rows & (t >= dilation)
        src_prev = _phase_major_source(t - dilation, item_base, ok_prev, phase_rows, PHASES)
        ok_prev = ok_prev & (tl.load(keep_ptr + src_prev, mask=ok_prev, other=0) != 0)
        ok_mid = in_rows & (tl.load(keep_ptr + rows64, mask=in_rows, other=0) != 0)
        ok_next = in_rows & (t + dilation < frames * PHASES)
        src_next = _phase_major_source(t + dilation, item_base, ok_next, phase_rows, PHASES)
        ok_next = ok_next & (tl.load(keep_ptr + src_next, mask=ok_next, other=0) != 0)
        ks = tl.arange(0, BLOCK_K)
        pairs = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
        w_block = w_ptr + ks[:, None] * (2 * C) + pairs[None, :]
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k in range(0, 3 * C, BLOCK_K):            # a block lies inside one tap: C % BLOCK_K == 0
            tap = k // C
            src = tl.where(tap == 0, src_prev, tl.where(tap == 1, rows64, src_next))
            ok = tl.where(tap == 0, ok_prev, tl.where(tap == 1, ok_mid, ok_next))
            a = tl.load(x_ptr + src[:, None] * C + (k - tap * C) + ks[None, :], mask=ok[:, None], other=0.0)
            acc = tl.dot(a, tl.load(w_block + k * (2 * C)), acc, input_precision=DOT_PRECISION)
        # the window operand: row (b, q) of the time-major windows; weights (WIN, P, 2C)
        win_block = win_ptr + s.to(tl.int64)[:, None] * WIN + ks[None, :]
        wc_block = wc_ptr + phase.to(tl.int64) * (2 * C) + ks[:, None] * (PHASES * 2 * C) + pairs[None, :]
        for k in range(0, WIN, BLOCK_K):
            a = tl.load(win_block + k, mask=in_rows[:, None], other=0.0)
            acc = tl.dot(a, tl.load(wc_block + k * (PHASES * 2 * C)), acc, input_precision=DOT_PRECISION)
        acc += tl.load(bias_ptr + pairs).to(tl.float32)[None, :]
        z_tanh, z_sigmoid = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        # The sigmoid is never taken from tanh (0.5 + 0.5 tanh(s/2)): that
        # cancels where s << 0, which is where trained voices hold most of
        # their gates, and sigmoid(-10) = 4.5e-5 lies below the half-precision
        # spacing near 1. tl.sigmoid keeps its relative accuracy there.
        if FAST_TANH:
            tanh = _fast_tanh(z_tanh)
        else:             # tanh(a) = 2 sigmoid(2a) - 1
            tanh = 2.0 * tl.sigmoid(2.0 * z_tanh) - 1.0
        acts = tanh * tl.sigmoid(z_sigmoid)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # every row is stored, dummy rows too (finite values), so no later
        # product reads memory nothing wrote
        tl.store(out_ptr + rows64[:, None] * out_stride + cols[None, :], acts.to(out_ptr.dtype.element_ty),
                 mask=(rows < n_rows)[:, None])

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


# Launch configs: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), by the
# multiple of 64 the channel count is; fixed, they spare every run the
# autotuning (BENCHMARKS.md: the other candidates under tried and lost, the
# start-up saved under what each step bought). Each fits every GPU in
# TARGETS (tests/test_kernel_targets.py). The 128 ones were chosen on H200s
# and trade occupancy for deep pipelines: in 16-bit they take 64-96 KiB of
# shared memory a block, so an RTX-class GPU (100 KiB an SM) runs one at a
# time on an SM.
TAPS_COND_GATE_CONFIGS = {
    128: (128, 128, 32, 8, 4),   # H200: the autotuner's choice at C = 256, the published width, every time it ran
    64: (128, 64, 64, 8, 3),     # any multiple of 64
}
RESIDUAL_CONFIGS = {
    128: (128, 128, 64, 8, 3),   # H200: the autotuner's choice at C = 256
    64: (128, 64, 64, 4, 4),     # any multiple of 64
}
# float32 (the exactness reference, not a speed mode) runs one small tile:
# its dot products are exact FMA loops, slow to compile in large tiles.
FLOAT32_CONFIG = (64, 64, 32, 4, 3)

# One fixed launch config for every kernel, e.g. {"BLOCK_M": 64, "BLOCK_N":
# 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}: for tests under
# Triton's CPU interpreter, which runs one program at a time.
_FIXED_CONFIG: dict | None = None


def launch_config(configs: dict, c: int, dtype: torch.dtype) -> dict:
    """The launch config of a kernel over C channels in ``dtype``: the widest
    of ``configs`` whose blocks tile C (C is a multiple of 64)."""
    if _FIXED_CONFIG is not None:
        return dict(_FIXED_CONFIG)
    block_m, block_n, block_k, warps, stages = (FLOAT32_CONFIG if dtype == torch.float32
                                                else configs[128 if c % 128 == 0 else 64])
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": warps, "num_stages": stages}


# Made once per set of widths (functools.cache): each slice of each flow
# launches both kernels once a layer.
@functools.cache
def taps_cond_gate_launch(dtype: torch.dtype, c: int, win: int, phases: int, fast_tanh: bool,
                          out_stride: int) -> Launch:
    """``taps_cond_gate``'s launch over C channels, a WIN-wide window and
    P phases in ``dtype``, ``out`` of this row stride."""
    cfg = launch_config(TAPS_COND_GATE_CONFIGS, c, dtype)
    return Launch(_taps_cond_gate_kernel, dtype,
                  dict(n_rows=None, phase_rows=None, item_rows=None, frames=None, dilation=None,
                       out_stride=out_stride),
                  dict(C=c, WIN=win, PHASES=phases, DOT_PRECISION=dot_precision(dtype), FAST_TANH=fast_tanh,
                       BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"]),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


@functools.cache
def residual_launch(dtype: torch.dtype, c: int, a_stride: int) -> Launch:
    """``residual_update``'s launch over C channels in ``dtype``, the
    activations of this row stride."""
    cfg = launch_config(RESIDUAL_CONFIGS, c, dtype)
    return Launch(_residual_update_kernel, dtype, dict(n_rows=None, a_stride=a_stride),
                  dict(C=c, DOT_PRECISION=dot_precision(dtype),
                       BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"]),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def _check_widths(*widths: int) -> None:
    for width in widths:
        if width % CHANNELS_MULTIPLE:
            raise ValueError(f"width {width} is not a multiple of {CHANNELS_MULTIPLE}: pad the weights "
                             "(FastWaveGlow does)")


def _check_tiles(launch: Launch, c: int, k_width: int) -> None:
    """The launch's blocks tile C and the K widths exactly, and a row block
    never straddles two phases: the kernels read and write no element
    outside their operands only then."""
    cfg = launch.constexprs
    assert c % cfg["BLOCK_N"] == 0 and c % cfg["BLOCK_K"] == 0 and k_width % cfg["BLOCK_K"] == 0, (cfg, c)
    assert PHASE_ROWS_MULTIPLE % cfg["BLOCK_M"] == 0, cfg


def _grid(n_rows: int, c: int, launch: Launch) -> tuple[int]:
    """Row blocks x column blocks of C, the column blocks innermost."""
    return (triton.cdiv(n_rows, launch.constexprs["BLOCK_M"]) * (c // launch.constexprs["BLOCK_N"]),)


def taps_cond_gate(x: Tensor, keep: Tensor, windows: Tensor, w_cond: Tensor, b_cond: Tensor,
                   w_taps: Tensor, rows: PhaseRows, dilation: int, out: Tensor,
                   fast_tanh: bool = False) -> Tensor:
    """One WN layer's gated activations over phase-major rows (module
    docstring), the conditioning computed inside the product.

    x: (n_rows, C) contiguous, phase-major; keep: (n_rows,) of 0 and 1 (a row
    whose keep is 0 is read as zeros; dummy rows 0); windows: (items *
    frames, WIN) contiguous, time-major (``FastWaveGlow.frame_windows``);
    w_cond: (WIN, P, 2C) contiguous; b_cond: (2C,); w_taps: (3C, 2C)
    contiguous, rows [x(t-d) | x(t) | x(t+d)]; the last dimension of each
    weight and bias paired (``paired_gate_columns``); out: (n_rows, C), row
    stride free (a column block of the (n_rows, L C) activations). C and WIN
    multiples of CHANNELS_MULTIPLE. float32 accumulation; ``fast_tanh``:
    the gate's tanh from the GPU's float32 tanh instruction (16-bit dtypes
    on CUDA; elsewhere exact).
    Every row of ``out`` is written, dummy rows too. Returns ``out``."""
    n, c = x.shape
    win = windows.shape[1]
    _check_widths(c, win)
    assert n == rows.n_rows and keep.shape == (n,) and windows.shape[0] == rows.item_rows
    assert x.is_contiguous() and keep.is_contiguous() and windows.is_contiguous() and w_cond.is_contiguous()
    assert w_taps.is_contiguous() and w_taps.shape == (3 * c, 2 * c)
    assert w_cond.shape == (win, rows.phases, 2 * c) and b_cond.shape == (2 * c,) and b_cond.is_contiguous()
    assert out.stride(1) == 1 and out.shape == (n, c)
    assert x.dtype == w_taps.dtype == w_cond.dtype == windows.dtype
    launch = taps_cond_gate_launch(x.dtype, c, win, rows.phases,
                                   bool(fast_tanh and x.is_cuda and x.dtype != torch.float32), out.stride(0))
    _check_tiles(launch, c, win)
    launch.run(_grid(n, c, launch), x, keep, windows, w_cond, b_cond, w_taps, out,
               n, rows.phase_rows, rows.item_rows, rows.frames, dilation, out.stride(0))
    return out


def residual_update(acts: Tensor, w_res: Tensor, b_res: Tensor, x: Tensor) -> Tensor:
    """x += acts @ w_res + b_res, in place, as one matrix product whose
    epilogue adds the bias and x's tile (float32 accumulation, one rounding).

    acts: (N, C), row stride free (a column block of the activations);
    w_res: (C, C) contiguous; b_res: (C,); x: (N, C) contiguous; C a
    multiple of CHANNELS_MULTIPLE. Returns ``x``."""
    n, c = x.shape
    _check_widths(c)
    assert x.is_contiguous() and w_res.is_contiguous() and b_res.is_contiguous()
    assert acts.shape == (n, c) and acts.stride(1) == 1 and w_res.shape == (c, c) and b_res.shape == (c,)
    assert acts.dtype == w_res.dtype == x.dtype
    launch = residual_launch(x.dtype, c, acts.stride(0))
    _check_tiles(launch, c, c)
    launch.run(_grid(n, c, launch), acts, w_res, b_res, x, n, acts.stride(0))
    return x
