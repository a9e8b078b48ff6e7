"""Tacotron2's decoder step on CUDA in a few Triton launches (``GraphedDecoder``).

* ``attention_step``: one step's whole attention block (query product,
  folded location convolution and dense layer, tanh, energies, masked
  softmax, context, cumulative weights), one program per batch row;
* ``prenet_step``: both prenet layers (product, relu, dropout keep mask,
  twice), each row on its own; the masks given, or drawn in the kernel from
  each row's seed and the step (``StepDropout``), bit for bit as
  ``randomness`` draws them.

And three for graphs of few rows, whose programs each read all of the
weights for their row (at larger batches cuBLAS's products, which read the
weights once for all rows, are faster):

* ``lstm_cell``: an nn.LSTMCell on the concatenation of two inputs, read in
  place, both products and the cell update in one launch;
* ``output_step``: the projection and gate layer in one launch, the frame
  and gate logit written where the caller keeps them;
* ``query_product``: the attention's query product over many programs,
  handed to ``attention_step`` (which then skips its own).

Every kernel masks its loads and stores by the true widths, so any layer
width works; each row is computed on its own, in an order that depends
neither on the batch nor on the padded length, so a line's output does not
depend on the lines beside it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tts_cli.kernels import Launch, dot_precision as _dot_precision, triton
from tts_cli.randomness import MIX_MULTIPLIERS

if triton is not None:
    import triton.language as tl

    MIX_M1, MIX_M2 = (tl.constexpr(m) for m in MIX_MULTIPLIERS)   # randomness.mix32's, for _mix32

# ---------------------------------------------------------------------------
# Tacotron2's attention for one decoder step, in one launch.

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


# Launch shape of attention_step (one program per row), chosen on an H200
# for the published widths:
_ATTENTION_WARPS = 8       # H200: enough threads to hold the memory and W_q tiles in registers
_ATTENTION_BLOCK_T = 32    # H200: positions a block; the location product's rows (tl.dot takes 16 at least)
# In float32 half as many: at 32, Triton 3.6's ptxas spills 464-816 bytes a
# thread of the float32 kernel at odd widths (attention dim 100, 21 taps, an
# encoder 514 wide) on every target; at 16 none spill and a block takes 60
# KiB of shared memory instead of 88 (tests/test_kernel_targets.py).
_ATTENTION_BLOCK_T_FP32 = 16
_ATTENTION_BLOCK_R = 128   # H200: W_q's columns a block: a (128, 128) tile at the published attention dim
_ATTENTION_BLOCK_E = 512   # H200: the published memory width: the context in one pass over T
# The widest tile attention_step serves: (BLOCK_A, BLOCK_J), the attention
# dim and the folded location weight's 2K taps, each rounded up to a power
# of two. The (A, 2K) weight sits whole in shared memory and registers: the
# published (128, 64) tile takes 60 KiB of shared memory in fp32, under the
# 99 KiB an RTX-class GPU gives a block; (256, 64) takes 100 KiB and
# (128, 128) 112 KiB, and in fp32 both spill under Triton 3.6. A wider
# attention runs as the Attention module (decoder_graph.py).
ATTENTION_MAX_TILE = (128, 64)


def _pow2(n: int, at_least: int = 16) -> int:
    return max(at_least, 1 << (n - 1).bit_length())


def attention_launch(dtype: torch.dtype, r: int, a: int, k: int, e: int, t: int,
                     has_query: bool) -> Launch | None:
    """``attention_step``'s launch for these widths (its R, A, K, E and T)
    in ``dtype``; None where its tile is wider than ATTENTION_MAX_TILE."""
    block_a, block_j = _pow2(a), _pow2(2 * k)
    if block_a > ATTENTION_MAX_TILE[0] or block_j > ATTENTION_MAX_TILE[1]:
        return None
    return Launch(_attention_step_kernel, dtype,
                  dict(q_ptr=torch.float32, invalid_ptr=torch.uint8, e_ptr=torch.float32, T=t, E=e),
                  dict(HAS_QUERY=has_query, R=r, A=a, K=k, DOT_PRECISION=_dot_precision(dtype),
                       BLOCK_R=min(_ATTENTION_BLOCK_R, _pow2(r)), BLOCK_A=block_a, BLOCK_J=block_j,
                       BLOCK_T=_ATTENTION_BLOCK_T_FP32 if dtype == torch.float32 else _ATTENTION_BLOCK_T,
                       BLOCK_E=min(_ATTENTION_BLOCK_E, _pow2(e))),
                  num_warps=_ATTENTION_WARPS)


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
    launch = attention_launch(weights.dtype, r, a, k, e, t, query is not None)
    assert launch is not None, f"attention dim {a} with {k} location taps: wider than attention_step serves"
    energies = torch.empty(b, t, dtype=torch.float32, device=memory.device)
    launch.run((b,), ah, w_query, query if query is not None else energies, w_location, weights, weights_cum,
               processed_memory, v, invalid.view(torch.uint8),
               memory, context_out, weights_out, weights_cum_out, energies, t, e)


# ---------------------------------------------------------------------------
# Tacotron2's prenet for one decoder step, in one launch.

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


# Launch shape of query_product, chosen on an H200 at batch 1 (BENCHMARKS.md,
# tried and lost); its W_q blocks are attention_step's (_ATTENTION_BLOCK_R).
_QUERY_WARPS = 8           # H200: the fastest of the shapes swept, 4 warps slower
_QUERY_BLOCK_O = 8         # H200: outputs per program: the query layer (128 x 1,024) spreads over 16 SMs


def query_launch(dtype: torch.dtype, r: int, a: int) -> Launch:
    """``query_product``'s launch for ah (B, R) and W_q (A, R) in ``dtype``."""
    return Launch(_query_product_kernel, dtype, dict(q_ptr=torch.float32),
                  dict(R=r, A=a, BLOCK_O=min(_QUERY_BLOCK_O, _pow2(a, at_least=1)),
                       BLOCK_R=min(_ATTENTION_BLOCK_R, _pow2(r))),
                  num_warps=_QUERY_WARPS)


def query_product(ah: Tensor, w_query: Tensor, out: Tensor) -> Tensor:
    """W_q ah for ``attention_step(..., query=out)``: ah (B, R) and w_query
    (A, R) contiguous, one dtype; out (B, A) float32 contiguous, the values
    ``attention_step`` computes itself. Returns ``out``."""
    b, r = ah.shape
    a = w_query.shape[0]
    assert w_query.shape == (a, r) and out.shape == (b, a) and out.dtype == torch.float32
    assert ah.is_contiguous() and w_query.is_contiguous() and out.is_contiguous() and ah.dtype == w_query.dtype
    launch = query_launch(ah.dtype, r, a)
    launch.run((b, triton.cdiv(a, launch.constexprs["BLOCK_O"])), ah, w_query, out)
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

    # The step offset is not specialized on: Triton would compile offsets 0,
    # 1 and the rest apart, all into the same code.
    @triton.jit(do_not_specialize=["step_offset"])
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


# Launch shape of prenet_step, chosen on an H200 for the published widths:
# each program holds a (BLOCK_O, H1) block of W2 (32 KiB in fp16 at H1 =
# 256) besides all of W1 (40 KiB).
_PRENET_WARPS = 8          # H200: 8 warps hold the (64, H1) block of W2 in registers
_PRENET_BLOCK_K = 32       # H200: W1's input columns per block, so its (H1, 32) tile stays small
_PRENET_BLOCK_O = 64       # H200: at batch 1 four SMs share W2 instead of one streaming all 128 KiB
# The widest first prenet layer prenet_step serves (rounded up to a power of
# two): each program holds the hidden layer and a (BLOCK_O, H1) block of W2
# in registers. At 512 nothing spills; at 1,024 fp32 spills 232-256 bytes a
# thread on every GPU in TARGETS (tests/test_kernel_targets.py). A wider
# prenet runs as the Prenet module.
PRENET_MAX_HIDDEN = 512


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


def prenet_launch(dtype: torch.dtype, k: int, h1: int, h2: int, masks: int, x_stride: int) -> Launch | None:
    """``prenet_step``'s launch for a frame (B, K) of row stride
    ``x_stride`` and layers H1 and H2 wide, in ``dtype``; ``masks`` 0 (none),
    1 (given) or 2 (drawn). None where H1 is wider than PRENET_MAX_HIDDEN."""
    if _pow2(h1) > PRENET_MAX_HIDDEN:
        return None
    drawn = masks == 2     # seeds and step: (B,) and (1,) int64; else unread, and `out` stands in
    return Launch(_prenet_step_kernel, dtype,
                  dict(x_stride=x_stride, seeds_ptr=torch.int64 if drawn else dtype,
                       step_ptr=torch.int64 if drawn else dtype, step_offset=None,
                       P=0.0, SCALE=0.0),     # any float compiles alike
                  dict(K=k, H1=h1, H2=h2, MASKS=masks, BLOCK_K=min(_PRENET_BLOCK_K, _pow2(k)),
                       BLOCK_H1=_pow2(h1), BLOCK_O=min(_PRENET_BLOCK_O, _pow2(h2))),
                  num_warps=_PRENET_WARPS)


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
    launch = prenet_launch(frame.dtype, k, h1, h2, mode, frame.stride(0))
    assert launch is not None, f"a prenet of {h1} hidden units: wider than prenet_step serves"
    launch.run((b, triton.cdiv(h2, launch.constexprs["BLOCK_O"])),
               frame, w1, w2, mask1, mask2, out, frame.stride(0), seeds, step, offset, p, scale)
    return out


# ---------------------------------------------------------------------------
# Tacotron2's LSTM cells for one decoder step, each in one launch
# (graphs of few rows): the attention LSTM on (prenet output,
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


# Launch shape of lstm_cell, chosen on an H200 at batch 1: at H = 1024 a
# cell runs as 1,024 small programs, several per SM, so many weight loads
# are in flight at once, which beats both wider programs and cuBLAS's
# concatenation, two products and cell (BENCHMARKS.md, tried and lost).
_LSTM_WARPS = 4            # H200: small programs, several per SM
_LSTM_BLOCK_J = 1          # H200: one hidden unit (its four gate rows) per program
_LSTM_BLOCK_K = 1024       # H200: the inputs in K blocks of 1,024; 256 was slower


def lstm_launch(dtype: torch.dtype, in_a: int, in_b: int, hidden: int,
                strides: tuple[int, int, int, int]) -> Launch:
    """``lstm_cell``'s launch for inputs I_a and I_b and H hidden units in
    ``dtype``, a, b, h and c read with these row strides."""
    a_stride, b_stride, h_stride, c_stride = strides
    return Launch(_lstm_cell_kernel, dtype,
                  dict(bias_ptr=torch.float32, a_stride=a_stride, b_stride=b_stride, h_stride=h_stride,
                       c_stride=c_stride),
                  dict(IN_A=in_a, IN_B=in_b, H=hidden, BLOCK_J=min(_LSTM_BLOCK_J, _pow2(hidden, at_least=1)),
                       BLOCK_K=min(_LSTM_BLOCK_K, _pow2(max(in_a, in_b, hidden)))),
                  num_warps=_LSTM_WARPS)


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
    strides = (a.stride(0), b.stride(0), h.stride(0), c.stride(0))
    launch = lstm_launch(a.dtype, in_a, in_b, hidden, strides)
    launch.run((rows, triton.cdiv(hidden, launch.constexprs["BLOCK_J"])),
               a, b, h, c, weight, bias, h_out, c_out, *strides)
    return h_out, c_out


# ---------------------------------------------------------------------------
# Tacotron2's projection and gate layer for one decoder step in one launch
# (graphs of few rows): the frame and
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


# Launch shape of output_step, chosen on an H200 at batch 1: the fastest of
# the shapes swept (BENCHMARKS.md, tried and lost).
_OUTPUT_WARPS = 4          # H200: small programs, several per SM
_OUTPUT_BLOCK_O = 2        # H200: 2 outputs per program: the 81 stacked rows spread over 41 programs
_OUTPUT_BLOCK_K = 1024     # H200: the inputs (1,536 wide) in K blocks of 1,024; 256 was slower


def output_launch(dtype: torch.dtype, d: int, e: int, n_out: int, strides: tuple[int, int, int, int]) -> Launch:
    """``output_step``'s launch for inputs D and E wide and n_mel + 1
    stacked outputs in ``dtype``, with these row strides of the decoder
    hidden state, the context, the frame and the gate."""
    dh_stride, ctx_stride, frame_stride, gate_stride = strides
    return Launch(_output_step_kernel, dtype,
                  dict(dh_stride=dh_stride, ctx_stride=ctx_stride, frame_stride=frame_stride,
                       gate_stride=gate_stride),
                  dict(D=d, E=e, N_MEL=n_out - 1, BLOCK_O=min(_OUTPUT_BLOCK_O, _pow2(n_out, at_least=1)),
                       BLOCK_K=min(_OUTPUT_BLOCK_K, _pow2(max(d, e)))),
                  num_warps=_OUTPUT_WARPS)


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
    strides = (decoder_hidden.stride(0), context.stride(0), frame_out.stride(0), gate_out.stride(0))
    launch = output_launch(decoder_hidden.dtype, d, e, n_out, strides)
    launch.run((rows, triton.cdiv(n_out, launch.constexprs["BLOCK_O"])),
               decoder_hidden, context, weight, bias, frame_out, gate_out, *strides)
    return frame_out, gate_out

