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
  by -d, 0 or +d) with the gate in its epilogue (``paired``: the tanh and
  sigmoid columns interleaved, so each tile is one product twice as wide,
  ``kernels_mode="matmul_paired"``; ``persistent``: the same from one or two
  programs per SM, ``kernels_mode="matmul_persistent"``); the gate's
  arithmetic is one of ``GATE_FORMS``;
* ``taps_cond_gate``: the paired product with each layer's conditioning
  inside it (its 4-frame mel window times the row block's phase weights, as
  more K rows), over phase-major rows (``PhaseRows``;
  ``kernels_mode="matmul_fused_cond"``, the default);
* ``residual_update``: x += acts @ W_res + b_res, the add in the epilogue.

And one for Tacotron2's decoder (``GraphedDecoder(..., fused_attention=True)``):

* ``attention_step``: one decoder step's whole attention block (query
  product, folded location convolution and dense layer, tanh, energies,
  masked softmax, context, cumulative weights) in one launch, one program
  per batch row.

And one for its prenet (``GraphedDecoder(..., fused_prenet=True)``):

* ``prenet_step``: both prenet layers (product, relu, dropout keep mask,
  twice) in one launch, each row on its own; the masks given, or drawn in
  the kernel from each row's seed and the step (``StepDropout``), bit for
  bit as ``randomness`` draws them.

And three for graphs of few rows (``GraphedDecoder(..., fused_rnn=True)``),
whose programs each read all of the weights for their row:

* ``lstm_cell``: an nn.LSTMCell on the concatenation of two inputs, read in
  place, both products and the cell update in one launch;
* ``output_step``: the projection and gate layer in one launch, the frame
  and gate logit written where the caller keeps them;
* ``query_product``: the attention's query product over many programs,
  handed to ``attention_step`` (which then skips its own).

``available()`` is False without Triton or CUDA; callers then use plain torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tts_cli.randomness import MIX_MULTIPLIERS

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the plain torch path runs instead
    triton = None


if triton is not None:
    MIX_M1, MIX_M2 = (tl.constexpr(m) for m in MIX_MULTIPLIERS)   # randomness.mix32's, for _mix32


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
    @triton.jit
    def _tap_rows(keep_ptr, pid_m, n_rows, seq_len, dilation, BLOCK_M: tl.constexpr):
        """A row block's indices and, per tap, which rows read a real source
        row: tap j reads row r + (j-1)d, present when inside [0, T) and kept
        (keep is 0 or 1, so "times keep" is a load mask)."""
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows64 = rows.to(tl.int64)
        in_rows = rows < n_rows
        t = rows % seq_len
        ok_prev = in_rows & (t >= dilation)
        ok_prev = ok_prev & (tl.load(keep_ptr + rows64 - dilation, mask=ok_prev, other=0) != 0)
        ok_mid = in_rows & (tl.load(keep_ptr + rows64, mask=in_rows, other=0) != 0)
        ok_next = in_rows & (t + dilation < seq_len)
        ok_next = ok_next & (tl.load(keep_ptr + rows64 + dilation, mask=ok_next, other=0) != 0)
        return rows64, in_rows, ok_prev, ok_mid, ok_next

    @triton.jit
    def _tap_block(x_ptr, rows64, ok_prev, ok_mid, ok_next, k, dilation, C: tl.constexpr,
                   BLOCK_K: tl.constexpr):
        """Columns [k, k + BK) of the taps [x'(t-d) | x'(t) | x'(t+d)] for the
        row block, read from x (a block lies inside one tap: C % BK == 0)."""
        tap = k // C
        ok = tl.where(tap == 0, ok_prev, tl.where(tap == 1, ok_mid, ok_next))
        src = rows64 + (tap - 1) * dilation
        ks = tl.arange(0, BLOCK_K)
        return tl.load(x_ptr + src[:, None] * C + (k - tap * C) + ks[None, :], mask=ok[:, None], other=0.0)

    @triton.jit
    def _tanh_approx(x):
        """The GPU's own tanh (one special-function op, ~2^-11 relative error)."""
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)

    @triton.jit
    def _tanh_approx_pairs(x):
        """The same on float16 pairs: one op per two values."""
        return tl.inline_asm_elementwise("tanh.approx.f16x2 $0, $1;", "=r,r", [x.to(tl.float16)],
                                         dtype=tl.float16, is_pure=True, pack=2).to(tl.float32)

    @triton.jit
    def _cond_tile(cond_ptr, rows64, in_rows, cols, cond_stride, cond_offset, C: tl.constexpr):
        """The layer's conditioning for a tile, read in place: (tanh half, sigmoid half) in float32."""
        mask = in_rows[:, None]
        cond = cond_ptr + rows64[:, None] * cond_stride + cond_offset + cols[None, :]
        return (tl.load(cond, mask=mask, other=0.0).to(tl.float32),
                tl.load(cond + C, mask=mask, other=0.0).to(tl.float32))

    @triton.jit
    def _gate_store(a_in, s_in, out_ptr, rows64, in_rows, cols, out_stride, GATE: tl.constexpr):
        """out = tanh(a_in) * sigmoid(s_in); GATE: GATE_FORMS's index."""
        if GATE == 0:
            acts = (2.0 * tl.sigmoid(2.0 * a_in) - 1.0) * tl.sigmoid(s_in)   # tanh(a) = 2 sigmoid(2a) - 1
        elif GATE == 1:   # sigmoid(s) = (1 + tanh(s / 2)) / 2
            acts = _tanh_approx(a_in) * (0.5 + 0.5 * _tanh_approx(0.5 * s_in))
        else:
            acts = _tanh_approx_pairs(a_in) * (0.5 + 0.5 * _tanh_approx_pairs(0.5 * s_in))
        tl.store(out_ptr + rows64[:, None] * out_stride + cols[None, :],
                 acts.to(out_ptr.dtype.element_ty), mask=in_rows[:, None])

    @triton.jit(do_not_specialize=["n_rows", "seq_len", "dilation"])
    def _taps_gate_kernel(x_ptr, keep_ptr, cond_ptr, w_ptr, out_ptr, n_rows, seq_len, dilation,
                          cond_stride, cond_offset, out_stride,
                          C: tl.constexpr, DOT_PRECISION: tl.constexpr, GATE: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # One program: rows [m, m+BM) x columns [n, n+BN) of both halves of z.
        # Column blocks of one row block are neighbours in launch order, so
        # they read the same rows of x from L2.
        pid = tl.program_id(0)
        pid_m = pid // (C // BLOCK_N)
        pid_n = pid % (C // BLOCK_N)
        rows64, in_rows, ok_prev, ok_mid, ok_next = _tap_rows(keep_ptr, pid_m, n_rows, seq_len, dilation,
                                                              BLOCK_M)
        ks = tl.arange(0, BLOCK_K)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        w_block = w_ptr + ks[:, None] * (2 * C) + cols[None, :]
        acc_tanh = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_sigmoid = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, 3 * C, BLOCK_K):     # K = 3C
            a = _tap_block(x_ptr, rows64, ok_prev, ok_mid, ok_next, k, dilation, C, BLOCK_K)
            w = w_block + k * (2 * C)
            acc_tanh = tl.dot(a, tl.load(w), acc_tanh, input_precision=DOT_PRECISION)
            acc_sigmoid = tl.dot(a, tl.load(w + C), acc_sigmoid, input_precision=DOT_PRECISION)
        cond_tanh, cond_sigmoid = _cond_tile(cond_ptr, rows64, in_rows, cols, cond_stride, cond_offset, C)
        _gate_store(acc_tanh + cond_tanh, acc_sigmoid + cond_sigmoid, out_ptr, rows64, in_rows, cols,
                    out_stride, GATE)

    @triton.jit
    def _taps_gate_paired_tile(x_ptr, keep_ptr, cond_ptr, w_ptr, out_ptr, tile, n_rows, seq_len, dilation,
                               cond_stride, cond_offset, out_stride,
                               C: tl.constexpr, DOT_PRECISION: tl.constexpr, GATE: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """One tile of _taps_gate_kernel's product over weights whose tanh
        and sigmoid columns are paired (column 2j: tanh j, 2j+1: sigmoid j):
        one product of width 2 BN and one accumulator, split in the epilogue.
        (Starting the accumulator from the conditioning instead, read before
        the loop, was slower: H200, run T, 0.553 against 0.496 ms.)"""
        pid_m = tile // (C // BLOCK_N)
        pid_n = tile % (C // BLOCK_N)
        rows64, in_rows, ok_prev, ok_mid, ok_next = _tap_rows(keep_ptr, pid_m, n_rows, seq_len, dilation,
                                                              BLOCK_M)
        ks = tl.arange(0, BLOCK_K)
        pairs = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        w_block = w_ptr + ks[:, None] * (2 * C) + pairs[None, :]
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k in range(0, 3 * C, BLOCK_K):     # K = 3C
            a = _tap_block(x_ptr, rows64, ok_prev, ok_mid, ok_next, k, dilation, C, BLOCK_K)
            acc = tl.dot(a, tl.load(w_block + k * (2 * C)), acc, input_precision=DOT_PRECISION)
        z_tanh, z_sigmoid = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        cond_tanh, cond_sigmoid = _cond_tile(cond_ptr, rows64, in_rows, cols, cond_stride, cond_offset, C)
        _gate_store(z_tanh + cond_tanh, z_sigmoid + cond_sigmoid, out_ptr, rows64, in_rows, cols, out_stride, GATE)

    @triton.jit(do_not_specialize=["n_rows", "seq_len", "dilation"])
    def _taps_gate_paired_kernel(x_ptr, keep_ptr, cond_ptr, w_ptr, out_ptr, n_rows, seq_len, dilation,
                                 cond_stride, cond_offset, out_stride,
                                 C: tl.constexpr, DOT_PRECISION: tl.constexpr, GATE: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # One program per tile.
        _taps_gate_paired_tile(x_ptr, keep_ptr, cond_ptr, w_ptr, out_ptr, tl.program_id(0), n_rows, seq_len,
                               dilation, cond_stride, cond_offset, out_stride, C, DOT_PRECISION, GATE,
                               BLOCK_M, BLOCK_N, BLOCK_K)

    @triton.jit(do_not_specialize=["n_rows", "seq_len", "dilation"])
    def _taps_gate_persistent_kernel(x_ptr, keep_ptr, cond_ptr, w_ptr, out_ptr, n_rows, seq_len, dilation,
                                     cond_stride, cond_offset, out_stride,
                                     C: tl.constexpr, DOT_PRECISION: tl.constexpr, GATE: tl.constexpr,
                                     NUM_SMS: tl.constexpr,
                                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                     FLATTEN: tl.constexpr = False, PER_SM: tl.constexpr = 1):
        # PER_SM programs per SM, each taking every (NUM_SMS PER_SM)-th tile. With
        # FLATTEN the compiler pipelines the tile loop and the K loop as one,
        # so the next tile's first loads are in flight during this tile's
        # epilogue (a program per tile waits for them after it).
        n_tiles = tl.cdiv(n_rows, BLOCK_M) * (C // BLOCK_N)
        for tile in tl.range(tl.program_id(0), n_tiles, NUM_SMS * PER_SM, flatten=FLATTEN):
            _taps_gate_paired_tile(x_ptr, keep_ptr, cond_ptr, w_ptr, out_ptr, tile, n_rows, seq_len,
                                   dilation, cond_stride, cond_offset, out_stride, C, DOT_PRECISION, GATE,
                                   BLOCK_M, BLOCK_N, BLOCK_K)

    @triton.jit(do_not_specialize=["n_rows"])
    def _residual_update_kernel(a_ptr, w_ptr, b_ptr, x_ptr, keep_ptr, n_rows, a_stride, seq_len, pad,
                                C: tl.constexpr, DOT_PRECISION: tl.constexpr, PADDED: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # PADDED: x has ``pad`` zero rows before and after each item of
        # seq_len rows (residual_update_padded); its rows whose keep is 0
        # are stored as 0, so they read as zeros wherever they are taps.
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
        x_rows = rows64
        if PADDED:
            x_rows = rows64 + (2 * (rows64 // seq_len) + 1) * pad
        x = x_ptr + x_rows[:, None] * C + cols[None, :]
        acc += tl.load(x, mask=mask, other=0.0).to(tl.float32)
        if PADDED:
            kept = tl.load(keep_ptr + rows64, mask=rows < n_rows, other=0) != 0
            acc = tl.where(kept[:, None], acc, 0.0)
        tl.store(x, acc.to(x_ptr.dtype.element_ty), mask=mask)

    def _config(block_m, block_n, block_k, warps, stages, **more):
        return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, **more},
                             num_warps=warps, num_stages=stages)

    # Few configs: every one is compiled and timed once per (C, dtypes) at
    # start-up (FastWaveGlow's constructor, ``tune``), inside a 20 s budget,
    # except where MEASURED_BEST already names the winner.
    # Two float32 accumulators per tile: a (128, 128) tile holds 128 KB of
    # them, so narrower column blocks (less register pressure) are tried too.
    # (H200, 2026-11-29: the first six ran at half cuBLAS's speed for the same
    # product; the best was (128, 128, 32, 8 warps, 4 stages).)
    _TAPS_GATE_CONFIGS = [_config(128, 128, 64, 8, 3), _config(128, 128, 64, 8, 4),
                          _config(128, 128, 32, 8, 4), _config(128, 64, 64, 4, 4),
                          _config(64, 128, 64, 4, 4), _config(64, 64, 64, 4, 3),
                          _config(128, 64, 64, 8, 3), _config(128, 64, 32, 8, 5),
                          _config(256, 64, 64, 8, 3), _config(256, 64, 32, 8, 4),
                          _config(128, 32, 64, 4, 4), _config(64, 64, 32, 4, 5)]
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

    def _fitting_or_measured(kernel: str, fitting=_fitting):
        """``fitting`` (``_fitting`` by default), narrowed to the config the
        autotuner chose on the bench's GPU where this GPU kind and C were
        measured (MEASURED_BEST): compiling the others is most of a first
        run's start-up."""
        def prune(configs, named_args, **kwargs):
            fit = fitting(configs, named_args, **kwargs)
            args = {**named_args, **kwargs}
            best = MEASURED_BEST.get((kernel, _capability(args.get("x_ptr")), args.get("C")))
            chosen = [k for k in fit if best is not None and _same_config(k, best)]
            return chosen or fit
        return prune

    _taps_gate_tuned = triton.autotune(_TAPS_GATE_CONFIGS, key=["C"],
                                       prune_configs_by={"early_config_prune": _fitting})(_taps_gate_kernel)
    # One accumulator twice as wide: slow to compile, so few (H200: 16.7 s
    # for all twelve above; (128, 128, 32, 8 warps, 4 stages) was the best).
    _TAPS_GATE_PAIRED_CONFIGS = [_config(128, 128, 32, 8, 4), _config(128, 128, 64, 8, 3),
                                 _config(128, 64, 64, 8, 3), _config(64, 128, 64, 4, 4)]
    _taps_gate_paired_tuned = triton.autotune(
        _TAPS_GATE_PAIRED_CONFIGS, key=["C"],
        prune_configs_by={"early_config_prune": _fitting_or_measured("taps_gate_paired")}
    )(_taps_gate_paired_kernel)
    # Persistent: the paired kernel's two best tiles, the loop flattened or
    # not, and a half-size tile two programs to an SM (one's epilogue beside
    # the other's products). A candidate: the bench measures it as
    # kernels_mode "matmul_persistent" beside the running mode. (H200, run H,
    # median ms over 262,144 rows in that order: 0.528, 0.691, 0.632, 1.107;
    # the paired kernel 0.545; WaveGlow 1.006x.)
    _TAPS_GATE_PERSISTENT_CONFIGS = [_config(128, 128, 32, 8, 4, FLATTEN=False),
                                     _config(128, 128, 32, 8, 4, FLATTEN=True),
                                     _config(128, 128, 64, 8, 3, FLATTEN=True),
                                     _config(128, 64, 64, 4, 3, FLATTEN=True, PER_SM=2)]
    _taps_gate_persistent_tuned = triton.autotune(
        _TAPS_GATE_PERSISTENT_CONFIGS, key=["C"], prune_configs_by={"early_config_prune": _fitting}
    )(_taps_gate_persistent_kernel)
    # Timing a config runs it many times: x is restored after each.
    _residual_update_tuned = triton.autotune(
        _RESIDUAL_CONFIGS, key=["C"], restore_value=["x_ptr"],
        prune_configs_by={"early_config_prune": _fitting_or_measured("residual_update")}
    )(_residual_update_kernel)

# (kernel, GPU compute capability, C) -> the launch config the autotuner chose
# there, every time: on H200s (9, 0) with C = 256, in every bench run on
# separate machines that logged it (2026-11-29, BENCHMARKS.md: the paired
# kernel in runs C-F, the residual one in runs D-F). On a first run its Triton
# cache is empty and compiling all the candidates took 11.1-11.3 s for the
# paired taps+gate kernel and 2.2-2.5 s for the residual one, of a 19.3 s
# start-up; with these alone, 14.0 and 12.2 s (runs G, H). Elsewhere the
# autotuner still chooses. Since the gate is approximate in 16-bit (run S),
# the paired kernel's best is (128, 128, 64, 8 warps, 3 stages): 0.466
# against 0.481 ms for the exact gate's (128, 128, 32, 8, 4), over 262,144
# rows of C = 256 (run U, BENCHMARKS.md, ten configs timed side by side).
# The taps+cond+gate kernel (K = 3C + 320) over 262,144 rows: (128, 128, 32,
# 8 warps, 4 stages) 0.539 ms, (128, 128, 64, 8, 3) 0.614, (128, 64, 64, 8, 3)
# 0.720, (64, 128, 64, 4, 4) 0.843 (run X, 2026-12-01).
MEASURED_BEST = {
    ("taps_cond_gate", (9, 0), 256): {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32,
                                      "num_warps": 8, "num_stages": 4},
    ("taps_gate_paired", (9, 0), 256): {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
                                        "num_warps": 8, "num_stages": 3},
    ("residual_update", (9, 0), 256): {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
                                       "num_warps": 8, "num_stages": 3},
}


def autotune_timings() -> dict:
    """{kernel: {config: median ms}} of every config each autotuned kernel
    last timed in this process (none where one config was all it had)."""
    if triton is None:
        return {}
    tuned = {"taps_gate": _taps_gate_tuned, "taps_gate_paired": _taps_gate_paired_tuned,
             "taps_gate_persistent": _taps_gate_persistent_tuned, "residual_update": _residual_update_tuned,
             "taps_cond_gate": _taps_cond_gate_tuned}
    report = {}
    for name, kernel in tuned.items():
        timings = getattr(kernel, "configs_timings", None) or {}
        if timings:
            report[name] = {str(config): (t[0] if isinstance(t, (list, tuple)) else t)
                            for config, t in timings.items()}
    return report


def compiled_kernels() -> int | None:
    """How many compiled variants of this module's Triton kernels the process
    holds (one per kernel, config and argument specialization). A count that
    grows during a run means a compilation or a load from Triton's disk cache
    happened in it. None where Triton is missing or keeps its caches
    differently."""
    if triton is None:
        return None
    try:
        from triton.runtime.jit import JITFunction
        total = 0
        for value in list(globals().values()):
            while not isinstance(value, JITFunction) and hasattr(value, "fn"):
                value = value.fn   # autotuner, heuristics
            if isinstance(value, JITFunction):
                total += sum(len(caches[0]) for caches in value.device_caches.values())
        return total
    except (ImportError, AttributeError, TypeError, IndexError):
        return None


def _capability(tensor) -> tuple[int, int] | None:
    """The compute capability of the GPU holding ``tensor``; None otherwise."""
    try:
        if tensor is None or tensor.device.type != "cuda":
            return None
        return tuple(torch.cuda.get_device_capability(tensor.device))
    except (AttributeError, RuntimeError, AssertionError):
        return None


def _same_config(config, wanted: dict) -> bool:
    have = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return all(have.get(k) == v for k, v in wanted.items())


# One fixed launch config instead of autotuning, e.g. {"BLOCK_M": 16,
# "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2}: for tests
# under Triton's CPU interpreter, where autotuning would run every config.
_FIXED_CONFIG: dict | None = None


def _launch(tuned, raw, n_rows: int, c: int, *args, sms: int | None = None, **constexprs) -> None:
    """The autotuned kernel ``tuned``, or ``raw`` with _FIXED_CONFIG, over a
    1-D grid: row blocks x column blocks of C, the column blocks innermost;
    with ``sms`` (a persistent kernel, passed as NUM_SMS), PER_SM programs
    per SM, which take the tiles in turn."""
    def grid(meta):
        if sms:
            return (sms * meta.get("PER_SM", 1),)
        return (triton.cdiv(n_rows, meta["BLOCK_M"]) * (c // meta["BLOCK_N"]),)
    if sms:
        constexprs["NUM_SMS"] = sms
    if _FIXED_CONFIG is None:
        tuned[grid](*args, **constexprs)
        return
    cfg = dict(_FIXED_CONFIG)
    assert c % cfg["BLOCK_N"] == 0 and c % cfg["BLOCK_K"] == 0, (c, cfg)
    raw[grid(cfg)](*args, **constexprs, **cfg)


def _multiprocessors(x: Tensor) -> int:
    """The SMs of x's GPU (3 elsewhere: tests under the interpreter)."""
    return torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 3


# The gate's arithmetic in the taps+gate epilogue (``taps_gate(gate=...)``):
# "exact", tanh and sigmoid from exponentials in float32 (two special-function
# ops each); "tanh_approx", the GPU's tanh instruction on float32, sigmoid as
# (1 + tanh(s/2)) / 2 (one op each, relative error ~2^-11, below a float16
# ulp); "tanh_approx_pairs", the same instruction on float16 pairs (one op
# per two values; the inputs rounded to float16 first, as the plain float16
# path rounds z + cond). On an H200 the exact gate took 39 % of the kernel's
# time, either approximate one 31 % (BENCHMARKS.md, runs R-S).
# Float32 (the exactness reference) and Triton's CPU interpreter, which has
# no GPU instructions, always use "exact".
GATE_FORMS = ("exact", "tanh_approx", "tanh_approx_pairs")


def gate_for(gate: str, dtype: torch.dtype) -> str:
    """The gate form that runs for ``gate`` in ``dtype``: "exact" in float32.
    Raises ValueError for a name not in GATE_FORMS."""
    if gate not in GATE_FORMS:
        raise ValueError(f"gate must be one of {GATE_FORMS}, not {gate!r}")
    return "exact" if dtype == torch.float32 else gate


def _gate_index(gate: str, x: Tensor) -> int:
    """GATE for a kernel over x: exact under the interpreter (x on the CPU)."""
    form = gate_for(gate, x.dtype)
    return GATE_FORMS.index(form) if x.is_cuda else 0


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 stays float32 (no TF32); the setting is moot for 16-bit inputs.
    return "ieee" if dtype == torch.float32 else "tf32"


def pair_gate_columns(w_taps: Tensor) -> Tensor:
    """(3C, 2C) taps weights [tanh columns | sigmoid columns] -> the same
    columns paired, tanh j at 2j and sigmoid j at 2j + 1 (``taps_gate(...,
    paired=True)``)."""
    c = w_taps.shape[1] // 2
    return torch.stack((w_taps[:, :c], w_taps[:, c:]), dim=2).reshape(w_taps.shape).contiguous()


def taps_gate(x: Tensor, keep: Tensor, cond: Tensor, layer: int, w_taps: Tensor,
              seq_len: int, dilation: int, out: Tensor, paired: bool = False,
              persistent: bool = False, gate: str = "exact") -> Tensor:
    """One WN layer's gated activations straight from x, without a taps buffer:

        z = [x'(t-d) | x'(t) | x'(t+d)] @ w_taps,   x' = keep * x, zero outside [0, T)
        out = tanh(z[:, :C] + cond[:, 2Ci : 2Ci+C]) * sigmoid(z[:, C:] + cond[:, 2Ci+C : 2C(i+1)])

    x: (N, C) contiguous, rows (item, t) with t = row % seq_len; keep: (N,) of
    0 and 1 (a row whose keep is 0 is read as zeros); cond: (N, 2CL), row
    stride free; w_taps: (3C, 2C) contiguous, rows [x(t-d) | x(t) | x(t+d)];
    out: (N, C), row stride free (a column block of the (N, L*C) activations).
    One matrix product with two float32 accumulators per tile (the tanh and
    the sigmoid columns) and the gate in its epilogue; with ``paired``,
    w_taps is ``pair_gate_columns``'s layout and each tile is one product
    twice as wide, one accumulator split in the epilogue (same sums in the
    same order); ``persistent`` (paired only): the same tiles and sums from
    one or two programs per SM, each looping over tiles; ``gate``: one of
    GATE_FORMS. N is a whole number of items (N % seq_len == 0). C must be
    a multiple of 16. Returns ``out``."""
    n, c = x.shape
    assert x.is_contiguous() and w_taps.is_contiguous() and keep.is_contiguous()
    assert w_taps.shape == (3 * c, 2 * c) and keep.shape == (n,) and c % 16 == 0
    assert n % seq_len == 0   # a partial last item would read past x's end
    assert cond.stride(1) == 1 and out.stride(1) == 1 and out.shape == (n, c)
    assert x.dtype == w_taps.dtype
    assert paired or not persistent
    tuned, raw = ((_taps_gate_persistent_tuned, _taps_gate_persistent_kernel) if persistent
                  else (_taps_gate_paired_tuned, _taps_gate_paired_kernel) if paired
                  else (_taps_gate_tuned, _taps_gate_kernel))
    _launch(tuned, raw, n, c,
            x, keep, cond, w_taps, out, n, seq_len, dilation,
            cond.stride(0), 2 * c * layer, out.stride(0),
            sms=_multiprocessors(x) if persistent else None,
            C=c, DOT_PRECISION=_dot_precision(x.dtype), GATE=_gate_index(gate, x))
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
            acts, w_res, b_res, x, x, n, acts.stride(0), 1, 0,
            C=c, DOT_PRECISION=_dot_precision(x.dtype), PADDED=False)
    return x


def tune(c: int, dtype: torch.dtype, device: torch.device, rows: int = 1 << 18,
         paired: bool = False, persistent: bool = False, fused_cond=None, gate: str = "exact") -> None:
    """Autotune ``taps_gate`` (its ``paired`` or ``persistent`` form; with
    ``fused_cond``, a flow's FastWaveGlow weights: ``taps_cond_gate`` over
    their shapes instead) and ``residual_update`` for width ``c`` and
    ``dtype`` on scratch tensors of ``rows`` rows (autotuning keys on C and
    the dtypes only, so this choice holds for every later call: tuning on
    the first real call instead could pick a tile for a tiny warm-up batch).
    ``gate``: the form that will run, so that the variant compiled here is
    the one used (each GATE is a compilation of its own: on an H200 the
    taps+cond+gate kernel took 8-9 s each, 2026-12-01)."""
    if _FIXED_CONFIG is not None:
        return
    x = torch.randn(rows, c, device=device).to(dtype)
    keep = torch.ones(rows, device=device, dtype=dtype)
    w_taps = (torch.randn(3 * c, 2 * c, device=device) / (3 * c) ** 0.5).to(dtype)
    out = torch.empty(rows, c, device=device, dtype=dtype)
    if fused_cond is not None:
        phases, win = fused_cond.phase_cond[0].shape[:2]
        layout = PhaseRows(items=1, frames=rows // phases, phases=phases)
        windows = torch.randn(layout.item_rows, win, device=device).to(dtype)
        taps_cond_gate(x, keep, windows, fused_cond.phase_cond[0], fused_cond.phase_cond_bias[0],
                       pair_gate_columns(w_taps), layout, dilation=1, out=out, gate=gate)
    else:
        cond = torch.randn(rows, 2 * c, device=device).to(dtype)
        taps_gate(x, keep, cond, 0, pair_gate_columns(w_taps) if paired else w_taps, seq_len=1024, dilation=1,
                  out=out, paired=paired, persistent=persistent, gate=gate)
    w_res = (torch.randn(c, c, device=device) / c ** 0.5).to(dtype)
    residual_update(out, w_res, torch.zeros(c, device=device, dtype=dtype), x)


# ---------------------------------------------------------------------------
# The taps+gate product over item-padded rows (kernels_mode="matmul_padded"):
# with ``pad`` zero rows before and after each item (pad >= the largest
# dilation) and x's rows past each item's length kept at zero, the shifted
# rows of x are plain tiles: the tensor memory accelerator loads them with no
# masks (rows before the first or past the last come back as zeros).

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:   # no Triton, or one without host-side tensor descriptors
    TensorDescriptor = None

if triton is not None:
    @triton.jit
    def _unpadded_rows(r_pad, n_pad_rows, seq_len, pad):
        """Padded row -> (its unpadded row, whether it is one of an item's steps)."""
        span = seq_len + 2 * pad
        t = r_pad % span - pad
        inside = (t >= 0) & (t < seq_len) & (r_pad < n_pad_rows)
        return (r_pad // span).to(tl.int64) * seq_len + t, inside

    @triton.jit(do_not_specialize=["n_pad_rows", "seq_len", "pad", "dilation"])
    def _taps_gate_padded_kernel(x_desc, w_desc, cond_ptr, out_ptr, n_pad_rows, seq_len, pad, dilation,
                                 cond_stride, cond_offset, out_stride,
                                 C: tl.constexpr, DOT_PRECISION: tl.constexpr, GATE: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # As _taps_gate_paired_kernel, over padded rows of x: A tiles come
        # straight from the descriptor, shifted by (tap - 1) * dilation rows.
        pid = tl.program_id(0)
        pid_m = pid // (C // BLOCK_N)
        pid_n = pid % (C // BLOCK_N)
        m0 = pid_m * BLOCK_M
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k in range(0, 3 * C, BLOCK_K):     # K = 3C; a block lies inside one tap
            tap = k // C
            a = x_desc.load([m0 + (tap - 1) * dilation, k - tap * C])
            acc = tl.dot(a, w_desc.load([k, pid_n * 2 * BLOCK_N]), acc, input_precision=DOT_PRECISION)
        z_tanh, z_sigmoid = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        rows64, inside = _unpadded_rows(m0 + tl.arange(0, BLOCK_M), n_pad_rows, seq_len, pad)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cond_tanh, cond_sigmoid = _cond_tile(cond_ptr, rows64, inside, cols, cond_stride, cond_offset, C)
        _gate_store(z_tanh + cond_tanh, z_sigmoid + cond_sigmoid, out_ptr, rows64, inside, cols, out_stride, GATE)

# One launch shape, not autotuned: descriptors carry their block shapes. A
# 128 x 256 tile (the paired tanh and sigmoid columns) as cuBLAS's, 3 stages
# of 48 KiB; float32 (exactness, not speed) in small tiles.
_PADDED_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
_PADDED_FLOAT32_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}


def padded_available() -> bool:
    return available() and TensorDescriptor is not None


def taps_gate_padded(x_pad: Tensor, cond: Tensor, layer: int, w_paired: Tensor, seq_len: int,
                     pad: int, dilation: int, out: Tensor, gate: str = "exact") -> Tensor:
    """``taps_gate(..., paired=True)`` over item-padded rows:

    x_pad: (B * (seq_len + 2 pad), C) contiguous, each item's seq_len rows
    after ``pad`` zero rows and before ``pad`` more, its rows past the
    item's length zero (dilation <= pad); cond: (B * seq_len, 2CL) and out:
    (B * seq_len, C), unpadded rows, row stride free; w_paired:
    ``pair_gate_columns``'s (3C, 2C). Same sums in the same order as
    ``taps_gate``. Returns ``out``."""
    n_pad, c = x_pad.shape
    assert x_pad.is_contiguous() and w_paired.is_contiguous() and w_paired.shape == (3 * c, 2 * c)
    assert dilation <= pad and n_pad % (seq_len + 2 * pad) == 0 and out.shape[0] * (seq_len + 2 * pad) \
        == n_pad * seq_len
    assert cond.stride(1) == 1 and out.stride(1) == 1 and x_pad.dtype == w_paired.dtype
    cfg = dict(_FIXED_CONFIG or (_PADDED_FLOAT32_CONFIG if x_pad.dtype == torch.float32 else _PADDED_CONFIG))
    assert c % cfg["BLOCK_N"] == 0 and c % cfg["BLOCK_K"] == 0, (c, cfg)
    x_desc = TensorDescriptor.from_tensor(x_pad, [cfg["BLOCK_M"], cfg["BLOCK_K"]])
    w_desc = TensorDescriptor.from_tensor(w_paired, [cfg["BLOCK_K"], 2 * cfg["BLOCK_N"]])
    grid = (triton.cdiv(n_pad, cfg["BLOCK_M"]) * (c // cfg["BLOCK_N"]),)
    _taps_gate_padded_kernel[grid](x_desc, w_desc, cond, out, n_pad, seq_len, pad, dilation,
                                   cond.stride(0), 2 * c * layer, out.stride(0),
                                   C=c, DOT_PRECISION=_dot_precision(x_pad.dtype),
                                   GATE=_gate_index(gate, x_pad), **cfg)
    return out


def residual_update_padded(acts: Tensor, w_res: Tensor, b_res: Tensor, x_pad: Tensor, keep: Tensor,
                           seq_len: int, pad: int) -> Tensor:
    """``residual_update`` into item-padded x (``taps_gate_padded``'s
    layout): x_pad's row of unpadded row r += acts[r] @ w_res + b_res, and
    stored as 0 where keep[r] is 0 (keep: (B * seq_len,), 0 or 1). Returns
    ``x_pad``."""
    n, c = acts.shape
    assert x_pad.is_contiguous() and keep.is_contiguous() and keep.shape == (n,)
    assert x_pad.shape[0] * seq_len == n * (seq_len + 2 * pad) and acts.stride(1) == 1
    _launch(_residual_update_tuned, _residual_update_kernel, n, c,
            acts, w_res, b_res, x_pad, keep, n, acts.stride(0), seq_len, pad,
            C=c, DOT_PRECISION=_dot_precision(x_pad.dtype), PADDED=True)
    return x_pad


# ---------------------------------------------------------------------------
# The taps+gate product with the conditioning inside it
# (kernels_mode="matmul_fused_cond"), over phase-major rows.
#
# The folded conditioning (waveglow_fast.py) gives group step t = 32q + p of
# an item the product of mel frames q-3..q (a window of WIN = 4 x 80 values)
# with phase p's weights. Written out, it is 2CL values per row (8 KiB in
# float16) that every layer's epilogue reads back. Here each layer's share of
# it is K rows more of the dilated convolution's product instead: every
# tile's rows must then share one phase, so the rows are phase-major, row
# p * R + (item * F + q) for group step 32q + p (R: item rows rounded up to a
# whole number of row blocks, the rest dummy rows that nothing reads). A
# shifted tap t +- d of a tile is still one phase for all its rows.

# The row count of a phase block is a multiple of this, so no row block
# straddles two phases: every config's BLOCK_M must divide it.
PHASE_ROWS_MULTIPLE = 128

if triton is not None:
    @triton.jit
    def _phase_major_source(t, item_base, ok, phase_rows, PHASES: tl.constexpr):
        """The phase-major row of group step t of the item whose rows start at
        item_base (item * frames), clamped to a real row where ``ok`` is False."""
        t = tl.where(ok, t, 0)
        return (t % PHASES).to(tl.int64) * phase_rows + item_base + t // PHASES

    @triton.jit(do_not_specialize=["n_rows", "phase_rows", "item_rows", "frames", "dilation"])
    def _taps_cond_gate_kernel(x_ptr, keep_ptr, win_ptr, wc_ptr, bias_ptr, w_ptr, out_ptr,
                               n_rows, phase_rows, item_rows, frames, dilation, out_stride,
                               C: tl.constexpr, WIN: tl.constexpr, PHASES: tl.constexpr,
                               DOT_PRECISION: tl.constexpr, GATE: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # One program: a row block (one phase) x BN channels of both halves,
        # paired as in _taps_gate_paired_tile. K = 3C taps, then WIN window
        # columns against the tile's phase's conditioning weights.
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
        for k in range(0, 3 * C, BLOCK_K):            # a block lies inside one tap
            tap = k // C
            src = tl.where(tap == 0, src_prev, tl.where(tap == 1, rows64, src_next))
            ok = tl.where(tap == 0, ok_prev, tl.where(tap == 1, ok_mid, ok_next))
            a = tl.load(x_ptr + src[:, None] * C + (k - tap * C) + ks[None, :], mask=ok[:, None], other=0.0)
            acc = tl.dot(a, tl.load(w_block + k * (2 * C)), acc, input_precision=DOT_PRECISION)
        win_block = win_ptr + s.to(tl.int64)[:, None] * WIN + ks[None, :]
        wc_block = wc_ptr + phase.to(tl.int64) * (WIN * 2 * C) + ks[:, None] * (2 * C) + pairs[None, :]
        for k in range(0, WIN, BLOCK_K):
            a = tl.load(win_block + k, mask=in_rows[:, None], other=0.0)
            acc = tl.dot(a, tl.load(wc_block + k * (2 * C)), acc, input_precision=DOT_PRECISION)
        z_tanh, z_sigmoid = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        bias_tanh = tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        bias_sigmoid = tl.load(bias_ptr + C + cols).to(tl.float32)[None, :]
        # every row is stored, dummy rows too (finite values), so no later
        # product reads memory nothing wrote
        _gate_store(z_tanh + bias_tanh, z_sigmoid + bias_sigmoid, out_ptr, rows64, rows < n_rows, cols,
                    out_stride, GATE)

    def _fitting_phase_blocks(configs, named_args, **kwargs):
        """``_fitting``, and K blocks that tile the window too."""
        win = {**named_args, **kwargs}["WIN"]
        fit = [k for k in _fitting(configs, named_args, **kwargs) if win % k.kwargs["BLOCK_K"] == 0]
        return fit or [_FLOAT32_CONFIG]

    # The paired kernel's candidates, BLOCK_M <= PHASE_ROWS_MULTIPLE.
    _taps_cond_gate_tuned = triton.autotune(
        _TAPS_GATE_PAIRED_CONFIGS, key=["C", "WIN"],
        prune_configs_by={"early_config_prune": _fitting_or_measured("taps_cond_gate", _fitting_phase_blocks)}
    )(_taps_cond_gate_kernel)


@dataclass(frozen=True)
class PhaseRows:
    """Where a batch's rows lie in the phase-major layout: ``items`` items of
    ``frames`` frames, ``phases`` group steps per frame, each phase's block
    of ``phase_rows`` rows (items * frames real ones, then dummy ones)."""
    items: int
    frames: int
    phases: int

    @property
    def item_rows(self) -> int:
        return self.items * self.frames

    @property
    def phase_rows(self) -> int:
        return -(-self.item_rows // PHASE_ROWS_MULTIPLE) * PHASE_ROWS_MULTIPLE

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


def pair_phase_conditioning(cond: Tensor, layer: int, phases: int, layers: int) -> Tensor:
    """FlowWeights.cond (WIN, P * 2CL: phase-major columns, each phase's
    [layer 0 tanh | layer 0 sigmoid | layer 1 ...]) -> layer ``layer``'s
    (P, WIN, 2C), its tanh and sigmoid columns paired (``pair_gate_columns``)."""
    win = cond.shape[0]
    per_layer = cond.view(win, phases, layers, -1)[:, :, layer].permute(1, 0, 2)   # (P, WIN, 2C)
    return pair_gate_columns(per_layer.reshape(phases * win, -1)).view(phases, win, -1)


def taps_cond_gate(x: Tensor, keep: Tensor, windows: Tensor, w_cond: Tensor, b_cond: Tensor,
                   w_paired: Tensor, rows: PhaseRows, dilation: int, out: Tensor,
                   gate: str = "exact") -> Tensor:
    """One WN layer's gated activations over phase-major rows (``PhaseRows``),
    the conditioning computed inside the product:

        z = [x'(t-d) | x'(t) | x'(t+d) | window(q)] @ [w_taps ; w_cond[p]] + b_cond,   t = 32q + p
        out = tanh(z[:, :C]) * sigmoid(z[:, C:])

    x: (n_rows, C) contiguous, phase-major; keep: (n_rows,) of 0 and 1 (a row
    whose keep is 0 is read as zeros; dummy rows 0); windows: (items *
    frames, WIN) contiguous, time-major (``FastWaveGlow.frame_windows``);
    w_cond: (P, WIN, 2C) contiguous, paired (``pair_phase_conditioning``);
    b_cond: (2C,), [tanh | sigmoid], not paired; w_paired: (3C, 2C),
    ``pair_gate_columns``'s layout; out: (n_rows, C), row stride free. Every
    row of ``out`` is written, dummy rows too. Returns ``out``."""
    n, c = x.shape
    win = windows.shape[1]
    assert n == rows.n_rows and keep.shape == (n,) and windows.shape[0] == rows.item_rows
    assert x.is_contiguous() and keep.is_contiguous() and windows.is_contiguous() and w_cond.is_contiguous()
    assert w_paired.is_contiguous() and w_paired.shape == (3 * c, 2 * c) and c % 16 == 0
    assert w_cond.shape == (rows.phases, win, 2 * c) and b_cond.shape == (2 * c,) and b_cond.is_contiguous()
    assert out.stride(1) == 1 and out.shape == (n, c)
    assert x.dtype == w_paired.dtype == w_cond.dtype == windows.dtype
    if _FIXED_CONFIG is not None:
        assert PHASE_ROWS_MULTIPLE % _FIXED_CONFIG["BLOCK_M"] == 0 and win % _FIXED_CONFIG["BLOCK_K"] == 0
    _launch(_taps_cond_gate_tuned, _taps_cond_gate_kernel, n, c,
            x, keep, windows, w_cond, b_cond, w_paired, out,
            n, rows.phase_rows, rows.item_rows, rows.frames, dilation, out.stride(0),
            C=c, WIN=win, PHASES=rows.phases, DOT_PRECISION=_dot_precision(x.dtype), GATE=_gate_index(gate, x))
    return out


# ---------------------------------------------------------------------------
# Tacotron2's attention for one decoder step, in one launch (GraphedDecoder
# with fused_attention=True).

if triton is not None:
    @triton.jit
    def _matrix_times_row(w_ptr, x_ptr, outs, in_outs, N_IN: tl.constexpr,
                          BLOCK_OUT: tl.constexpr, BLOCK_IN: tl.constexpr):
        """Rows ``outs`` of W (row-major, N_IN wide) times the vector at
        x_ptr, in float32, over input blocks in a fixed order (the result of
        one batch row does not depend on the others)."""
        acc = tl.zeros((BLOCK_OUT,), dtype=tl.float32)
        for i0 in range(0, N_IN, BLOCK_IN):
            i = i0 + tl.arange(0, BLOCK_IN)
            in_i = i < N_IN
            x = tl.load(x_ptr + i, mask=in_i, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + outs[:, None] * N_IN + i[None, :], mask=in_outs[:, None] & in_i[None, :],
                        other=0.0).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
        return acc

    @triton.jit
    def _attention_step_kernel(ah_ptr, wq_ptr, q_ptr, wloc_ptr, w_ptr, cum_ptr, pm_ptr, v_ptr, invalid_ptr,
                               mem_ptr, ctx_ptr, w_out_ptr, cum_out_ptr, e_ptr, T, E,
                               HAS_QUERY: tl.constexpr, R: tl.constexpr, A: tl.constexpr, K: tl.constexpr,
                               DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr,
                               BLOCK_A: tl.constexpr, BLOCK_J: tl.constexpr,
                               BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
        # One program per batch row; every loop runs over fixed blocks in a
        # fixed order, so a row's result does not depend on the batch. Blocks
        # past the row's last valid position add exact zeros (or -inf to the
        # max), so it does not depend on the padded length T either.
        row = tl.program_id(0).to(tl.int64)
        a = tl.arange(0, BLOCK_A)
        in_a = a < A

        if HAS_QUERY:   # W_q @ ah, computed by query_product
            q = tl.load(q_ptr + row * A + a, mask=in_a, other=0.0)
        else:
            q = _matrix_times_row(wq_ptr, ah_ptr + row * R, a, in_a, R, BLOCK_A, BLOCK_R)
        v = tl.load(v_ptr + a, mask=in_a, other=0.0).to(tl.float32)

        # The location convolution and dense layer, folded: column j = c*K + k
        # of a (BLOCK_T, 2K) window holds channel c (0: weights, 1: cumulative
        # weights) at t + k - K//2, zero outside [0, T) as conv1d pads.
        j = tl.arange(0, BLOCK_J)
        in_j = j < 2 * K
        w_loc = tl.load(wloc_ptr + a[None, :] * (2 * K) + j[:, None],
                        mask=in_j[:, None] & in_a[None, :], other=0.0)          # (2K, A)
        shift = (j % K - K // 2)[None, :]
        from_cum = (j >= K)[None, :]
        row_t = row * T

        # Pass 1: energies e_t = v . tanh(q + location_t + processed_t), -inf
        # where invalid, stored (float32) for the next passes; and their max.
        e_max = tl.full((BLOCK_T,), float("-inf"), dtype=tl.float32)
        for t0 in range(0, T, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            in_t = t < T
            src = t[:, None] + shift
            inside = in_j[None, :] & (src >= 0) & (src < T)
            window = (tl.load(w_ptr + row_t + src, mask=inside & ~from_cum, other=0.0)
                      + tl.load(cum_ptr + row_t + src, mask=inside & from_cum, other=0.0))
            location = tl.dot(window, w_loc, input_precision=DOT_PRECISION)   # (BLOCK_T, A) fp32
            pm = tl.load(pm_ptr + (row_t + t[:, None]) * A + a[None, :],
                         mask=in_t[:, None] & in_a[None, :], other=0.0).to(tl.float32)
            hidden = q[None, :] + location + pm
            tanh = 2.0 * tl.sigmoid(2.0 * hidden) - 1.0
            e = tl.sum(tanh * v[None, :], axis=1)
            invalid = tl.load(invalid_ptr + row_t + t, mask=in_t, other=1) != 0
            e = tl.where(invalid, float("-inf"), e)
            tl.store(e_ptr + row_t + t, e, mask=in_t)
            e_max = tl.maximum(e_max, e)
        m = tl.max(e_max, axis=0)
        tl.debug_barrier()   # the energies, stored by some threads, are read by others

        # Pass 2: context = sum_t p_t memory_t / sum_t p_t with p_t = exp(e_t - m),
        # over E in blocks (one at E <= 512), each summing the same p_t again.
        total = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for e0 in range(0, E, BLOCK_E):
            cols = e0 + tl.arange(0, BLOCK_E)
            in_e = cols < E
            acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
            total = tl.zeros((BLOCK_T,), dtype=tl.float32)
            for t0 in range(0, T, BLOCK_T):
                t = t0 + tl.arange(0, BLOCK_T)
                in_t = t < T
                p = tl.exp(tl.load(e_ptr + row_t + t, mask=in_t, other=float("-inf")) - m)
                total += p
                mem = tl.load(mem_ptr + (row_t + t[:, None]) * E + cols[None, :],
                              mask=in_t[:, None] & in_e[None, :], other=0.0).to(tl.float32)
                acc += tl.sum(p[:, None] * mem, axis=0)
            tl.store(ctx_ptr + row * E + cols, (acc / tl.sum(total, axis=0)).to(ctx_ptr.dtype.element_ty),
                     mask=in_e)
        s = tl.sum(total, axis=0)

        # Pass 3: the weights, and the cumulative weights + the weights as
        # stored (rounded to their dtype first, as the module path adds them).
        for t0 in range(0, T, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            in_t = t < T
            p = tl.exp(tl.load(e_ptr + row_t + t, mask=in_t, other=float("-inf")) - m)
            w = (p / s).to(w_out_ptr.dtype.element_ty)
            tl.store(w_out_ptr + row_t + t, w, mask=in_t)
            cum = tl.load(cum_ptr + row_t + t, mask=in_t, other=0.0).to(tl.float32) + w.to(tl.float32)
            tl.store(cum_out_ptr + row_t + t, cum.to(cum_out_ptr.dtype.element_ty), mask=in_t)


# Launch shape of attention_step (one program per row): 8 warps hold a
# (BLOCK_T, 512) tile of memory and a (128, 128) tile of W_q in registers.
_ATTENTION_WARPS, _ATTENTION_BLOCK_T, _ATTENTION_BLOCK_R, _ATTENTION_BLOCK_E = 8, 32, 128, 512


def _pow2(n: int, at_least: int = 16) -> int:
    return max(at_least, 1 << (n - 1).bit_length())


def fold_location_weight(conv_weight: Tensor, dense_weight: Tensor) -> Tensor:
    """Tacotron2's location layer (conv1d 2 -> F, no bias; then linear F -> A,
    no bias) as one (A, 2, K) convolution weight: both are linear, so
    dense(conv(x)) = conv(x) with dense.weight @ conv.weight over F. Computed
    in float32, returned in the weights' dtype."""
    f, two, k = conv_weight.shape
    folded = dense_weight.detach().float() @ conv_weight.detach().float().reshape(f, two * k)
    return folded.reshape(-1, two, k).to(conv_weight.dtype).contiguous()


def attention_step(ah: Tensor, w_query: Tensor, w_location: Tensor, weights: Tensor,
                   weights_cum: Tensor, processed_memory: Tensor, v: Tensor, invalid: Tensor,
                   memory: Tensor, context_out: Tensor, weights_out: Tensor,
                   weights_cum_out: Tensor, query: Tensor | None = None) -> None:
    """Tacotron2's location-sensitive attention for one decoder step, in one
    launch (inference only):

        e = v . tanh(W_q ah + conv(stack(weights, weights_cum), w_location) + processed_memory)
        weights_out = softmax(e masked with -inf where invalid, over T)
        context_out = weights_out @ memory;  weights_cum_out = weights_cum + weights_out

    ah: (B, R); w_query: (A, R); w_location: (A, 2, K) (``fold_location_weight``),
    zero-padded at both ends like conv1d(padding=K//2); weights, weights_cum:
    (B, T); processed_memory: (B, T, A); v: (A,); invalid: (B, T) bool;
    memory: (B, T, E). Outputs (B, E), (B, T), (B, T), distinct from the
    inputs. All contiguous; one dtype for ah, the weights and w_location.
    float32 accumulation throughout; each row is computed on its own, in an
    order that depends neither on B nor on T past the row's valid positions.

    ``query``: W_q ah already computed by ``query_product`` ((B, A) float32,
    the same values bitwise), so the product is spread over many programs
    instead of one per row (at batch 1 it was most of the launch)."""
    b, r = ah.shape
    a, two, k = w_location.shape
    t, e = memory.shape[1:]
    assert two == 2 and k % 2 == 1 and w_query.shape == (a, r) and v.numel() == a
    assert weights.shape == weights_cum.shape == invalid.shape == (b, t)
    assert processed_memory.shape == (b, t, a) and memory.shape[0] == b
    assert context_out.shape == (b, e) and weights_out.shape == weights_cum_out.shape == (b, t)
    assert weights.dtype == weights_cum.dtype == w_location.dtype
    tensors = (ah, w_query, w_location, weights, weights_cum, processed_memory, v, invalid, memory,
               context_out, weights_out, weights_cum_out)
    assert all(x.is_contiguous() for x in tensors)
    assert weights_out.data_ptr() not in (weights.data_ptr(), weights_cum.data_ptr())
    if query is not None:
        assert query.shape == (b, a) and query.dtype == torch.float32 and query.is_contiguous()
    energies = torch.empty(b, t, dtype=torch.float32, device=memory.device)
    _attention_step_kernel[(b,)](
        ah, w_query, query if query is not None else energies, w_location, weights, weights_cum,
        processed_memory, v, invalid.view(torch.uint8),
        memory, context_out, weights_out, weights_cum_out, energies, t, e,
        HAS_QUERY=query is not None, R=r, A=a, K=k, DOT_PRECISION=_dot_precision(weights.dtype),
        BLOCK_R=min(_ATTENTION_BLOCK_R, _pow2(r)), BLOCK_A=_pow2(a), BLOCK_J=_pow2(2 * k),
        BLOCK_T=_ATTENTION_BLOCK_T, BLOCK_E=min(_ATTENTION_BLOCK_E, _pow2(e)),
        num_warps=_ATTENTION_WARPS)


# ---------------------------------------------------------------------------
# Tacotron2's prenet for one decoder step, in one launch (GraphedDecoder with
# fused_prenet=True).

if triton is not None:
    @triton.jit
    def _query_product_kernel(ah_ptr, wq_ptr, q_ptr, R: tl.constexpr, A: tl.constexpr,
                              BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr):
        # Program (row, o): query outputs o*BLOCK_O .. o*BLOCK_O + BLOCK_O - 1,
        # in _attention_step_kernel's order (the same BLOCK_R), so bitwise its q.
        row = tl.program_id(0).to(tl.int64)
        outs = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        in_outs = outs < A
        q = _matrix_times_row(wq_ptr, ah_ptr + row * R, outs, in_outs, R, BLOCK_O, BLOCK_R)
        tl.store(q_ptr + row * A + outs, q, mask=in_outs)


# Launch shape of query_product: 8 outputs per program, so at batch 1 the
# query layer (128 x 1,024: 256 KiB in fp16) spreads over 16 SMs; 8 warps:
# 2.0 us on an H200 in fp16, against 3.1 with 4 (run V, seven shapes timed).
_QUERY_WARPS, _QUERY_BLOCK_O = 8, 8


def query_product(ah: Tensor, w_query: Tensor, out: Tensor) -> Tensor:
    """W_q ah for ``attention_step(..., query=out)``: ah (B, R) and w_query
    (A, R) contiguous, one dtype; out (B, A) float32 contiguous, the values
    ``attention_step`` computes itself. Returns ``out``."""
    b, r = ah.shape
    a = w_query.shape[0]
    assert w_query.shape == (a, r) and out.shape == (b, a) and out.dtype == torch.float32
    assert ah.is_contiguous() and w_query.is_contiguous() and out.is_contiguous() and ah.dtype == w_query.dtype
    block_o = min(_QUERY_BLOCK_O, _pow2(a, at_least=1))
    _query_product_kernel[(b, triton.cdiv(a, block_o))](
        ah, w_query, out, R=r, A=a, BLOCK_O=block_o, BLOCK_R=min(_ATTENTION_BLOCK_R, _pow2(r)),
        num_warps=_QUERY_WARPS)
    return out


if triton is not None:
    @triton.jit
    def _mix32(x):
        # randomness.mix32 on int64 holding 32-bit values (the same masks
        # and shifts, so the same bits on any backend and in the interpreter)
        x = x ^ (x >> 16)
        x = (x * MIX_M1) & 0xFFFFFFFF
        x = x ^ (x >> 15)
        x = (x * MIX_M2) & 0xFFFFFFFF
        return x ^ (x >> 16)

    @triton.jit
    def _dropout_keep(seed, step, stream, units, P, SCALE):
        # randomness.dropout_keep for one row at one step: SCALE where the
        # unit's uniform is >= P, else 0 (float32)
        key = _mix32(_mix32(_mix32(seed & 0xFFFFFFFF) ^ stream) ^ (step & 0xFFFFFFFF))
        bits = _mix32(key ^ units.to(tl.int64))
        uniform = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        return tl.where(uniform >= P, SCALE, 0.0)

    @triton.jit
    def _prenet_step_kernel(x_ptr, w1_ptr, w2_ptr, m1_ptr, m2_ptr, out_ptr, x_stride,
                            seeds_ptr, step_ptr, step_offset, P, SCALE,
                            K: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr,
                            MASKS: tl.constexpr, BLOCK_K: tl.constexpr,
                            BLOCK_H1: tl.constexpr, BLOCK_O: tl.constexpr):
        # Program (row, o): the row's whole first layer (every program of the
        # row computes the same h, in the same order), then outputs
        # o*BLOCK_O .. o*BLOCK_O + BLOCK_O - 1 of the second. Nothing depends
        # on the batch: a row's result is the same in any batch, bitwise.
        # MASKS: 0 none, 1 read from m1_ptr and m2_ptr, 2 drawn here from the
        # row's seed and the step (streams 1 and 2, as prenet_keep_masks).
        row = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, BLOCK_H1)
        in_j = j < H1
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        in_o = o < H2
        if MASKS == 2:
            seed = tl.load(seeds_ptr + row)
            step = tl.load(step_ptr) + step_offset

        # h = relu(W1 x) * keep1, float32, kept in registers (never rounded)
        h = tl.maximum(_matrix_times_row(w1_ptr, x_ptr + row * x_stride, j, in_j, K, BLOCK_H1, BLOCK_K), 0.0)
        if MASKS == 1:
            h = h * tl.load(m1_ptr + row * H1 + j, mask=in_j, other=0.0).to(tl.float32)
        if MASKS == 2:
            h = h * _dropout_keep(seed, step, 1, j, P, SCALE)

        # y = relu(W2 h) * keep2 for this program's block of outputs
        w = tl.load(w2_ptr + o[:, None] * H1 + j[None, :], mask=in_o[:, None] & in_j[None, :],
                    other=0.0).to(tl.float32)
        y = tl.maximum(tl.sum(w * h[None, :], axis=1), 0.0)
        if MASKS == 1:
            y = y * tl.load(m2_ptr + row * H2 + o, mask=in_o, other=0.0).to(tl.float32)
        if MASKS == 2:
            y = y * _dropout_keep(seed, step, 2, o, P, SCALE)
        tl.store(out_ptr + row * H2 + o, y.to(out_ptr.dtype.element_ty), mask=in_o)


# Launch shape of prenet_step: programs of 8 warps, each with a (64, H1)
# block of W2 (32 KiB in fp16 at H1 = 256) besides all of W1 (40 KiB), so at
# batch 1 four SMs share the second layer's weights instead of one streaming
# all 128 KiB. A block as wide as H2 gives one program per row.
_PRENET_WARPS, _PRENET_BLOCK_K, _PRENET_BLOCK_O = 8, 32, 64


@dataclass(frozen=True)
class StepDropout:
    """The prenet's dropout keep masks for one decoder step, to be drawn
    inside ``prenet_step`` as ``tacotron2.prenet_keep_masks`` draws them: each
    row's seed (B,) int64, the step as ``step`` (a (1,) int64 device tensor,
    so a CUDA graph replays at any step) + ``offset``, and the drop rate."""
    seeds: Tensor
    step: Tensor
    offset: int
    p: float


def prenet_step(frame: Tensor, w1: Tensor, w2: Tensor, masks: list[Tensor] | StepDropout | None,
                out: Tensor) -> Tensor:
    """Tacotron2's two-layer prenet for one decoder step, in one launch
    (inference only):

        out = relu(W2 (relu(W1 frame) * mask1)) * mask2

    frame: (B, K), row stride free (e.g. a view of a wider buffer); w1:
    (H1, K) and w2: (H2, H1), contiguous (nn.Linear's weights, no bias);
    masks: the per-row dropout keep masks already scaled by 1/(1-p), [(B, H1),
    (B, H2)] contiguous; or a ``StepDropout`` to draw the same masks here
    (no mask kernels); or None (no dropout); out: (B, H2) contiguous. One
    dtype for frame, the weights and given masks. float32 accumulation, the
    hidden layer kept in float32, one rounding at the output; each row is
    computed on its own, in an order that does not depend on B. Returns
    ``out``."""
    b, k = frame.shape
    h1, h2 = w1.shape[0], w2.shape[0]
    assert w1.shape == (h1, k) and w2.shape == (h2, h1) and out.shape == (b, h2)
    assert frame.stride(1) == 1 and w1.is_contiguous() and w2.is_contiguous() and out.is_contiguous()
    assert frame.dtype == w1.dtype == w2.dtype
    mask1 = mask2 = out                   # unread unless MASKS == 1
    seeds, step, offset, p, scale = out, out, 0, 0.0, 0.0   # unread unless MASKS == 2
    if isinstance(masks, StepDropout):
        assert masks.seeds.shape == (b,) and masks.step.numel() == 1 and 0.0 < masks.p < 1.0
        seeds, step, offset, p = masks.seeds, masks.step, masks.offset, masks.p
        # the keep value as randomness.dropout_keep makes it and .to(dtype) rounds it
        scale = float(torch.tensor(1.0 / (1.0 - p), dtype=torch.float32).to(frame.dtype))
    elif masks is not None:
        mask1, mask2 = masks
        assert mask1.shape == (b, h1) and mask2.shape == (b, h2)
        assert mask1.is_contiguous() and mask2.is_contiguous()
    mode = 0 if masks is None else 2 if isinstance(masks, StepDropout) else 1
    block_o = min(_PRENET_BLOCK_O, _pow2(h2))
    _prenet_step_kernel[(b, triton.cdiv(h2, block_o))](
        frame, w1, w2, mask1, mask2, out, frame.stride(0), seeds, step, offset, p, scale,
        K=k, H1=h1, H2=h2, MASKS=mode,
        BLOCK_K=min(_PRENET_BLOCK_K, _pow2(k)), BLOCK_H1=_pow2(h1), BLOCK_O=block_o,
        num_warps=_PRENET_WARPS)
    return out


# ---------------------------------------------------------------------------
# Tacotron2's LSTM cells for one decoder step, each in one launch
# (GraphedDecoder with fused_rnn=True): the attention LSTM on (prenet output,
# attention context) and the decoder LSTM on (attention hidden, context),
# with no concatenation, both products and the cell update in one kernel.

if triton is not None:
    @triton.jit
    def _gate_rows_times_segment(w_ptr, x_ptr, col0, j, in_j, acc_i, acc_f, acc_g, acc_o,
                                 N: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                                 BLOCK_K: tl.constexpr):
        """Adds columns col0 .. col0 + N - 1 of the four gate rows (j, H + j,
        2H + j, 3H + j) of W (row-major, K wide) times the N-vector at x_ptr
        to the four float32 accumulators, over input blocks in a fixed order."""
        for k0 in range(0, N, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            in_k = k < N
            x = tl.load(x_ptr + k, mask=in_k, other=0.0).to(tl.float32)[None, :]
            tile = w_ptr + j[:, None] * K + (col0 + k)[None, :]
            mask = in_j[:, None] & in_k[None, :]
            acc_i += tl.sum(tl.load(tile, mask=mask, other=0.0).to(tl.float32) * x, axis=1)
            acc_f += tl.sum(tl.load(tile + H * K, mask=mask, other=0.0).to(tl.float32) * x, axis=1)
            acc_g += tl.sum(tl.load(tile + 2 * H * K, mask=mask, other=0.0).to(tl.float32) * x, axis=1)
            acc_o += tl.sum(tl.load(tile + 3 * H * K, mask=mask, other=0.0).to(tl.float32) * x, axis=1)
        return acc_i, acc_f, acc_g, acc_o

    @triton.jit
    def _lstm_cell_kernel(a_ptr, b_ptr, h_ptr, c_ptr, w_ptr, bias_ptr, h_out_ptr, c_out_ptr,
                          a_stride, b_stride, h_stride, c_stride,
                          IN_A: tl.constexpr, IN_B: tl.constexpr, H: tl.constexpr,
                          BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
        # Program (row, j-block): the four gate rows of hidden units
        # j*BLOCK_J .. j*BLOCK_J + BLOCK_J - 1, over a, then b, then h (the
        # columns of W = [W_ih | W_hh]), each in blocks of BLOCK_K in a fixed
        # order; then the cell update in registers. Nothing depends on the
        # batch: a row's result is the same in any batch, bitwise.
        row = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
        in_j = j < H
        K: tl.constexpr = IN_A + IN_B + H
        acc_i = tl.zeros((BLOCK_J,), dtype=tl.float32)
        acc_f = tl.zeros((BLOCK_J,), dtype=tl.float32)
        acc_g = tl.zeros((BLOCK_J,), dtype=tl.float32)
        acc_o = tl.zeros((BLOCK_J,), dtype=tl.float32)
        acc_i, acc_f, acc_g, acc_o = _gate_rows_times_segment(
            w_ptr, a_ptr + row * a_stride, 0, j, in_j, acc_i, acc_f, acc_g, acc_o, IN_A, H, K, BLOCK_K)
        acc_i, acc_f, acc_g, acc_o = _gate_rows_times_segment(
            w_ptr, b_ptr + row * b_stride, IN_A, j, in_j, acc_i, acc_f, acc_g, acc_o, IN_B, H, K, BLOCK_K)
        acc_i, acc_f, acc_g, acc_o = _gate_rows_times_segment(
            w_ptr, h_ptr + row * h_stride, IN_A + IN_B, j, in_j, acc_i, acc_f, acc_g, acc_o, H, H, K, BLOCK_K)

        # The folded bias (float32), then the cell update, all in float32.
        i = tl.sigmoid(acc_i + tl.load(bias_ptr + j, mask=in_j, other=0.0))
        f = tl.sigmoid(acc_f + tl.load(bias_ptr + H + j, mask=in_j, other=0.0))
        g = 2.0 * tl.sigmoid(2.0 * (acc_g + tl.load(bias_ptr + 2 * H + j, mask=in_j, other=0.0))) - 1.0
        o = tl.sigmoid(acc_o + tl.load(bias_ptr + 3 * H + j, mask=in_j, other=0.0))
        c = tl.load(c_ptr + row * c_stride + j, mask=in_j, other=0.0).to(tl.float32)
        c_new = f * c + i * g
        h_new = o * (2.0 * tl.sigmoid(2.0 * c_new) - 1.0)
        tl.store(c_out_ptr + row * H + j, c_new.to(c_out_ptr.dtype.element_ty), mask=in_j)
        tl.store(h_out_ptr + row * H + j, h_new.to(h_out_ptr.dtype.element_ty), mask=in_j)


# Launch shape of lstm_cell: one hidden unit per program (its four gate
# rows), programs of 4 warps, the inputs in K blocks of 1,024: at batch 1 and
# H = 1024 a cell runs as 1,024 small programs, several per SM, so many
# weight loads are in flight at once. On an H200 in fp16 (run V, 2026-11-30,
# 20 launches replayed from a graph) that took the attention LSTM's cell
# from 10.9 us (8 units per program, K blocks of 256) to 7.0, and the
# decoder LSTM's from 11.6 to 7.4 (cuBLAS's concatenation, two products and
# cell: 11.2 and 12.7); fourteen shapes were timed.
_LSTM_WARPS, _LSTM_BLOCK_J, _LSTM_BLOCK_K = 4, 1, 1024


def fuse_lstm_weights(weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor | None,
                      bias_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    """An nn.LSTMCell's parameters as ``lstm_cell`` reads them: W = [W_ih |
    W_hh], (4H, I + H) contiguous, in the weights' dtype; and b_ih + b_hh,
    (4H,), added in float32 and kept in float32 (zeros without biases)."""
    four_h = weight_hh.shape[0]
    weight = torch.cat((weight_ih.detach(), weight_hh.detach()), 1).contiguous()
    bias = torch.zeros(four_h, dtype=torch.float32, device=weight.device)
    for b in (bias_ih, bias_hh):
        if b is not None:
            bias = bias + b.detach().float()
    return weight, bias


def _lstm_cell_shapes(a: Tensor, b: Tensor, h: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
                      h_out: Tensor, c_out: Tensor) -> tuple[int, int, int, int]:
    """Checks the arguments of ``lstm_cell``; returns (B, I_a, I_b, H)."""
    rows, in_a = a.shape
    in_b, hidden = b.shape[1], h.shape[1]
    assert b.shape[0] == h.shape[0] == c.shape[0] == rows and c.shape[1] == hidden
    assert weight.shape == (4 * hidden, in_a + in_b + hidden) and bias.shape == (4 * hidden,)
    assert h_out.shape == c_out.shape == (rows, hidden)
    assert all(x.stride(1) == 1 for x in (a, b, h, c))
    assert weight.is_contiguous() and bias.is_contiguous() and h_out.is_contiguous() and c_out.is_contiguous()
    assert a.dtype == b.dtype == h.dtype == c.dtype == weight.dtype == h_out.dtype == c_out.dtype
    assert bias.dtype == torch.float32
    assert h_out.data_ptr() not in (a.data_ptr(), b.data_ptr(), h.data_ptr(), c.data_ptr())
    assert c_out.data_ptr() not in (a.data_ptr(), b.data_ptr(), h.data_ptr(), c.data_ptr())
    return rows, in_a, in_b, hidden


def lstm_cell(a: Tensor, b: Tensor, h: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
              h_out: Tensor, c_out: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM cell step on the input cat(a, b), in one launch (inference
    only), without the concatenation:

        gates = W @ cat(a, b, h) + bias          (i, f, g, o: PyTorch's order)
        c_out = sigmoid(f) * c + sigmoid(i) * tanh(g);  h_out = sigmoid(o) * tanh(c_out)

    a: (B, I_a), b: (B, I_b), h: (B, H), c: (B, H), each with a free row
    stride (e.g. a view of a wider buffer), unit column stride; weight: (4H,
    I_a + I_b + H) contiguous, bias: (4H,) float32 (``fuse_lstm_weights``);
    h_out, c_out: (B, H) contiguous, distinct from the inputs (every program
    of a row reads all of h). One dtype for a, b, h, c, the weight and the
    outputs. float32 accumulation and cell update, c_out rounded once and
    h_out computed from the unrounded c_out; each row is computed on its own,
    in an order that does not depend on B. Returns (h_out, c_out)."""
    rows, in_a, in_b, hidden = _lstm_cell_shapes(a, b, h, c, weight, bias, h_out, c_out)
    block_j = min(_LSTM_BLOCK_J, _pow2(hidden, at_least=1))
    _lstm_cell_kernel[(rows, triton.cdiv(hidden, block_j))](
        a, b, h, c, weight, bias, h_out, c_out, a.stride(0), b.stride(0), h.stride(0), c.stride(0),
        IN_A=in_a, IN_B=in_b, H=hidden, BLOCK_J=block_j,
        BLOCK_K=min(_LSTM_BLOCK_K, _pow2(max(in_a, in_b, hidden))), num_warps=_LSTM_WARPS)
    return h_out, c_out


# ---------------------------------------------------------------------------
# Tacotron2's projection and gate layer for one decoder step in one launch
# (GraphedDecoder with fused_rnn=True, in graphs of few rows): the frame and
# the gate logit from the decoder's hidden state and the context, read in
# place, written straight where the graph keeps them.

if triton is not None:
    @triton.jit
    def _rows_times_segment(w_ptr, x_ptr, col0, outs, in_outs, acc, N: tl.constexpr,
                            W_STRIDE: tl.constexpr, BLOCK_K: tl.constexpr):
        """Adds columns col0 .. col0 + N - 1 of rows ``outs`` of W (row-major,
        W_STRIDE wide) times the N-vector at x_ptr to the float32 ``acc``,
        over input blocks in a fixed order."""
        for k0 in range(0, N, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            in_k = k < N
            x = tl.load(x_ptr + k, mask=in_k, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + outs[:, None] * W_STRIDE + (col0 + k)[None, :],
                        mask=in_outs[:, None] & in_k[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
        return acc

    @triton.jit
    def _output_step_kernel(dh_ptr, ctx_ptr, w_ptr, bias_ptr, frame_ptr, gate_ptr,
                            dh_stride, ctx_stride, frame_stride, gate_stride,
                            D: tl.constexpr, E: tl.constexpr, N_MEL: tl.constexpr,
                            BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr):
        # Program (row, o): outputs o*BLOCK_O .. o*BLOCK_O + BLOCK_O - 1 of
        # the stacked [projection; gate] rows; output N_MEL is the gate logit.
        # Nothing depends on the batch: a row's result is the same in any
        # batch, bitwise.
        row = tl.program_id(0).to(tl.int64)
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        in_o = o < N_MEL + 1
        acc = tl.zeros((BLOCK_O,), dtype=tl.float32)
        acc = _rows_times_segment(w_ptr, dh_ptr + row * dh_stride, 0, o, in_o, acc, D, D + E, BLOCK_K)
        acc = _rows_times_segment(w_ptr, ctx_ptr + row * ctx_stride, D, o, in_o, acc, E, D + E, BLOCK_K)
        y = acc + tl.load(bias_ptr + o, mask=in_o, other=0.0).to(tl.float32)
        tl.store(frame_ptr + row * frame_stride + o, y.to(frame_ptr.dtype.element_ty), mask=o < N_MEL)
        tl.store(gate_ptr + row * gate_stride + (o - N_MEL), y.to(gate_ptr.dtype.element_ty), mask=o == N_MEL)


# Launch shape of output_step: 2 outputs per program, K blocks of 1,024, so
# at batch 1 the 81 stacked rows (1,536 wide) spread over 41 programs: 2.2 us
# on an H200 in fp16, against 3.5 with 8 outputs and K blocks of 256 (run V,
# eight shapes timed).
_OUTPUT_WARPS, _OUTPUT_BLOCK_O, _OUTPUT_BLOCK_K = 4, 2, 1024


def output_step(decoder_hidden: Tensor, context: Tensor, weight: Tensor, bias: Tensor,
                frame_out: Tensor, gate_out: Tensor) -> tuple[Tensor, Tensor]:
    """Tacotron2's projection and gate layer on cat(decoder_hidden, context)
    for one decoder step, in one launch, without the concatenation:

        frame_out = W[:n_mel] @ x + bias[:n_mel];  gate_out = W[n_mel] @ x + bias[n_mel]

    decoder_hidden: (B, D), context: (B, E), frame_out: (B, n_mel), gate_out:
    (B,), each with a free row stride, unit column stride; weight: (n_mel + 1,
    D + E) contiguous and bias: (n_mel + 1,), the two layers stacked
    (projection rows first). One dtype for the inputs, the weight and the
    outputs. float32 accumulation, the bias added in float32, one rounding;
    each row is computed on its own, in an order that does not depend on B.
    Returns (frame_out, gate_out)."""
    rows, d = decoder_hidden.shape
    e = context.shape[1]
    n_out = weight.shape[0]
    assert context.shape[0] == rows and weight.shape == (n_out, d + e) and bias.shape == (n_out,)
    assert frame_out.shape == (rows, n_out - 1) and gate_out.shape == (rows,)
    assert decoder_hidden.stride(1) == context.stride(1) == frame_out.stride(1) == 1
    assert weight.is_contiguous() and bias.is_contiguous()
    assert decoder_hidden.dtype == context.dtype == weight.dtype == frame_out.dtype == gate_out.dtype
    block_o = min(_OUTPUT_BLOCK_O, _pow2(n_out, at_least=1))
    _output_step_kernel[(rows, triton.cdiv(n_out, block_o))](
        decoder_hidden, context, weight, bias, frame_out, gate_out, decoder_hidden.stride(0),
        context.stride(0), frame_out.stride(0), gate_out.stride(0), D=d, E=e, N_MEL=n_out - 1,
        BLOCK_O=block_o, BLOCK_K=min(_OUTPUT_BLOCK_K, _pow2(max(d, e))), num_warps=_OUTPUT_WARPS)
    return frame_out, gate_out

