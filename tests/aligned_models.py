"""Tiny Tacotron2s whose attention moves by construction, as a trained
one's does or in the ways a trained one goes wrong, for the alignment
checks (tests/test_alignment.py).

The weights are set, not trained. The encoder ignores the text and marks
the first symbol and the last (its LSTM's two directions each carry a
flag that is on at the first position they read); the attention RNN marks
the first decoder step and carries whether the attention was on the last
symbol. The attention's energies then come from three parts:

- where it was: it stays on a symbol while its cumulative weight there is
  small, then moves ``jump`` symbols ahead (location features: the
  previous weights at the symbol, at ``jump`` symbols back, and the
  cumulative weights, through the location layer);
- a bonus on the first symbol at the first step (and, for ``repeat``, at
  the step after the attention was on the last symbol, so it reads the
  line again from the start);
- nothing from the text.

The gate fires when the attention sits on the last symbol (for
``repeat``, the second time), or after a fixed number of frames
(``stop_after``), or never (``gate=False``). Prenet dropout does not touch any of it, so a
line's path is the same whatever its seed.
"""
from __future__ import annotations

import dataclasses

import torch

from tiny_models import TACOTRON2_DIMS
from tts_cli.tacotron2 import Tacotron2

DIMS = dataclasses.replace(TACOTRON2_DIMS, location_kernel=15)
ON, OFF = 20.0, -20.0           # gate biases that saturate a sigmoid or a tanh
FLAG = float(torch.tanh(torch.tensor(1.0)))   # a flag's value when on: tanh(1)


def aligned_tacotron2(frames_per_symbol: int = 4, jump: int = 1, repeat: bool = False,
                      stop_after: int | None = None, gate: bool = True, stall: bool = False,
                      flaky: bool = False) -> Tacotron2:
    """``frames_per_symbol``: frames the attention stays on each symbol;
    ``jump``: symbols it moves ahead at once (1 reads every symbol; at most
    7); ``repeat``: back to the first symbol after the last, once;
    ``stop_after``: the gate fires after this many frames, wherever the
    attention is;
    ``gate``: False, it never fires; ``stall``: the attention never leaves
    the first symbol; ``flaky``: the gate also fires at random, about once
    in 190 frames (where the prenet's dropout keeps 13 or more of its first
    layer's 16 units and the first unit of its second), so whether a line
    is read to its end depends on its seed."""
    model = Tacotron2(DIMS)
    for p in model.parameters():
        p.data.zero_()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.zero_()
            m.running_var.fill_(1.0)
            m.weight.data.fill_(1.0)
    half = DIMS.embedding_dim // 2
    # Encoder: forward channel 0 flags the first symbol, backward channel 0 the last.
    for suffix in ("", "_reverse"):
        _flag_on_first_step(model.encoder.lstm, half, suffix)
    start, end = 0, half                                    # memory channels
    # Attention RNN: channel 0 flags step 0; channel 2 carries the end flag of the last context.
    cell = model.decoder.attention_rnn
    hidden = cell.hidden_size
    context_at = DIMS.prenet_dims[-1]                      # the context's place in the cell's input
    _flag_on_first_step(cell, hidden, "")
    if repeat:
        _carry(cell, hidden, channel=2, source=context_at + end, scale=5.0)
    attention = model.decoder.attention_layer
    # Channel 0: stay, then move `jump` ahead. With a peak of 1 held c frames,
    # staying scores 1 - lam * c, moving `mu`: it moves once c > (1 - mu) / lam.
    mu, lam = 0.5, 0.5 / (frames_per_symbol - 0.5)
    centre = DIMS.location_kernel // 2
    conv = attention.location_layer.location_conv.conv.weight.data
    conv[0, 0, centre] = 1.0
    if not stall:
        conv[0, 0, centre - jump] = mu
    conv[0, 1, centre] = -lam
    attention.location_layer.location_dense.linear_layer.weight.data[0, 0] = 0.5
    attention.v.linear_layer.weight.data[0, 0] = 60.0
    # Channel 1: the first symbol's bonus, on at step 0 (query channel 0
    # minus the step counter, channel 1: zero at step 0 only), and for
    # `repeat` after the end (query channel 2).
    attention.memory_layer.linear_layer.weight.data[1, start] = 3.0
    query = attention.query_layer.linear_layer.weight.data
    query[1, 0], query[1, 1] = 10.0, -10.0
    if repeat:
        query[1, 2] = 10.0 / FLAG
    attention.v.linear_layer.weight.data[0, 1] = 60.0
    # Gate, on cat(decoder hidden, context).
    gate_layer = model.decoder.gate_layer.linear_layer
    rnn = model.decoder.decoder_rnn.hidden_size
    if not gate:
        gate_layer.bias.data.fill_(-50.0)
    elif stop_after is not None:   # a clock in the decoder RNN: tanh(0.02 * (step + 1))
        _count(model.decoder.decoder_rnn, rnn, channel=1, source=None, scale=0.02)
        gate_layer.weight.data[0, 1] = 200.0
        gate_layer.bias.data.fill_(-200.0 * float(torch.tanh(torch.tensor(0.02 * (stop_after - 0.5)))))
    elif repeat:                   # on the last symbol for the second time: a count in the decoder RNN
        _count(model.decoder.decoder_rnn, rnn, channel=0, source=hidden + end, scale=0.4)
        gate_layer.weight.data[0, 0] = 50.0
        gate_layer.weight.data[0, rnn + end] = 10.0
        gate_layer.bias.data.fill_(-50.0 * 0.4 - 10.0 * FLAG / 2)
    else:
        gate_layer.weight.data[0, rnn + end] = 50.0
        gate_layer.bias.data.fill_(-50.0 * FLAG / 2)
    if flaky:
        _flaky_gate(model, hidden, rnn)
    return model.eval()


def _flaky_gate(model: Tacotron2, hidden: int, rnn: int) -> None:
    """Every frame is [1, 0, ...]; the prenet's first layer copies its
    first value to each unit and its second averages them, so its first
    output is (units kept) / 4 where its own unit is kept, else 0. Past
    3.125 (13 of 16 kept) the attention RNN's channel 3 turns from -FLAG
    to FLAG, the decoder RNN's channel 2 follows, and the gate fires."""
    model.decoder.linear_projection.linear_layer.bias.data[0] = 1.0
    first, second = (layer.linear_layer.weight.data for layer in model.decoder.prenet.layers)
    first[:, 0] = 1.0
    second[0, :] = 1.0 / first.shape[0]
    cell = model.decoder.attention_rnn
    _carry(cell, hidden, channel=3, source=0, scale=20.0)
    _gates(cell, "", "g")[2][3] = -20.0 * 3.125
    _carry(model.decoder.decoder_rnn, rnn, channel=2, source=3, scale=5.0)
    gate_layer = model.decoder.gate_layer.linear_layer
    gate_layer.weight.data[0, 2] = 40.0
    gate_layer.bias.data += 40.0 * FLAG


def _gates(lstm, suffix: str, kind: str):
    """The rows of gate ``kind`` (i, f, g, o, PyTorch's order) in an LSTM's weights."""
    n = {"i": 0, "f": 1, "g": 2, "o": 3}[kind]
    size = getattr(lstm, "hidden_size")
    bias_name = "bias_ih" + ("_l0" + suffix if isinstance(lstm, torch.nn.LSTM) else "")
    ih = "weight_ih" + ("_l0" + suffix if isinstance(lstm, torch.nn.LSTM) else "")
    hh = "weight_hh" + ("_l0" + suffix if isinstance(lstm, torch.nn.LSTM) else "")
    rows = slice(n * size, (n + 1) * size)
    return (getattr(lstm, ih).data[rows], getattr(lstm, hh).data[rows], getattr(lstm, bias_name).data[rows])


def _flag_on_first_step(lstm, size: int, suffix: str) -> None:
    """Channel 1 counts steps (its cell grows by one a step: tanh(n + 1));
    channel 0 is tanh(1) at the first step and ~0 after (its output gate
    shuts once channel 1 was on). Every other channel's output gate is
    shut."""
    for kind in "ifgo":
        _, _, bias = _gates(lstm, suffix, kind)
        bias.fill_(OFF if kind == "o" else ON)
    _gates(lstm, suffix, "f")[2][0] = OFF          # channel 0 forgets: its cell stays at 1
    _, hh, bias = _gates(lstm, suffix, "o")
    bias[0], hh[0, 1] = 10.0, -30.0
    bias[1] = ON


def _carry(cell, size: int, channel: int, source: int, scale: float) -> None:
    """Channel ``channel`` of the cell's output follows input ``source``:
    tanh(tanh(scale * x)), no memory."""
    ih, _, _ = _gates(cell, "", "g")
    ih[channel, source] = scale
    _gates(cell, "", "g")[2][channel] = 0.0
    _gates(cell, "", "f")[2][channel] = OFF
    _gates(cell, "", "o")[2][channel] = ON


def _count(cell, size: int, channel: int, source: int | None, scale: float) -> None:
    """Channel ``channel`` of the cell's output is tanh of the running sum
    of tanh(scale * input ``source``); with no source, of atanh-free
    steps of ``scale`` (a clock)."""
    for kind in "ifgo":
        _gates(cell, "", kind)[2][channel] = 0.0 if kind == "g" else ON
    if source is None:
        _gates(cell, "", "g")[2][channel] = float(torch.atanh(torch.tensor(scale)))
    else:
        _gates(cell, "", "g")[0][channel, source] = scale
