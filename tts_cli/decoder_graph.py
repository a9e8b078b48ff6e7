"""Tacotron2's decoder loop, replayed from CUDA graphs.

Eagerly, one decoder step is ~80 small kernels, each paying a Python launch,
so a step's time is launches, about the same whatever the batch. Here K
steps are captured once per (batch, memory length) bucket as one CUDA graph
over static buffers and replayed; the stop test runs on the device inside
the graph and the host reads the "all rows done" flag one replay late,
through a pinned buffer, so it never stalls the queue. The computation is the eager
``tacotron2.decode`` step for step (same masks, same per-line dropout keys).
The decoder's stop rule (``Decoder.stop_rule``) is captured with the steps,
so each rule gets graphs of its own: a rule swapped in later is captured
anew, never replayed as the one before.

Off CUDA the same static-buffer loop runs without capture, so the CPU tests
check this module's bookkeeping (padding rows, stop flags, late reads) against
the eager decoder.

On CUDA with Triton the step's small kernels are fused (``kernels.decoder``):
the attention block (~12 small kernels: query product, location convolution
and dense layer, tanh, energies, masked softmax, context, cumulative add)
and the prenet (2 products, 2 relus, 2 dropout masks drawn in the kernel
from each row's seed and the step) each run as one launch. In graphs of one
row (``few_rows_max_batch``) each LSTM cell (both products and the cell
update, its two inputs read in place) and the projection and gate layer run
as one launch too, and the attention's query product as a launch of its own
over many programs: those kernels' programs each read all of the weights
for their row, so larger batches keep cuBLAS's products, which read them once
for all rows (BENCHMARKS.md, tried and lost). At batch 1 a step is then
eight launches. A part whose kernel does not serve the model's widths
(``kernel_launches``: an attention or prenet wider than the kernels hold)
runs as its module, and ``notices`` says so.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tts_cli import kernels as triton_kernels
from tts_cli.kernels import Launch, decoder as kernels
from tts_cli.tacotron2 import (Attention, AttentionPath, DecodeSettings, Decoded, Decoder, DecoderState,
                               Prenet, Tacotron2, Tacotron2Dims, masks_for_steps)

# A graph's memory length (the batch's symbols) is a multiple of this.
MEMORY_BUCKET = 32


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _batch_bucket(n: int) -> int:
    """Powers of two up to 64, then multiples of 64: few graphs, little padding."""
    return 1 << (n - 1).bit_length() if n <= 64 else _round_up(n, 64)


def kernel_launches(dims: Tacotron2Dims, dtype: torch.dtype) -> dict[str, Launch | None]:
    """Every kernel launch the graph decoder makes for a Tacotron2 of these
    dimensions in ``dtype``, by the part it computes; None for a part whose
    kernel does not serve these widths, which runs as its module. The row
    strides are those of the decoder's buffers (each its width; the gate
    logits' 1); memory lengths are multiples of MEMORY_BUCKET."""
    d = dims
    r, a, e, h = d.attention_rnn_dim, d.attention_dim, d.embedding_dim, d.decoder_rnn_dim
    x = d.prenet_dims[-1]
    launches = {
        "attention": kernels.attention_launch(dtype, r, a, d.location_kernel, e, MEMORY_BUCKET, False),
        "attention after its query product": kernels.attention_launch(dtype, r, a, d.location_kernel, e,
                                                                      MEMORY_BUCKET, True),
        "query product": kernels.query_launch(dtype, r, a),
        "attention LSTM": kernels.lstm_launch(dtype, x, e, r, (x, e, r, r)),
        "decoder LSTM": kernels.lstm_launch(dtype, r, e, h, (r, e, h, h)),
        "projection and gate": kernels.output_launch(dtype, h, e, d.n_mel + 1, (h, e, d.n_mel, 1)),
    }
    if len(d.prenet_dims) == 2:   # the prenet kernel is two layers, as published
        launches["prenet"] = kernels.prenet_launch(dtype, d.n_mel, d.prenet_dims[0], x, 0, d.n_mel)
        launches["prenet drawing its masks"] = kernels.prenet_launch(dtype, d.n_mel, d.prenet_dims[0], x, 2,
                                                                     d.n_mel)
    return launches


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None   # None off CUDA: the steps run eagerly
    memory: Tensor            # (B, T, C)
    processed: Tensor         # (B, T, A)
    invalid: Tensor           # (B, T) bool
    seeds: Tensor             # (B,)
    lengths: Tensor           # (B,) each row's symbols (0 in padding rows), what the stop rule reads
    state: DecoderState
    step: Tensor              # (1,) next step index
    stop_at: Tensor           # (B,) frames per row; max_decoder_steps until it stops
    gated: Tensor             # (B,) bool, the stop rule fired
    all_done: Tensor          # () bool
    mels: Tensor              # (max_steps + K, B, n_mel) decoder frames by step
    frames: Tensor            # (K, B, n_mel) this graph's frames, copied into mels once after its K steps
    gates: Tensor             # (K, B) this graph's gate logits, judged once after its K steps
    offsets: Tensor           # (K,) 0..K-1
    positions: Tensor         # (max_steps + K, B) the attention's peak symbol by step
    peaks: Tensor             # (max_steps + K, B) its weight
    step_positions: Tensor    # (K, B) this graph's, copied into positions once after its K steps
    step_peaks: Tensor        # (K, B)


class _FusedAttention:
    """``Decoder.step``'s attention and cumulative add as one launch of
    ``kernels.attention_step``; the location layer's convolution and dense
    weights are folded into one once, here."""

    def __init__(self, attention: Attention, split_query: bool = False):
        location = attention.location_layer
        self.w_location = kernels.fold_location_weight(location.location_conv.conv.weight,
                                                       location.location_dense.linear_layer.weight)
        self.w_query = attention.query_layer.linear_layer.weight.detach()
        self.v = attention.v.linear_layer.weight.detach().reshape(-1)
        # The query product in a launch of its own, over many programs
        # (``kernels.query_product``): for graphs of few rows.
        self.split_query = split_query

    def __call__(self, query: Tensor, weights: Tensor, weights_cum: Tensor, memory: Tensor,
                 processed_memory: Tensor, invalid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        context = memory.new_empty(memory.shape[0], memory.shape[2])
        new_weights, new_cum = torch.empty_like(weights), torch.empty_like(weights_cum)
        product = None
        if self.split_query:
            product = query.new_empty(query.shape[0], self.w_query.shape[0], dtype=torch.float32)
            kernels.query_product(query, self.w_query, product)
        kernels.attention_step(query, self.w_query, self.w_location, weights, weights_cum,
                               processed_memory, self.v, invalid, memory,
                               context, new_weights, new_cum, query=product)
        return context, new_weights, new_cum


class _FusedPrenet:
    """``Decoder.step``'s prenet (two layers) as one launch of
    ``kernels.prenet_step``."""

    def __init__(self, prenet: Prenet):
        self.w1, self.w2 = (layer.linear_layer.weight.detach().contiguous() for layer in prenet.layers)

    def __call__(self, frame: Tensor, keep_masks: list[Tensor] | kernels.StepDropout | None) -> Tensor:
        out = frame.new_empty(frame.shape[0], self.w2.shape[0])
        return kernels.prenet_step(frame, self.w1, self.w2, keep_masks, out)


class _FusedOutput:
    """``Decoder.step``'s projection (D -> n_mel) and gate layer (D -> 1) as
    one launch of ``kernels.output_step``: their weights and biases stacked
    once, here, into an (n_mel + 1, D + E) weight and an (n_mel + 1,) bias."""

    def __init__(self, decoder: Decoder):
        projection, gate = decoder.linear_projection.linear_layer, decoder.gate_layer.linear_layer
        self.weight = torch.cat((projection.weight, gate.weight)).detach().contiguous()
        self.bias = torch.cat((projection.bias, gate.bias)).detach()

    def into(self, frame_out: Tensor, gate_out: Tensor):
        """The output hook that writes the frame and the gate logit straight
        into ``frame_out`` and ``gate_out`` (no concatenation of its inputs)."""
        def output(decoder_hidden: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
            return kernels.output_step(decoder_hidden, context, self.weight, self.bias, frame_out, gate_out)
        return output


class _FusedLSTMCell:
    """An nn.LSTMCell on cat((a, b), 1) (``Decoder.step``'s ``attention_rnn``
    or ``decoder_rnn`` hook) as one launch of ``kernels.lstm_cell``: its
    weights stored once, here, as one (4H, I + H) matrix [W_ih | W_hh] (a
    copy, in the cell's dtype) and b_ih + b_hh added once in float32 and kept
    in float32."""

    def __init__(self, cell: nn.LSTMCell):
        self.weight, self.bias = kernels.fuse_lstm_weights(cell.weight_ih, cell.weight_hh,
                                                           cell.bias_ih, cell.bias_hh)

    def __call__(self, a: Tensor, b: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        h, c = state
        return kernels.lstm_cell(a, b, h, c, self.weight, self.bias, torch.empty_like(h),
                                 torch.empty_like(c))


@dataclass
class FewRowKernels:
    """The kernels whose programs each read all of the weights for their
    row, so they run only in graphs of at most ``few_rows_max_batch`` rows:
    both LSTM cells, the projection and gate (writing straight into the
    graph's buffers), and the attention with its query product split off."""
    attention_rnn: _FusedLSTMCell
    decoder_rnn: _FusedLSTMCell
    output: _FusedOutput
    attention: _FusedAttention | None   # None: the Attention module runs

    @classmethod
    def for_decoder(cls, decoder: Decoder, attention: bool) -> "FewRowKernels":
        return cls(_FusedLSTMCell(decoder.attention_rnn), _FusedLSTMCell(decoder.decoder_rnn), _FusedOutput(decoder),
                   _FusedAttention(decoder.attention_layer, split_query=True) if attention else None)


class GraphedDecoder:
    """The decoder loop over static buffers, replayed from CUDA graphs on
    CUDA; see the module docstring."""

    # graphs of at most this many rows run the few-row kernels
    few_rows_max_batch = 1

    def __init__(self, model: Tacotron2, cfg: DecodeSettings, steps_per_graph: int | None = None,
                 memory_bucket: int = MEMORY_BUCKET, use_kernels: bool | None = None):
        """``use_kernels``: run the fused Triton kernels (None: where they
        run, on a CUDA device of kernels.TARGETS with Triton; tests pass
        True to run them under Triton's interpreter)."""
        self.model, self.cfg = model, cfg
        # a graph holds the steps between two looks at the stop flag
        self.k, self.memory_bucket = steps_per_graph or cfg.stop_check_every, memory_bucket
        # by (batch bucket, memory bucket, stop rule)
        self.graphs: dict[tuple[int, int, object], _Graph] = {}
        self.on_cuda = next(model.parameters()).is_cuda
        # Captures share one side stream; the eager warm-up passes before a
        # capture (cuBLAS handles and workspaces, Triton's specialization
        # for the batch) run once per batch bucket, not once per graph.
        self._capture_stream = torch.cuda.Stream() if self.on_cuda else None
        self._warmed_batches: set[int] = set()
        self.pool = torch.cuda.graph_pool_handle() if self.on_cuda else None
        self.flag = torch.zeros((), dtype=torch.bool)
        if self.on_cuda:
            self.flag = self.flag.pin_memory()
        if use_kernels is None:
            use_kernels = self.on_cuda and triton_kernels.usable(next(model.parameters()).device)[0]
        decoder = model.decoder
        launches = kernel_launches(model.dims, next(model.parameters()).dtype) if use_kernels else {}
        # None where the modules run instead
        self.attention = _FusedAttention(decoder.attention_layer) if launches.get("attention") else None
        self.prenet = _FusedPrenet(decoder.prenet) if launches.get("prenet") else None
        self.few_rows = (FewRowKernels.for_decoder(decoder, attention=self.attention is not None)
                         if use_kernels else None)
        # One line for each part a kernel would run but for the model's widths.
        d, wide = model.dims, [part for part in ("attention", "prenet") if part in launches and not launches[part]]
        widths = {"attention": f"attention dim {d.attention_dim} by {d.location_kernel} location taps",
                  "prenet": f"first layer {d.prenet_dims[0]} units"}
        self.notices = [f"this Tacotron2's {part} ({widths[part]}) is wider than its GPU kernel serves: "
                        "it runs as the plain module (slower)" for part in wide]

    @torch.inference_mode()
    def decode(self, ids: Tensor, lengths: Tensor, seeds: Tensor) -> Decoded:
        """Same contract as ``tacotron2.decode``."""
        b, t = ids.shape
        memory, invalid = self.model.encode(ids, lengths)
        g = self._graph(_batch_bucket(b), _round_up(t, self.memory_bucket), memory)
        self._load(g, memory, invalid, seeds, lengths)
        steps_run = self._run(g)
        frames = g.stop_at[:b].clamp(max=steps_run)
        n = int(frames.max())
        mel = g.mels[:n, :b].permute(1, 2, 0)
        path = AttentionPath(g.positions[:n, :b].t(), g.peaks[:n, :b].t())
        return Decoded(self.model.postprocess(mel, frames), frames, ~g.gated[:b], path)

    def _run(self, g: _Graph) -> int:
        """Replays until every row has stopped; returns steps run."""
        done_event = torch.cuda.Event() if self.on_cuda else None
        chunks = _round_up(self.cfg.max_decoder_steps, self.k) // self.k
        for chunk in range(chunks):
            if g.graph is not None:
                g.graph.replay()
            else:
                self._steps(g)
            if chunk > 0:               # the previous replay's flag, read one replay late
                if done_event is not None:
                    done_event.synchronize()
                if bool(self.flag):
                    return chunk * self.k
            self.flag.copy_(g.all_done, non_blocking=self.on_cuda)
            if done_event is not None:
                done_event.record()
        return chunks * self.k

    def _load(self, g: _Graph, memory: Tensor, invalid: Tensor, seeds: Tensor, lengths: Tensor) -> None:
        b, t = invalid.shape
        g.memory.zero_()
        g.memory[:b, :t] = memory
        g.invalid.fill_(True)
        g.invalid[:, 0] = False          # padding rows attend to one zero position: no NaN
        g.invalid[:b, :t] = invalid
        g.processed.copy_(self.model.decoder.attention_layer.memory_layer(g.memory))
        g.seeds.zero_()
        g.seeds[:b] = seeds
        g.lengths.zero_()
        g.lengths[:b] = lengths
        for tensor in g.state.tensors():
            tensor.zero_()
        g.step.zero_()
        g.stop_at.fill_(self.cfg.max_decoder_steps)
        g.gated.zero_()
        g.stop_at[b:] = 0                # padding rows count as stopped from the start
        g.gated[b:] = True

    def captured(self, batch: int, symbols: int) -> bool:
        """Whether the graph a batch of this shape replays (under the
        decoder's stop rule now) is captured."""
        return self._key(_batch_bucket(batch), _round_up(symbols, self.memory_bucket)) in self.graphs

    @torch.inference_mode()
    def prepare(self, shapes: set[tuple[int, int]]) -> None:
        """Capture the graphs for these (batch, symbols) shapes now, before other
        threads put work on the GPU (part of start-up, not of the run)."""
        p = next(self.model.parameters())
        like = torch.zeros(1, 1, self.model.dims.embedding_dim, dtype=p.dtype, device=p.device)
        for b, t in shapes:
            self._graph(_batch_bucket(b), _round_up(t, self.memory_bucket), like)

    def _key(self, b: int, t: int) -> tuple[int, int, object]:
        return b, t, self.model.decoder.stop_rule

    def _graph(self, b: int, t: int, like: Tensor) -> _Graph:
        key = self._key(b, t)
        if key not in self.graphs:
            self.graphs[key] = self._capture(b, t, like)
        return self.graphs[key]

    def _capture(self, b: int, t: int, like: Tensor) -> _Graph:
        decoder = self.model.decoder
        memory = like.new_zeros(b, t, like.shape[2])
        g = _Graph(
            graph=torch.cuda.CUDAGraph() if self.on_cuda else None, memory=memory,
            processed=decoder.attention_layer.memory_layer(memory),
            invalid=torch.zeros(b, t, dtype=torch.bool, device=like.device),
            seeds=torch.zeros(b, dtype=torch.long, device=like.device),
            lengths=torch.zeros(b, dtype=torch.long, device=like.device),
            state=decoder.initial_state(memory),
            step=torch.zeros(1, dtype=torch.long, device=like.device),
            stop_at=torch.zeros(b, dtype=torch.long, device=like.device),
            gated=torch.zeros(b, dtype=torch.bool, device=like.device),
            all_done=torch.zeros((), dtype=torch.bool, device=like.device),
            mels=like.new_zeros(self.cfg.max_decoder_steps + self.k, b, self.model.dims.n_mel),
            frames=like.new_zeros(self.k, b, self.model.dims.n_mel),
            gates=like.new_zeros(self.k, b),
            offsets=torch.arange(self.k, device=like.device),
            positions=torch.zeros(self.cfg.max_decoder_steps + self.k, b, dtype=torch.long, device=like.device),
            peaks=like.new_zeros(self.cfg.max_decoder_steps + self.k, b),
            step_positions=torch.zeros(self.k, b, dtype=torch.long, device=like.device),
            step_peaks=like.new_zeros(self.k, b))
        if not self.on_cuda:
            return g
        stream = self._capture_stream
        stream.wait_stream(torch.cuda.current_stream())
        if b not in self._warmed_batches:
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._steps(g)
            self._warmed_batches.add(b)
        torch.cuda.current_stream().wait_stream(stream)
        # thread_local: WaveGlow keeps running on another thread during a capture.
        with torch.cuda.graph(g.graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
            self._steps(g)
        torch.cuda.current_stream().wait_stream(stream)
        return g

    def _steps(self, g: _Graph) -> None:
        """K decoder steps on the static buffers (what the graph records).
        Each step only stores its frame, its gate logit and where its
        attention peaked (one reduction); which rows stopped
        where is worked out once for all K steps (a row runs on after its
        stop either way: its later frames are cut off), which saves ~10 small
        kernels a step."""
        cfg = self.cfg
        state = g.state
        rows = self.few_rows if g.seeds.shape[0] <= self.few_rows_max_batch else None
        attention = rows.attention if rows is not None else self.attention
        if self.prenet is not None:   # the fused prenet draws each step's masks itself
            masks = ([kernels.StepDropout(g.seeds, g.step, j, cfg.prenet_dropout) for j in range(self.k)]
                     if cfg.prenet_dropout > 0 else None)
        else:
            masks = masks_for_steps(g.seeds, g.step, self.k, self.model.dims, cfg.prenet_dropout,
                                    g.memory.dtype)
        for j in range(self.k):
            # the output kernel writes the frame and gate where they are kept
            output = rows.output.into(g.frames[j], g.gates[j]) if rows is not None else None
            state, gate = self.model.decoder.step(
                state, g.memory, g.processed, g.invalid, masks[j] if masks is not None else None,
                attention=attention, prenet=self.prenet, output=output,
                attention_rnn=rows.attention_rnn if rows is not None else None,
                decoder_rnn=rows.decoder_rnn if rows is not None else None)
            if rows is None:
                g.frames[j].copy_(state.frame)
                g.gates[j].copy_(gate)
            torch.max(state.attention_weights, 1, out=(g.step_peaks[j], g.step_positions[j]))
        g.mels.index_copy_(0, g.step + g.offsets, g.frames)
        g.positions.index_copy_(0, g.step + g.offsets, g.step_positions)
        g.peaks.index_copy_(0, g.step + g.offsets, g.step_peaks)
        self._judge_stops(g)
        for static, new in zip(g.state.tensors(), state.tensors()):
            static.copy_(new)
        g.step.add_(self.k)
        g.all_done.copy_((g.stop_at <= g.step).all())

    def _judge_stops(self, g: _Graph) -> None:
        """The K steps' stop verdicts at once: a row stops at the first of
        them where the decoder's stop rule fired (the reference's: its gate),
        if it had not stopped before; that frame is kept, as the reference
        keeps it."""
        cfg = self.cfg
        steps = (g.step + g.offsets)[:, None]                    # (K, 1)
        fired = self.model.decoder.stop_rule(g.gates, steps, g.lengths, cfg) & (steps < cfg.max_decoder_steps)
        first = fired.to(torch.uint8).argmax(0)                  # earliest firing step per row
        newly = fired.any(0) & ~g.gated
        g.stop_at.copy_(torch.where(newly, g.step + first + 1, g.stop_at))
        g.gated.logical_or_(newly)
