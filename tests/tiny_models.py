"""Tiny random Tacotron2 and WaveGlow in the published architectures' shapes
(small widths), built by the tests themselves: no downloads."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from tts_cli.config import Settings
from tts_cli.decode_rules import StopAfter
from tts_cli.tacotron2 import Tacotron2, Tacotron2Dims
from tts_cli.waveglow import WaveGlow, WaveGlowDims

N_MEL = 16
HOP = 256

TACOTRON2_DIMS = Tacotron2Dims(
    n_symbols=148, embedding_dim=32, encoder_convs=3, encoder_kernel=5, n_mel=N_MEL,
    prenet_dims=(16, 16), attention_rnn_dim=32, decoder_rnn_dim=32, attention_dim=16,
    location_filters=4, location_kernel=7, postnet_convs=3, postnet_dim=16, postnet_kernel=5)

WAVEGLOW_DIMS = WaveGlowDims(
    n_mel=N_MEL, n_flows=4, n_group=8, n_early_every=2, n_early_size=2, wn_layers=2,
    wn_channels=8, wn_kernel=3, upsample_kernel=4 * HOP, hop_length=HOP)


def engine_settings(**options) -> Settings:
    """An engine's settings for a test: the run's defaults, except that
    lines are not checked for alignment and their mels come back, unless
    ``options`` say otherwise."""
    return Settings(**{"check_alignment": False, "save_mels": True, **options})


def tiny_tacotron2(seed: int = 0, gate_bias: float | None = None) -> Tacotron2:
    """Random weights. ``gate_bias``: replace the gate with a constant logit
    (large negative: never stops; large positive: stops at the first frame)."""
    torch.manual_seed(seed)
    model = Tacotron2(TACOTRON2_DIMS)
    for p in model.parameters():
        p.data.normal_(0.0, 0.3)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.normal_(0.0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    if gate_bias is not None:
        model.decoder.gate_layer.linear_layer.weight.data.zero_()
        model.decoder.gate_layer.linear_layer.bias.data.fill_(gate_bias)
    return model.eval()


def force_lengths(model: Tacotron2, frames: dict[int, int] | Callable[[torch.Tensor], torch.Tensor]
                  ) -> Tacotron2:
    """``model``, each line it decodes as many frames long as ``frames``
    says for its symbol count, its gate aside: a dict {symbols: frames}
    (a count not in it: one frame), or a function of the rows' symbol
    counts (a tensor) giving their frames. Its stop rule swapped for a
    ``decode_rules.StopAfter``, which reads the counts on their device."""
    if isinstance(frames, dict):
        table = frames
        frames = lambda lengths: sum((lengths == symbols) * n for symbols, n in table.items())
    model.decoder.stop_rule = StopAfter(frames)
    return model


def tiny_waveglow(seed: int = 0) -> WaveGlow:
    torch.manual_seed(seed)
    model = WaveGlow(WAVEGLOW_DIMS)
    for p in model.parameters():
        p.data.normal_(0.0, 0.1)
    for conv in model.convinv:
        # A random rotation, as WaveGlow initialises its 1x1 convolutions.
        q, _ = torch.linalg.qr(torch.randn(conv.conv.weight.shape[0], conv.conv.weight.shape[0]))
        conv.conv.weight.data = q[:, :, None]
    model.upsample.weight.data.mul_(0.1)
    return model.eval()


def random_waveglow(seed: int = 0, **dims) -> WaveGlow:
    """A random WaveGlow of WAVEGLOW_DIMS changed by ``dims`` (any shape the
    loader accepts), 1x1 convolutions random rotations, ``end`` layers
    non-zero, float32, eval mode."""
    torch.manual_seed(seed)
    model = WaveGlow(dataclasses.replace(WAVEGLOW_DIMS, **dims))
    for p in model.parameters():
        p.data.normal_(0.0, 0.05)
    for conv in model.convinv:
        q, _ = torch.linalg.qr(torch.randn(conv.conv.weight.shape[0], conv.conv.weight.shape[0]))
        conv.conv.weight.data = q[:, :, None]
    return model.eval()


def canonical(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as the checkpoint loader returns them."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if not k.endswith("num_batches_tracked")}
