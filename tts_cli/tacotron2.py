"""Tacotron2: symbol ids -> mel spectrogram, batched, with masking that makes a
line's output independent of the other lines in its batch.

The module tree and parameter names are NVIDIA/tacotron2's, so a checkpoint's
``state_dict`` loads as is; every dimension is read from the tensors
(``Tacotron2Dims.from_state_dict``). No I/O happens here.

Batched == alone (tests/test_tacotron2.py) needs, beyond the usual padding
mask: padded positions zeroed before every encoder convolution, a packed
encoder LSTM, masked attention scores, each row stopping on its own verdict
(``Decoder.stop_rule``), and frames past a row's stop zeroed before and
between the postnet convolutions.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tts_cli import randomness
from tts_cli.decode_rules import DecodeSettings, gate_stops


@dataclass(frozen=True)
class Tacotron2Dims:
    n_symbols: int
    embedding_dim: int           # also the encoder's width
    encoder_convs: int
    encoder_kernel: int
    n_mel: int
    prenet_dims: tuple[int, ...]
    attention_rnn_dim: int
    decoder_rnn_dim: int
    attention_dim: int
    location_filters: int
    location_kernel: int
    postnet_convs: int
    postnet_dim: int
    postnet_kernel: int

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor]) -> "Tacotron2Dims":
        n_symbols, embedding_dim = sd["embedding.weight"].shape
        enc_conv = sd["encoder.convolutions.0.0.conv.weight"]
        prenet = [sd[k] for k in sorted(k for k in sd if k.startswith("decoder.prenet.layers."))]
        loc_conv = sd["decoder.attention_layer.location_layer.location_conv.conv.weight"]
        post_conv = sd["postnet.convolutions.0.0.conv.weight"]
        return cls(
            n_symbols=n_symbols,
            embedding_dim=embedding_dim,
            encoder_convs=_count(sd, "encoder.convolutions.", ".0.conv.weight"),
            encoder_kernel=enc_conv.shape[2],
            n_mel=prenet[0].shape[1],
            prenet_dims=tuple(w.shape[0] for w in prenet),
            attention_rnn_dim=sd["decoder.attention_rnn.weight_hh"].shape[1],
            decoder_rnn_dim=sd["decoder.decoder_rnn.weight_hh"].shape[1],
            attention_dim=sd["decoder.attention_layer.query_layer.linear_layer.weight"].shape[0],
            location_filters=loc_conv.shape[0],
            location_kernel=loc_conv.shape[2],
            postnet_convs=_count(sd, "postnet.convolutions.", ".0.conv.weight"),
            postnet_dim=post_conv.shape[0],
            postnet_kernel=post_conv.shape[2],
        ).checked()

    def checked(self) -> "Tacotron2Dims":
        """These dimensions, or ValueError naming what no Tacotron2 can run:
        its convolutions keep the length only with odd kernels (padding
        (k-1)/2 on each side), and its bidirectional encoder LSTM gives each
        direction half the width."""
        for name in ("encoder_kernel", "location_kernel", "postnet_kernel"):
            if getattr(self, name) % 2 == 0:
                raise ValueError(f"{name} is {getattr(self, name)}; Tacotron2's convolutions need odd kernels")
        if self.embedding_dim % 2:
            raise ValueError(f"embedding_dim is {self.embedding_dim}; the bidirectional encoder needs it even")
        return self


def _count(sd: dict[str, Tensor], prefix: str, suffix: str) -> int:
    return sum(1 for k in sd if k.startswith(prefix) and k.endswith(suffix))


# Holders whose only job is to give parameters NVIDIA's names
# (``...conv.weight``, ``...linear_layer.weight``).
class ConvNorm(nn.Module):
    def __init__(self, n_in: int, n_out: int, kernel: int, bias: bool = True):
        super().__init__()
        self.conv = nn.Conv1d(n_in, n_out, kernel, padding=(kernel - 1) // 2, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class LinearNorm(nn.Module):
    def __init__(self, n_in: int, n_out: int, bias: bool = True):
        super().__init__()
        self.linear_layer = nn.Linear(n_in, n_out, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_layer(x)


def conv_bn(n_in: int, n_out: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(ConvNorm(n_in, n_out, kernel), nn.BatchNorm1d(n_out))


class Encoder(nn.Module):
    def __init__(self, d: Tacotron2Dims):
        super().__init__()
        width = d.embedding_dim
        self.convolutions = nn.ModuleList(
            conv_bn(width, width, d.encoder_kernel) for _ in range(d.encoder_convs))
        self.lstm = nn.LSTM(width, width // 2, batch_first=True, bidirectional=True)

    def forward(self, x: Tensor, lengths: Tensor, valid: Tensor) -> Tensor:
        # x: (B, C, T) embedded symbols; valid: (B, T) bool
        keep = valid.unsqueeze(1).to(x.dtype)
        for conv in self.convolutions:
            x = F.relu(conv(x * keep))
        packed = nn.utils.rnn.pack_padded_sequence(
            x.transpose(1, 2), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[2])
        return out  # (B, T, C), zeros past each length


class Prenet(nn.Module):
    def __init__(self, d: Tacotron2Dims):
        super().__init__()
        sizes = (d.n_mel,) + d.prenet_dims
        self.layers = nn.ModuleList(
            LinearNorm(n_in, n_out, bias=False) for n_in, n_out in zip(sizes, sizes[1:]))

    def forward(self, x: Tensor, keep_masks: list[Tensor] | None) -> Tensor:
        # The reference keeps dropout on at inference; keep_masks (already scaled
        # by 1/(1-p)) come from per-line seeds so a line's output is batch-independent.
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x))
            if keep_masks is not None:
                x = x * keep_masks[i]
        return x


class LocationLayer(nn.Module):
    def __init__(self, d: Tacotron2Dims):
        super().__init__()
        self.location_conv = ConvNorm(2, d.location_filters, d.location_kernel, bias=False)
        self.location_dense = LinearNorm(d.location_filters, d.attention_dim, bias=False)

    def forward(self, weights_cat: Tensor) -> Tensor:
        # weights_cat: (B, 2, T) -> (B, T, attention_dim)
        return self.location_dense(self.location_conv(weights_cat).transpose(1, 2))


class Attention(nn.Module):
    def __init__(self, d: Tacotron2Dims):
        super().__init__()
        self.query_layer = LinearNorm(d.attention_rnn_dim, d.attention_dim, bias=False)
        self.memory_layer = LinearNorm(d.embedding_dim, d.attention_dim, bias=False)
        self.v = LinearNorm(d.attention_dim, 1, bias=False)
        self.location_layer = LocationLayer(d)

    def forward(self, query: Tensor, memory: Tensor, processed_memory: Tensor,
                weights_cat: Tensor, invalid: Tensor) -> tuple[Tensor, Tensor]:
        energies = self.v(torch.tanh(
            self.query_layer(query).unsqueeze(1)
            + self.location_layer(weights_cat)
            + processed_memory)).squeeze(2)                       # (B, T)
        energies = energies.masked_fill(invalid, float("-inf"))
        weights = torch.softmax(energies, dim=1)
        context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)  # (B, C)
        return context, weights


@dataclass
class DecoderState:
    """Everything one decoder step reads and writes; (B, ...) tensors."""
    attention_hidden: Tensor
    attention_cell: Tensor
    decoder_hidden: Tensor
    decoder_cell: Tensor
    attention_weights: Tensor       # (B, T)
    attention_weights_cum: Tensor   # (B, T)
    attention_context: Tensor       # (B, C)
    frame: Tensor                   # (B, n_mel), the last pre-postnet frame (go frame = 0)

    def tensors(self) -> list[Tensor]:
        return list(vars(self).values())


# A stand-in for an LSTM cell on the concatenation of two inputs (Decoder.step):
# (a, b, (h, c)) -> (h', c').
LSTMCellHook = Callable[[Tensor, Tensor, tuple[Tensor, Tensor]], tuple[Tensor, Tensor]]


def _cell_on_cat(cell: nn.LSTMCell) -> LSTMCellHook:
    """The cell itself as an LSTMCellHook: cell(cat((a, b), 1), (h, c))."""
    return lambda a, b, state: cell(torch.cat((a, b), 1), state)


class Decoder(nn.Module):
    def __init__(self, d: Tacotron2Dims):
        super().__init__()
        self.dims = d
        self.prenet = Prenet(d)
        self.attention_rnn = nn.LSTMCell(d.prenet_dims[-1] + d.embedding_dim, d.attention_rnn_dim)
        self.attention_layer = Attention(d)
        self.decoder_rnn = nn.LSTMCell(d.attention_rnn_dim + d.embedding_dim, d.decoder_rnn_dim)
        self.linear_projection = LinearNorm(d.decoder_rnn_dim + d.embedding_dim, d.n_mel)
        self.gate_layer = LinearNorm(d.decoder_rnn_dim + d.embedding_dim, 1)
        # Where rows stop (decode_rules.py): the reference's gate unless
        # swapped from outside, as the bench fixes its lines' lengths.
        self.stop_rule = gate_stops

    def initial_state(self, memory: Tensor) -> DecoderState:
        b, t, c = memory.shape
        zeros = lambda *shape: memory.new_zeros(shape)
        d = self.dims
        return DecoderState(
            zeros(b, d.attention_rnn_dim), zeros(b, d.attention_rnn_dim),
            zeros(b, d.decoder_rnn_dim), zeros(b, d.decoder_rnn_dim),
            zeros(b, t), zeros(b, t), zeros(b, c), zeros(b, d.n_mel))

    def step(self, s: DecoderState, memory: Tensor, processed_memory: Tensor,
             invalid: Tensor, keep_masks: list[Tensor] | None,
             attention: Callable[..., tuple[Tensor, Tensor, Tensor]] | None = None,
             prenet: Callable[[Tensor, list[Tensor] | None], Tensor] | None = None,
             output: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
             attention_rnn: LSTMCellHook | None = None,
             decoder_rnn: LSTMCellHook | None = None
             ) -> tuple[DecoderState, Tensor]:
        """One frame for every row. Returns the new state (its ``frame`` is the
        output frame) and the gate logits (B,). The hooks, if given, stand in
        for parts of the step, e.g. fused kernels (decoder_graph.py):
        ``attention`` for the attention layer and the cumulative add: (query,
        weights, weights_cum, memory, processed_memory, invalid) -> (context,
        weights, weights_cum + weights); ``prenet`` for the prenet: (frame,
        keep_masks) -> prenet output; ``output`` for the projection and the
        gate layer: (decoder hidden, context) -> (frame (B, n_mel), gate (B,));
        ``attention_rnn`` and ``decoder_rnn`` for the two LSTM cells on the
        concatenation of two inputs: (a, b, (h, c)) -> (h', c'), as the cell
        on (cat((a, b), 1), (h, c))."""
        x = self.prenet(s.frame, keep_masks) if prenet is None else prenet(s.frame, keep_masks)
        if attention_rnn is None:
            attention_rnn = _cell_on_cat(self.attention_rnn)
        if decoder_rnn is None:
            decoder_rnn = _cell_on_cat(self.decoder_rnn)
        ah, ac = attention_rnn(x, s.attention_context, (s.attention_hidden, s.attention_cell))
        if attention is None:
            weights_cat = torch.stack((s.attention_weights, s.attention_weights_cum), 1)
            context, weights = self.attention_layer(ah, memory, processed_memory, weights_cat, invalid)
            weights_cum = s.attention_weights_cum + weights
        else:
            context, weights, weights_cum = attention(ah, s.attention_weights, s.attention_weights_cum,
                                                      memory, processed_memory, invalid)
        dh, dc = decoder_rnn(ah, context, (s.decoder_hidden, s.decoder_cell))
        if output is None:
            hidden_context = torch.cat((dh, context), 1)
            frame = self.linear_projection(hidden_context)
            gate = self.gate_layer(hidden_context).squeeze(1)
        else:
            frame, gate = output(dh, context)
        new = DecoderState(ah, ac, dh, dc, weights, weights_cum, context, frame)
        return new, gate


class Postnet(nn.Module):
    def __init__(self, d: Tacotron2Dims):
        super().__init__()
        sizes = [d.n_mel] + [d.postnet_dim] * (d.postnet_convs - 1) + [d.n_mel]
        self.convolutions = nn.ModuleList(
            conv_bn(n_in, n_out, d.postnet_kernel) for n_in, n_out in zip(sizes, sizes[1:]))

    def forward(self, mel: Tensor, keep: Tensor) -> Tensor:
        # mel: (B, n_mel, F); keep: (B, 1, F) 1.0 on each row's frames, 0 after its stop
        x = mel
        last = len(self.convolutions) - 1
        for i, conv in enumerate(self.convolutions):
            x = conv(x * keep)
            if i < last:
                x = torch.tanh(x)
        return x


class Tacotron2(nn.Module):
    def __init__(self, d: Tacotron2Dims):
        super().__init__()
        self.dims = d
        # nn.Embedding's own N(0, 1) draw, except on the meta device, where
        # models are first built (loading.py) and drawing imports torch's
        # compiler, seconds of every run's start (BENCHMARKS.md, a6fb844).
        weight = torch.empty(d.n_symbols, d.embedding_dim)
        if weight.device.type != "meta":
            weight.normal_()
        self.embedding = nn.Embedding.from_pretrained(weight, freeze=False)
        self.encoder = Encoder(d)
        self.decoder = Decoder(d)
        self.postnet = Postnet(d)

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor]) -> "Tacotron2":
        model = cls(Tacotron2Dims.from_state_dict(sd))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        # BatchNorm's step counter is training state; checkpoints may omit it.
        missing = [k for k in missing if not k.endswith("num_batches_tracked")]
        if missing or unexpected:
            raise ValueError(f"Tacotron2 weights do not fit the architecture: "
                             f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        return model.eval()

    def encode(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """ids: (B, T) padded with 0; lengths: (B,). Returns memory (B, T, C) and
        the padding mask ``invalid`` (B, T), True past each length."""
        invalid = torch.arange(ids.shape[1], device=ids.device)[None, :] >= lengths[:, None]
        memory = self.encoder(self.embedding(ids).transpose(1, 2), lengths, ~invalid)
        return memory, invalid

    def postprocess(self, mel: Tensor, frames: Tensor) -> Tensor:
        """mel: (B, n_mel, F) decoder frames; frames: (B,) each row's length.
        Returns the postnet mel, zero past each row's length (WaveGlow needs
        zero padding for batched == alone)."""
        keep = (torch.arange(mel.shape[2], device=mel.device)[None, :] < frames[:, None])
        keep = keep.unsqueeze(1).to(mel.dtype)
        return (mel + self.postnet(mel, keep)) * keep


def prenet_keep_masks(seeds: Tensor, steps: Tensor, d: Tacotron2Dims, p: float,
                      dtype: torch.dtype) -> list[Tensor] | None:
    """Per-line, per-step dropout keep masks, scaled by 1/(1-p); None when p == 0."""
    if p <= 0:
        return None
    return [randomness.dropout_keep(seeds, steps, stream=1 + i, width=w, p=p).to(dtype)
            for i, w in enumerate(d.prenet_dims)]


def masks_for_steps(seeds: Tensor, first: int | Tensor, k: int, d: Tacotron2Dims, p: float,
                    dtype: torch.dtype) -> list[list[Tensor]] | None:
    """prenet_keep_masks for steps first..first+k-1 in one go (fewer small
    kernels): a list over steps of lists over layers. ``first`` may be a (1,)
    device tensor, so a CUDA graph can replay it at any step."""
    b = seeds.shape[0]
    steps = (first + torch.arange(k, device=seeds.device)).repeat_interleave(b)
    masks = prenet_keep_masks(seeds.repeat(k), steps, d, p, dtype)
    if masks is None:
        return None
    return [[m.view(k, b, -1)[j] for m in masks] for j in range(k)]


class AttentionPath(NamedTuple):
    """Where each row's attention was at each decoder step: the symbol with
    the largest weight and that weight, recorded inside the decoder loop
    (one reduction of the step's weights). Steps past a row's stop are
    there too; ``alignment_measures`` reads each row's own steps only."""
    positions: Tensor    # (B, steps) int64
    peaks: Tensor        # (B, steps), the weights' dtype


class Decoded(NamedTuple):
    mel: Tensor          # (B, n_mel, F) postnet mel, zero past each row's frames
    frames: Tensor       # (B,) frames per row
    truncated: Tensor    # (B,) bool: max_decoder_steps reached without the stop rule firing
    attention: AttentionPath


# The window of the median that smooths the attention's path before its
# jumps are measured: excursions of up to two frames are no jump.
SMOOTHING_FRAMES = 5
# A line's path starts where the attention first peaks on one of its first
# this many symbols (alignment_measures).
START_SYMBOLS = 2


def alignment_measures(path: AttentionPath, frames: Tensor, lengths: Tensor, symbols: int
                       ) -> dict[str, Tensor]:
    """Each row's alignment health over its own frames, as (B,) tensors,
    computed where the path is (one batch of small reductions, no host
    sync). ``symbols``: the padded length of the batch's ids.

    The path starts where the peak first lands on one of the first
    START_SYMBOLS symbols: the frames before, where the attention has no
    location yet and its peak wanders (often to the line's end), count as
    that frame.

    - ``coverage``: the share of the row's symbols that held the peak at
      some frame.
    - ``focus``: the mean peak weight.
    - ``forward_jump``: the largest step ahead, in symbols, of the path
      smoothed by a median over SMOOTHING_FRAMES frames (a peak that
      leaves for a frame or two and returns is no jump); the path's first
      position counts as a step ahead from the first symbol.
    - ``backward_jump``: the furthest the smoothed path fell back behind
      the furthest symbol it had reached (a repeat, however many frames it
      took to go back).
    - ``symbols_left``: the row's symbols after the peak at its last frame.
    - ``frames_per_symbol``.
    """
    positions, peaks = path.positions, path.peaks.float()
    steps = torch.arange(positions.shape[1], device=positions.device)
    live = steps[None, :] < frames[:, None]                        # (B, steps)
    n = frames.clamp(min=1)
    last = (n - 1)[:, None]
    # Before the attention has a location its peak wanders; the path starts
    # where it first peaks on one of the first START_SYMBOLS symbols (from
    # the first frame when it never does: a start skipped).
    started = live & (positions < START_SYMBOLS)
    start = torch.where(started.any(1), started.to(torch.uint8).argmax(1), 0)[:, None]
    positions = torch.where(steps[None, :] < start, positions.gather(1, start), positions)
    # each frame's window of SMOOTHING_FRAMES within the row's own frames
    # (shifted inwards at its ends), as (B, steps, window) indices
    first = torch.minimum(steps[None, :] - SMOOTHING_FRAMES // 2, last - SMOOTHING_FRAMES + 1).clamp(min=0)
    window = torch.minimum(first[:, :, None] + torch.arange(SMOOTHING_FRAMES, device=positions.device), last[:, :, None])
    smooth = positions.gather(1, window.flatten(1)).view(window.shape).median(2).values
    smooth = torch.where(live, smooth, smooth[:, :1])
    moved = torch.diff(smooth, dim=1, prepend=torch.zeros_like(smooth[:, :1]))
    moved = torch.where(live, moved, torch.zeros_like(moved))
    fell_back = torch.where(live, smooth.cummax(1).values - smooth, torch.zeros_like(smooth))
    visited = torch.zeros(positions.shape[0], max(symbols, 1), dtype=torch.bool, device=positions.device)
    visited.scatter_(1, torch.where(live, positions, positions[:, :1]), True)
    at_stop = positions.gather(1, last).squeeze(1)
    return {"coverage": visited.sum(1) / lengths, "focus": (peaks * live).sum(1) / n,
            "backward_jump": fell_back.amax(1), "forward_jump": moved.amax(1).clamp(min=0),
            "symbols_left": lengths - 1 - at_stop, "frames_per_symbol": frames / lengths}


@torch.inference_mode()
def decode(model: Tacotron2, ids: Tensor, lengths: Tensor, seeds: Tensor,
           cfg: DecodeSettings) -> Decoded:
    """Plain (eager) batched greedy decode.

    A row stops at the first step where the decoder's stop rule
    (``Decoder.stop_rule``; the reference's: sigmoid(gate) > threshold) says
    so, and keeps that frame, as the reference does. The gate is computed
    at every step whatever the rule.
    """
    memory, invalid = model.encode(ids, lengths)
    processed_memory = model.decoder.attention_layer.memory_layer(memory)
    state = model.decoder.initial_state(memory)
    b = ids.shape[0]
    frames_out, stops_out, peaks, positions = [], [], [], []
    stop_at = torch.full((b,), cfg.max_decoder_steps, dtype=torch.long, device=ids.device)
    k = cfg.stop_check_every
    for step in range(cfg.max_decoder_steps):
        if step % k == 0:   # dropout masks for the next k steps in one go: fewer small kernels
            masks_ahead = masks_for_steps(seeds, step, k, model.dims, cfg.prenet_dropout, memory.dtype)
        masks = masks_ahead[step % k] if masks_ahead is not None else None
        state, gate = model.decoder.step(state, memory, processed_memory, invalid, masks)
        frames_out.append(state.frame)
        peak, position = state.attention_weights.max(1)
        peaks.append(peak)
        positions.append(position)
        stops = model.decoder.stop_rule(gate, step, lengths, cfg)
        stop_at = torch.where(stops & (stop_at == cfg.max_decoder_steps),
                              torch.full_like(stop_at, step + 1), stop_at)
        stops_out.append(stops)
        if (step + 1) % cfg.stop_check_every == 0 and bool((stop_at <= step + 1).all()):
            break
    mel = torch.stack(frames_out, 2)                           # (B, n_mel, steps run)
    stopped = torch.stack(stops_out, 1).any(1)
    frames = stop_at.clamp(max=mel.shape[2])
    mel = mel[:, :, : int(frames.max())]
    path = AttentionPath(torch.stack(positions, 1), torch.stack(peaks, 1))
    return Decoded(model.postprocess(mel, frames), frames, ~stopped, path)


# The shapes of NVIDIA's published tacotron2_statedict.pt (used by the benchmark,
# which builds random weights in these shapes).
PUBLISHED_DIMS = Tacotron2Dims(
    n_symbols=148, embedding_dim=512, encoder_convs=3, encoder_kernel=5, n_mel=80,
    prenet_dims=(256, 256), attention_rnn_dim=1024, decoder_rnn_dim=1024, attention_dim=128,
    location_filters=32, location_kernel=31, postnet_convs=5, postnet_dim=512, postnet_kernel=5)
