"""Train the demo voice's Tacotron2 (text -> mel) on the data of make_data.py.

The network is ``tts_cli.tacotron2.Tacotron2`` itself (only smaller), so what
is exported loads through ``tts_cli.checkpoints`` like any published file.
That module only decodes; the teacher-forced training pass is written here
from its submodules, following NVIDIA/tacotron2's ``model.py`` and
``loss_function.py``:

* encoder: each convolution -> BatchNorm -> ReLU -> dropout 0.5, then the
  bidirectional LSTM over the packed sequence;
* decoder: the prenet (dropout 0.5, always on) reads the previous *ground
  truth* frame (a zero "go" frame first); attention LSTM, its hidden state
  dropped out at 0.1; location-sensitive attention; decoder LSTM, hidden state
  dropped out at 0.1; frame projection and stop gate from [hidden, context];
* postnet: convolutions with tanh (not the last) and dropout 0.5, added to
  the decoder's frames (a residual);
* outputs past each utterance's length: mel 0, gate logit 1e3 (mask_padding);
* loss: MSE(frames, mel) + MSE(frames + postnet, mel) + BCE-with-logits(gate,
  target), the target 1 from each utterance's last frame on.

Two additions. The gate's positive frames weigh ``GATE_POS_WEIGHT`` times as
much as its negatives, so it learns to stop within a few short runs. And a
guided-attention loss (after Tachibana et al., 2017) on the attention weight
that falls far from where each frame's symbol is. ``--guide words`` (the
default) takes that from espeak-ng's own word timings (``word_timings.py``):
each frame's character, within ``WORD_GUIDE_WIDTH`` characters.
``--guide diagonal`` assumes the speech goes through the text at a constant
rate (within a fifth of the text), as the first training runs did: that
guide is only roughly right, so it fades out over ``--guide-steps``; the
words guide stays on. Either only shapes what the attention learns; at
inference nothing changes.

Adam (lr 1e-3, eps 1e-6, weight decay 1e-6) and gradient clipping at 1.0, as
the reference's hparams.py. Mixed precision through torch.autocast (bf16 by
default on CUDA; fp16 with a GradScaler).
"""
from __future__ import annotations

import math
import sys
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F

import common
import word_timings
from mel import read_filelist
from tts_cli import text as frontend
from tts_cli.tacotron2 import DecodeSettings, Tacotron2, Tacotron2Dims, decode

# Small enough that Tacotron2 and WaveGlow together stay under 30 MB in fp16
# (this one: about 4.1 M parameters, 8.2 MB; WaveGlow's upsampler alone takes
# 13.1 MB), large enough to model one very regular voice. Narrowed where the
# parameters are (LSTMs 1024 -> 384, embedding/encoder 512 -> 192, postnet
# 512 -> 128); the attention, the prenet (256), the kernels and the layer
# counts stay as published, since they set how the model aligns rather than
# how much it can store.
DEMO_DIMS = Tacotron2Dims(
    n_symbols=len(frontend.SYMBOLS), embedding_dim=192, encoder_convs=3, encoder_kernel=5,
    n_mel=80, prenet_dims=(256, 256), attention_rnn_dim=384, decoder_rnn_dim=384,
    attention_dim=128, location_filters=32, location_kernel=31, postnet_convs=5,
    postnet_dim=128, postnet_kernel=5)

P_DROPOUT = 0.5            # encoder convolutions, prenet, postnet
P_ATTENTION_DROPOUT = 0.1
P_DECODER_DROPOUT = 0.1
# --frame-dropout: the share of true previous frames the teacher-forced
# decoder is given as the zero "go" frame instead. espeak-ng's frames change
# slowly, so a decoder can predict each from the one before and barely use the
# text (evaluate.py forced --other-text: 28.2 % WER with each line's own text,
# 37.5 % with another's, at step 3,190); free-running it has no true frame to
# copy. Training only; the reference's training has none (0).
frame_dropout = 0.0
GATE_PADDING_LOGIT = 1e3   # the reference's fill for gate outputs past the end
# Weight of the gate's one positive frame per utterance against its hundreds
# of negatives (the reference: 1). At step 1,756, with the attention on the
# diagonal, the unweighted gate gave 0.05 on each line's last frame and 0.002
# elsewhere, and stopped no held-out line free-running; x10 is what Coqui TTS
# uses for its stopnet.
GATE_POS_WEIGHT = 10.0
MAX_FRAMES = 1000          # longer utterances are left out (and none is this long at 175 wpm)
# --guide words: how far (in characters, one standard deviation) the attention
# may stray from the character espeak-ng is saying before it costs much. Within
# a word the characters are taken to share its time equally, so the true spot
# can be a few characters off a long word's; the diagonal guide's width is a
# fifth of the line (20 characters on a line of 100).
WORD_GUIDE_WIDTH = 3.0
DIAGONAL_GUIDE_WIDTH = 0.2  # of the text length


# --------------------------------------------------------------------------
# Teacher-forced pass


def encode(model: Tacotron2, ids: Tensor, lengths: Tensor, static: bool = False) -> tuple[Tensor, Tensor]:
    """The encoder as trained: dropout after every convolution. ``static``:
    no host synchronisation (for CUDA graphs), same result."""
    invalid = torch.arange(ids.shape[1], device=ids.device)[None, :] >= lengths[:, None]
    keep = (~invalid).unsqueeze(1)
    x = model.embedding(ids).transpose(1, 2)
    for conv in model.encoder.convolutions:
        # Zeroing padded positions first, as inference does, keeps what the
        # convolutions see at the ends of a line the same in both.
        x = F.dropout(F.relu(conv(x * keep.to(x.dtype))), P_DROPOUT, model.training)
    if static:
        return bidirectional_lstm_in_place(model.encoder.lstm, x.transpose(1, 2), lengths, invalid), invalid
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        x.transpose(1, 2), lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, _ = model.encoder.lstm(packed)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
    return out, invalid


def bidirectional_lstm_in_place(lstm: torch.nn.LSTM, x: Tensor, lengths: Tensor, invalid: Tensor) -> Tensor:
    """The packed bidirectional LSTM's output without packing (which needs the
    lengths on the host, so a CUDA graph cannot hold it). Forwards, padding
    comes after each line and cannot reach its valid outputs; backwards, each
    line is reversed within its own length first, so the reverse weights read
    it from its true end, then the outputs are put back in place. Outputs past
    each length are zero, as pad_packed_sequence leaves them."""
    steps = x.shape[1]
    t = torch.arange(steps, device=x.device)[None, :]
    within = lengths[:, None] - 1 - t
    order = torch.where(t < lengths[:, None], within, t)         # an involution per row
    one_way = _one_way_lstm(lstm)

    def run(weights_suffix: str, inputs: Tensor) -> Tensor:
        params = {name: getattr(lstm, name + weights_suffix)
                  for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")}
        # cuDNN's RNN off: the native one runs fused LSTM cells, which a CUDA
        # graph is known to hold (as the decoder's cells).
        with torch.backends.cudnn.flags(enabled=False):
            out, _ = torch.func.functional_call(one_way, params, (inputs,))
        return out

    def reorder(v: Tensor) -> Tensor:
        return torch.gather(v, 1, order[:, :, None].expand(-1, -1, v.shape[2]))

    forwards = run("", x)
    backwards = reorder(run("_reverse", reorder(x)))
    return torch.cat((forwards, backwards), 2).masked_fill(invalid[:, :, None], 0.0)


_one_way_lstms: dict[int, torch.nn.LSTM] = {}


def _one_way_lstm(lstm: torch.nn.LSTM) -> torch.nn.LSTM:
    """A one-direction LSTM of the same sizes, whose own weights are never
    used (functional_call lends it each direction's)."""
    key = id(lstm)
    if key not in _one_way_lstms:
        w = lstm.weight_ih_l0
        _one_way_lstms[key] = torch.nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True,
                                            device=w.device, dtype=w.dtype)
    return _one_way_lstms[key]


def prenet(model: Tacotron2, frames: Tensor) -> Tensor:
    # Dropout stays on whatever the mode: the reference trains and infers so.
    for layer in model.decoder.prenet.layers:
        frames = F.dropout(F.relu(layer(frames)), P_DROPOUT, training=True)
    return frames


def decoder_step(dec, training: bool, x: Tensor, ah: Tensor, ac: Tensor, dh: Tensor, dc: Tensor,
                 weights: Tensor, weights_cum: Tensor, context: Tensor, memory: Tensor,
                 processed_memory: Tensor, invalid: Tensor) -> tuple[Tensor, ...]:
    """One teacher-forced decoder step (x: the prenet output of the previous
    ground-truth frame). A function of tensors only, so --compile can fuse
    its ~25 small kernels: the step loop is what bounds training speed. It
    returns the projection's input, cat(dh, context): the projection and the
    gate layer run once over all steps after the loop (``project``), one
    product each instead of one per step, forwards and backwards."""
    ah, ac = dec.attention_rnn(torch.cat((x, context), 1), (ah, ac))
    # The reference keeps the dropped-out hidden state as the state.
    ah = F.dropout(ah, P_ATTENTION_DROPOUT, training)
    weights_cat = torch.stack((weights, weights_cum), 1)
    context, weights = dec.attention_layer(ah, memory, processed_memory, weights_cat, invalid)
    weights_cum = weights_cum + weights
    dh, dc = dec.decoder_rnn(torch.cat((ah, context), 1), (dh, dc))
    dh = F.dropout(dh, P_DECODER_DROPOUT, training)
    return ah, ac, dh, dc, weights, weights_cum, context, torch.cat((dh, context), 1)


def project(dec, hidden_context: Tensor) -> tuple[Tensor, Tensor]:
    """(T, B, D) projection inputs of every step -> frames (B, n_mel, T) and
    gate logits (B, T): the decoder's last two layers, once for all steps."""
    frames = dec.linear_projection(hidden_context).permute(1, 2, 0)
    gates = dec.gate_layer(hidden_context).squeeze(2).t()
    return frames, gates


compiled_step = None   # torch.compile(decoder_step) with --compile


def decode_teacher_forced(model: Tacotron2, memory: Tensor, invalid: Tensor, mels: Tensor
                          ) -> tuple[Tensor, Tensor, Tensor]:
    """mels (B, n_mel, T) ground truth -> frames (B, n_mel, T), gate logits
    (B, T), alignments (B, T, T_text)."""
    dec = model.decoder
    b, n_mel, steps = mels.shape
    go = mels.new_zeros(b, n_mel, 1)
    previous = torch.cat((go, mels[:, :, :-1]), 2)
    if model.training and frame_dropout > 0:
        previous = previous * (torch.rand(b, 1, steps, device=mels.device) >= frame_dropout)
    prenet_out = prenet(model, previous.permute(2, 0, 1))                # (T, B, n_mel)
    processed_memory = dec.attention_layer.memory_layer(memory)
    s = dec.initial_state(memory)
    ah, ac, dh, dc = s.attention_hidden, s.attention_cell, s.decoder_hidden, s.decoder_cell
    weights, weights_cum, context = s.attention_weights, s.attention_weights_cum, s.attention_context
    hidden_contexts, alignments = [], []
    step = compiled_step or decoder_step
    for t in range(steps):
        ah, ac, dh, dc, weights, weights_cum, context, hidden_context = step(
            dec, model.training, prenet_out[t], ah, ac, dh, dc, weights, weights_cum, context,
            memory, processed_memory, invalid)
        hidden_contexts.append(hidden_context)
        alignments.append(weights)
    frames, gates = project(dec, torch.stack(hidden_contexts))
    return frames, gates, torch.stack(alignments, 1)


def postnet(model: Tacotron2, mel: Tensor, keep: Tensor) -> Tensor:
    x = mel
    last = len(model.postnet.convolutions) - 1
    for i, conv in enumerate(model.postnet.convolutions):
        x = conv(x * keep)   # frames past the end zeroed, as at inference
        if i < last:
            x = torch.tanh(x)
        x = F.dropout(x, P_DROPOUT, model.training)
    return x


def forward(model: Tacotron2, ids: Tensor, lengths: Tensor, mels: Tensor, mel_lengths: Tensor,
            static: bool = False) -> dict[str, Tensor]:
    memory, invalid = encode(model, ids, lengths, static)
    frames, gates, alignments = decode_teacher_forced(model, memory, invalid, mels)
    valid = torch.arange(mels.shape[2], device=mels.device)[None, :] < mel_lengths[:, None]
    keep = valid.unsqueeze(1).to(frames.dtype)
    post = frames + postnet(model, frames, keep)
    return {"frames": frames * keep, "post": post * keep,
            "gates": gates.masked_fill(~valid, GATE_PADDING_LOGIT), "alignments": alignments}


def gate_targets(mel_lengths: Tensor, steps: int) -> Tensor:
    return (torch.arange(steps, device=mel_lengths.device)[None, :]
            >= (mel_lengths[:, None] - 1)).float()


def gate_bce(logits: Tensor, targets: Tensor, pos_weight: float = GATE_POS_WEIGHT) -> Tensor:
    """Binary cross-entropy with logits, positives weighted ``pos_weight``
    (as torch's pos_weight, written out so a captured step needs no tensor
    made for it)."""
    return pos_weight * targets * F.softplus(-logits) + (1 - targets) * F.softplus(logits)


def diagonal_path(lengths: Tensor, mel_lengths: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """(centres, widths) of --guide diagonal: step t of T looks at character
    t/T of N, within a fifth of N."""
    t = torch.arange(steps, device=lengths.device)[None, :] / mel_lengths[:, None]
    return t * lengths[:, None], DIAGONAL_GUIDE_WIDTH * lengths.float()


def guided_attention_loss(alignments: Tensor, lengths: Tensor, mel_lengths: Tensor,
                          centres: Tensor | None = None, widths: Tensor | None = None) -> Tensor:
    """The attention weight that falls far from each step's character
    (``centres``, (batch, >= steps), fractional; ``widths`` (batch,), in
    characters; the diagonal when not given), per decoder step (each step's
    weights sum to 1, so this is in [0, 1]), averaged over the valid steps.
    ESPnet's form averages over (step, text position) cells instead, which is
    N times weaker: ~0.01 beside a mel loss of ~1.3 on these lines. With
    that form the attention here had not aligned after 1,545 steps; per step
    it weighs as much as the mel loss early on, which a training of a few
    short runs needs."""
    b, steps, n_text = alignments.shape
    if centres is None:
        centres, widths = diagonal_path(lengths, mel_lengths, steps)
    n = torch.arange(n_text, device=alignments.device)[None, None, :]
    penalty = 1.0 - torch.exp(-((n - centres[:, :steps, None]) ** 2) / (2 * widths[:, None, None] ** 2))
    speaking = torch.arange(steps, device=alignments.device)[None, :] < mel_lengths[:, None]
    valid = speaking[:, :, None] & (n < lengths[:, None, None])
    return (alignments.float() * penalty * valid).sum() / speaking.sum()


def losses(out: dict[str, Tensor], mels: Tensor, lengths: Tensor, mel_lengths: Tensor,
           guide_weight: float | Tensor, frames: Tensor | int | None = None,
           guide_path: tuple[Tensor, Tensor] | None = None) -> dict[str, Tensor]:
    """The reference's losses: means over the batch padded to its longest
    utterance. ``frames`` is that padded length when the tensors are padded
    further (the captured steps pad to a bucket): the extra frames are zero in
    both output and target, so sums over them divided by the batch's own
    count give exactly the means of the unpadded batch. ``guide_path``:
    (centres, widths) for the guided attention (the diagonal when None)."""
    b, n_mel, steps = mels.shape
    count = b * (steps if frames is None else frames)
    mels = mels.float()
    mel_loss = (F.mse_loss(out["frames"].float(), mels, reduction="sum")
                + F.mse_loss(out["post"].float(), mels, reduction="sum")) / (count * n_mel)
    gate_loss = gate_bce(out["gates"].float(), gate_targets(mel_lengths, steps)).sum() / count
    total = mel_loss + gate_loss
    parts = {"mel": mel_loss, "gate": gate_loss}
    if isinstance(guide_weight, Tensor) or guide_weight > 0:
        parts["guide"] = guided_attention_loss(out["alignments"], lengths, mel_lengths,
                                               *(guide_path or (None, None)))
        total = total + guide_weight * parts["guide"]
    parts["total"] = total
    return parts


# --------------------------------------------------------------------------
# Data


class Dataset:
    """Symbol ids and cached mels of the training list, padded into batches,
    and where the attention should be at each frame."""

    def __init__(self, data: Path, max_frames: int = MAX_FRAMES, guide: str = "diagonal"):
        """Only utterances of at most ``max_frames`` frames (--max-frames: a
        start on short lines, whose steps cost less, to learn to align).
        ``guide``: "words" reads DATA/word_starts.pt (word_timings.py)."""
        mels = torch.load(data / "mels.pt", map_location="cpu")
        rows = [(uid, line) for uid, line in read_filelist(data / "train.psv")
                if uid in mels and mels[uid].shape[1] <= max_frames]
        self.ids = [torch.tensor(frontend.text_to_sequence(line)) for _, line in rows]
        self.mels = [mels[uid] for uid, _ in rows]
        self.frames = [m.shape[1] for m in self.mels]
        self.n_mel = self.mels[0].shape[0]
        self.guide = guide
        self.characters: list[Tensor] = []   # --guide words: each frame's character
        if guide == "words":
            self.characters = self._characters_at_frames(data, rows)

    def _characters_at_frames(self, data: Path, rows: list[tuple[str, str]]) -> list[Tensor]:
        path = data / "word_starts.pt"
        if not path.exists():
            raise SystemExit(f"train_tacotron2.py: {path} is missing; run word_timings.py --data {data} "
                             f"(or train with --guide diagonal)")
        starts = torch.load(path)
        characters = []
        for (uid, line), ids, frames in zip(rows, self.ids, self.frames):
            if uid not in starts or int(starts[uid][-1, 0]) != len(ids):
                raise SystemExit(f"train_tacotron2.py: {path} has no word starts for {uid} as train.psv "
                                 f"spells it ({line[:40]!r}...); run word_timings.py --data {data} again")
            characters.append(word_timings.character_at_frames(starts[uid], frames))
        return characters

    def __len__(self) -> int:
        return len(self.mels)

    def batch(self, items: list[int], device: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return pad_batch([self.ids[i] for i in items], [self.mels[i] for i in items], device)

    def guide_path(self, items: list[int], steps: int, device: str) -> tuple[Tensor, Tensor]:
        """(centres (batch, steps), widths (batch,)) for guided_attention_loss."""
        lengths = torch.tensor([len(self.ids[i]) for i in items])
        if self.guide == "diagonal":
            centres, widths = diagonal_path(lengths, torch.tensor([self.frames[i] for i in items]), steps)
        else:
            centres = torch.zeros(len(items), steps)
            for row, i in enumerate(items):
                centres[row, : self.frames[i]] = self.characters[i]
            widths = torch.full((len(items),), WORD_GUIDE_WIDTH)
        return centres.to(device), widths.to(device)


def pad_batch(ids: list[Tensor], mels: list[Tensor], device: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(ids, lengths, mels, mel_lengths), each padded to its longest."""
    lengths = torch.tensor([len(q) for q in ids])
    mel_lengths = torch.tensor([m.shape[1] for m in mels])
    padded = torch.zeros(len(mels), mels[0].shape[0], int(mel_lengths.max()))
    for row, m in enumerate(mels):
        padded[row, :, : m.shape[1]] = m.float()
    ids = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
    return ids.to(device), lengths.to(device), padded.to(device), mel_lengths.to(device)


# --------------------------------------------------------------------------
# Captured training steps (CUDA)


class CapturedSteps:
    """Whole training steps (forward, backward, clipping, Adam) replayed as
    CUDA graphs, one per length bucket.

    Eagerly, a step launches ~120 small kernels per frame from Python (2 s
    per batch of 128 on an H200, the GPU mostly waiting). A graph replays the
    same kernels with no Python in between. Graphs need fixed shapes, so each
    batch is padded to its bucket (frames rounded up to ``bucket_frames``,
    text to the longest line any utterance of that bucket has) and to the full
    batch size (a short batch repeats its own items); the losses are
    normalised by the batch's own padded length, so they equal the eager
    step's. The padded frames cost compute the GPU had idle anyway.
    bf16 only (a GradScaler's skipped steps cannot be replayed)."""

    def __init__(self, model: Tacotron2, optimizer: torch.optim.Optimizer, data: "Dataset",
                 batch_size: int, device: str, precision: str, bucket_frames: int = 64):
        self.model, self.optimizer, self.data = model, optimizer, data
        self.batch_size, self.device, self.precision = batch_size, device, precision
        self.bucket_frames = bucket_frames
        self.text_for_bucket: dict[int, int] = {}
        for frames, ids in zip(data.frames, data.ids):
            bucket = self.bucket_of(frames)
            self.text_for_bucket[bucket] = max(self.text_for_bucket.get(bucket, 1), len(ids))
        longest = 1
        for bucket in sorted(self.text_for_bucket):       # longer frames -> at least as long text
            longest = self.text_for_bucket[bucket] = max(longest, self.text_for_bucket[bucket])
        self.graphs: dict[int, common.CapturedStep] = {}
        # One memory pool for all buckets' graphs: with a pool each, batch 512
        # ran out of 139 GiB after a few buckets; shared, the
        # largest bucket's step sets the peak.
        self.pool = torch.cuda.graph_pool_handle()

    def bucket_of(self, frames: int) -> int:
        return -(-frames // self.bucket_frames) * self.bucket_frames

    def __call__(self, items: list[int], guide: float) -> tuple[dict[str, Tensor], Tensor]:
        items = (items * self.batch_size)[: self.batch_size]
        ids, lengths, mels, mel_lengths = self.data.batch(items, "cpu")
        bucket = self.bucket_of(mels.shape[2])
        if bucket not in self.graphs:
            self.graphs[bucket] = common.CapturedStep(self._step, self._inputs(bucket), self.optimizer,
                                                      self.pool)
        captured = self.graphs[bucket]
        inputs = captured.inputs
        inputs["ids"].zero_()[:, : ids.shape[1]].copy_(ids)
        inputs["mels"].zero_()[:, :, : mels.shape[2]].copy_(mels)
        inputs["lengths"].copy_(lengths)
        inputs["mel_lengths"].copy_(mel_lengths)
        inputs["frames"].fill_(mels.shape[2])
        inputs["guide"].fill_(guide)
        centres, widths = self.data.guide_path(items, mels.shape[2], "cpu")
        inputs["centres"].zero_()[:, : centres.shape[1]].copy_(centres)
        inputs["widths"].copy_(widths)
        outputs = captured.replay()
        return outputs["parts"], outputs["grad_norm"]

    def _step(self, inputs: dict[str, Tensor]) -> dict:
        with common.autocast(self.device, self.precision):
            out = forward(self.model, inputs["ids"], inputs["lengths"], inputs["mels"],
                          inputs["mel_lengths"], static=True)
        parts = losses(out, inputs["mels"], inputs["lengths"], inputs["mel_lengths"],
                       inputs["guide"], frames=inputs["frames"],
                       guide_path=(inputs["centres"], inputs["widths"]))
        parts["total"].backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return {"parts": parts, "grad_norm": grad_norm}

    def _inputs(self, bucket: int) -> dict[str, Tensor]:
        b, dev = self.batch_size, self.device
        return {"ids": torch.zeros(b, self.text_for_bucket[bucket], dtype=torch.long, device=dev),
                "lengths": torch.ones(b, dtype=torch.long, device=dev),
                "mels": torch.zeros(b, self.data.n_mel, bucket, device=dev),
                "mel_lengths": torch.ones(b, dtype=torch.long, device=dev),
                "frames": torch.ones((), device=dev), "guide": torch.zeros((), device=dev),
                "centres": torch.zeros(b, bucket, device=dev), "widths": torch.ones(b, device=dev)}


def warm_up_for_capture(model: Tacotron2, optimizer, data: "Dataset", order, step: int, args) -> None:
    """Two eager steps before any capture; real training steps, not counted in
    ``step`` (the loop's batches follow it)."""
    batches = iter([order(step), order(step + 1)])

    def one_step() -> None:
        ids, lengths, mels, mel_lengths = data.batch(next(batches), args.device)
        with common.autocast(args.device, args.precision):
            out = forward(model, ids, lengths, mels, mel_lengths, static=True)
        parts = losses(out, mels, lengths, mel_lengths, torch.zeros((), device=args.device))
        optimizer.zero_grad(set_to_none=True)
        parts["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    common.warm_up_before_capture(one_step)


# --------------------------------------------------------------------------
# Progress check


class HeldOutCheck:
    """A few held-out lines decoded free-running, as at inference (no ground
    truth fed back): the share the gate stops before the step limit and their
    length against espeak-ng's. Teacher-forced losses fall long before the
    model can speak on its own; this says when it can. Also the
    teacher-forced mel loss of those held-out lines and of as many training
    lines, both in eval mode with the same dropout draws: the held-out one
    rising while the training one falls is overfitting."""

    def __init__(self, data_folder: Path, device: str, training: Dataset, lines: int = 8,
                 max_steps: int = 1000):
        mels = torch.load(data_folder / "mels.pt", map_location="cpu")
        rows = [(uid, text) for uid, text in read_filelist(data_folder / "heldout.psv") if uid in mels][:lines]
        seqs = [torch.tensor(frontend.text_to_sequence(text)) for _, text in rows]
        self.held_out = pad_batch(seqs, [mels[uid] for uid, _ in rows], device)
        self.training = training.batch(list(range(min(lines, len(training)))), device)
        self.target_frames = self.held_out[3].float().cpu()
        self.settings = DecodeSettings(max_decoder_steps=max_steps)
        self.device = device

    @torch.no_grad()
    def __call__(self, model: Tacotron2) -> dict[str, float]:
        model.eval()
        ids, lengths = self.held_out[:2]
        try:
            seeds = torch.arange(len(lengths), device=ids.device)
            _, frames, truncated, _ = decode(model, ids, lengths, seeds, self.settings)
            # the prenet's dropout is on at inference too: the same draws each check
            with torch.random.fork_rng(devices=[torch.cuda.current_device()] if "cuda" in self.device else []):
                torch.manual_seed(0)
                mel_losses = {name: self._mel_loss(model, batch) for name, batch in
                              (("heldout_mel_loss", self.held_out), ("train_lines_mel_loss", self.training))}
        finally:
            model.train()
        ratio = frames.float().cpu() / self.target_frames
        return {"heldout_stop_rate": float((~truncated).float().mean()),
                "heldout_duration_ratio": float(ratio.median()), **mel_losses}

    @staticmethod
    def _mel_loss(model: Tacotron2, batch: tuple[Tensor, Tensor, Tensor, Tensor]) -> float:
        ids, lengths, mels, mel_lengths = batch
        out = forward(model, ids, lengths, mels, mel_lengths)
        return float(losses(out, mels, lengths, mel_lengths, 0.0)["mel"])


# --------------------------------------------------------------------------
# Export


def export(model: Tacotron2, path: Path, step: int) -> None:
    """DeepLearningExamples / NGC layout, fp16: {'epoch', 'config', 'state_dict'
    with 'module.' names}. tts_cli.checkpoints reads it (and widens to fp32);
    fp16 halves the file, which the 30 MB budget needs."""
    state = OrderedDict(("module." + k, v.detach().half() if v.is_floating_point() else v.detach())
                        for k, v in model.state_dict().items())
    d = model.dims
    config = {"n_mel_channels": d.n_mel, "n_symbols": d.n_symbols,
              "symbols_embedding_dim": d.embedding_dim, "encoder_embedding_dim": d.embedding_dim,
              "n_frames_per_step": 1, "mask_padding": True, "demo_voice_step": step,
              "dims": asdict(d)}
    common.save_checkpoint(path, compressed=True, epoch=step, config=config, state_dict=state)


def weights_from_export(path: Path) -> tuple[dict[str, Tensor], int]:
    """An export back into the model's weights (fp32) and its step: a
    training run can start from a snapshot that lost its optimizer state."""
    state, step, _ = common.read_export(path)
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, step


# --------------------------------------------------------------------------
# Training loop


def build(dims: Tacotron2Dims, device: str, lr: float, captured: bool = False):
    model = Tacotron2(dims).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-6, weight_decay=1e-6,
                                 capturable=captured)
    return model, optimizer


def eager_step(model, optimizer, scaler, data: "Dataset", items: list[int], guide: float, args):
    ids, lengths, mels, mel_lengths = data.batch(items, args.device)
    with common.autocast(args.device, args.precision):
        out_tensors = forward(model, ids, lengths, mels, mel_lengths)
    parts = losses(out_tensors, mels, lengths, mel_lengths, guide,
                   guide_path=data.guide_path(items, mels.shape[2], args.device))
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(parts["total"]).backward()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    return parts, grad_norm


def guide_weight_at(step: int, weight: float, steps: int | None) -> float:
    """``weight`` fading linearly to 0 at step ``steps`` (None: never fades;
    0: no guide)."""
    if steps is None:
        return weight
    return weight * max(0.0, 1.0 - step / steps) if steps > 0 else 0.0


def train(args) -> dict:
    out: Path = args.out
    log = common.Log(out)
    budget = common.Budget(args.minutes)
    saved = common.load_checkpoint(out / "checkpoint.pt")
    dims = common.run_dims(DEMO_DIMS, args.dims, saved)
    data = Dataset(args.data, args.max_frames, args.guide)
    captured = common.use_graphs(args)
    model, optimizer = build(dims, args.device, args.lr, captured)
    scaler = common.grad_scaler(args.device, args.precision)
    step = 0
    if saved is not None:
        model.load_state_dict(saved["model"])
        common.restore_optimizer(optimizer, saved["optimizer"], captured, args.lr)
        scaler.load_state_dict(saved["scaler"])
        step = saved["step"]
        log.write(event="resumed", step=step)
    elif args.init_from is not None:
        state, step = weights_from_export(args.init_from)
        model.load_state_dict(state)
        log.write(event="started from export", path=str(args.init_from), step=step, optimizer="fresh")
    else:
        log.write(event="start", parameters=sum(p.numel() for p in model.parameters()),
                  utterances=len(data))
    last_save = budget.elapsed()

    check = HeldOutCheck(args.data, args.device, data) if args.check else None

    def save() -> None:
        common.require_finite(model.parameters(), step, out / "checkpoint.pt")
        common.save_checkpoint(out / "checkpoint.pt", model=model.state_dict(),
                               optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                               step=step, dims=asdict(dims))
        if check is not None:
            log.write(step=step, seconds=round(budget.elapsed(), 1), **check(model),
                      **common.gpu_memory(args.device))

    order = common.BatchOrder(data.frames, args.batch_size, args.seed)
    steps, parts = None, None
    if captured and not budget.spent():
        warm_up_for_capture(model, optimizer, data, order, step, args)
        steps = CapturedSteps(model, optimizer, data, args.batch_size, args.device, args.precision,
                              args.bucket_frames)
    while step < args.max_steps and not budget.spent():
        items = order(step)
        guide = guide_weight_at(step, args.guide_weight, args.guide_steps)
        if steps is not None:
            try:
                parts, grad_norm = steps(items, guide)
            except common.CAPTURE_ERRORS as e:   # a capture this machine cannot do: go on eagerly
                log.write(event="graphs off", error=common.capture_failure(e))
                steps = None
                continue
        else:
            parts, grad_norm = eager_step(model, optimizer, scaler, data, items, guide, args)
        step += 1
        if step % args.log_every == 0 or step == 1:
            log.write(step=step, seconds=round(budget.elapsed(), 1), grad_norm=float(grad_norm),
                      **{k: float(v.detach()) for k, v in parts.items()})
            if not torch.isfinite(parts["total"]):
                common.require_finite(model.parameters(), step, out / "checkpoint.pt")
        if budget.elapsed() - last_save > args.save_every_minutes * 60:
            save()
            last_save = budget.elapsed()
    save()
    model.eval()
    export(model, out / "demo_tacotron2.pt", step)
    log.write(event="saved", step=step, seconds=round(budget.elapsed(), 1))
    return {"step": step, "loss": float(parts["total"].detach()) if parts else math.nan}


def parse_args(argv: list[str] | None):
    p = common.training_arguments(__doc__.split("\n\n")[0], "folder of make_data.py + mel.py",
                                  {"max_steps": 1_000_000, "batch_size": 64, "lr": 1e-3, "log_every": 50})
    p.add_argument("--guide", choices=("words", "diagonal"), default="words",
                   help="where the guided attention wants each frame to look: the character espeak-ng is "
                        "saying (DATA/word_starts.pt, from word_timings.py), or the diagonal")
    p.add_argument("--guide-weight", type=float, default=1.0)
    p.add_argument("--guide-steps", type=int, default=None,
                   help="the guide fades linearly to 0 by this step (default: never with --guide words, "
                        "8000 with --guide diagonal; 0: no guide)")
    p.add_argument("--max-frames", type=int, default=MAX_FRAMES,
                   help="train only on utterances of at most this many frames (e.g. 400 to start: "
                        "short lines align sooner and cost less per step)")
    p.add_argument("--bucket-frames", type=int, default=64,
                   help="captured steps: one CUDA graph per this many frames of length (larger: fewer "
                        "captures on each fresh machine, more padding per step)")
    p.add_argument("--frame-dropout", type=float, default=0.0,
                   help="share of the true previous frames replaced by the go frame in training "
                        "(makes the decoder use the text; 0: as the reference)")
    p.add_argument("--compile", action="store_true", help="torch.compile the decoder step")
    p.add_argument("--dims", type=common.parse_dims, default=None,
                   help="override DEMO_DIMS, e.g. 'embedding_dim=32,attention_rnn_dim=32' (tests)")
    args = common.finish_arguments(p, argv)
    if args.guide_steps is None and args.guide == "diagonal":
        args.guide_steps = 8000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    global compiled_step, frame_dropout
    frame_dropout = args.frame_dropout
    # Opt-in: the first step then compiles for a minute or two (cached on disk
    # for later runs on the same machine); dynamic shapes, since batch and
    # text lengths vary.
    compiled_step = torch.compile(decoder_step, dynamic=True) if args.compile else None
    return common.run_training(train, args, "train_tacotron2.py")


if __name__ == "__main__":
    sys.exit(main())
