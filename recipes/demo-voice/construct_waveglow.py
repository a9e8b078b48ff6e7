"""Construct the demo voice's WaveGlow: set, not trained, to sing the mel on
the harmonics of 22050 / 256 = 86.13 Hz (a monotone voice).

Why: rendered that way, espeak-ng's own mels of 40 held-out lines are about
as intelligible to the recognizer as espeak-ng itself (``evaluate.py render
--rendering harmonic-carriers``: 23.9 % WER against 20.4 %), while the
WaveGlows trained by this recipe learnt no voicing (56.9 % at best).

How, in the file format ``tts_cli.checkpoints`` reads (2 flows, group 8, no
early outputs, WN of 2 layers x 80 channels; the harmonic h = c + 1 rides on
mel channel c, up to h = 80, 6.9 kHz):

* **Upsampler** (80 x 80 x 1024, stride 256). Output channel c is band c's
  log mel, each frame held for its hop, plus the mean log mel of
  the frame (between -11.5 and -3.0 on the training data: never zero) times
  a carrier of harmonic h. The kernel repeats every hop, so a harmonic of
  sampling_rate / hop is one continuous sinusoid across frames: these are
  the only carriers an upsampler can make. Within each 8-sample step the
  carrier is laid on two patterns orthogonal to a constant and a ramp (so
  the envelope, constant inside a step, does not leak into it): ``cos`` of the
  step's phase on one, ``sin`` on the other.
* **Conditioning layer** (per step, linear): projects channel h-1 onto the
  two patterns, giving mean-log-mel x cos and x sin of harmonic h's phase,
  and averages the channel of harmonic h's band over the step, giving its
  log mel L.
* **WN layers**: one gate per harmonic and phase, tanh(EPS x carrier) x
  sigmoid(L + GAMMA); tanh is about linear at that size, and sigmoid(L - 2.5)
  is about exp(L - 2.5), the band's magnitude. No audio input is read (start and
  dilated convolutions are zero).
* **Skip and end layers**: each gate goes to the 4 samples of the step its
  flow writes, as cos / sin of harmonic h at that sample's offset, scaled
  by half the band's width (the filterbank gives each band the same area)
  and by a level that matches espeak-ng's loudness. The end layer sets log s
  to S = 6 and the shift to -e^S times that sum, so the inverse coupling
  (z - shift) / e^S returns the sum with the noise scaled by e^-6.
* **1x1 convolutions**: the second flow's swaps the halves (it writes
  samples 0-3), the first's is the identity (it writes samples 4-7).

The mean log mel scales every harmonic of a frame alike: a mild compression
of loudness (louder frames have a less negative mean). Band levels come from
the nearest band, not the filterbank's inverse. Both cost little: rendered
from espeak-ng's mels through ``tts_cli``'s own WaveGlow, the first 40
held-out lines score 23.5 % WER (espeak-ng 20.2 %).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

import common
from mel import MelExtractor, MelSettings, band_edges, read_filelist, read_wav
from tts_cli.waveglow import WaveGlow, WaveGlowDims

DIMS = WaveGlowDims(n_mel=80, n_flows=2, n_group=8, n_early_every=2, n_early_size=0, wn_layers=2,
                    wn_channels=80, wn_kernel=3, upsample_kernel=1024, hop_length=256)
HARMONICS = 80       # one per mel channel: 86 Hz .. 6.9 kHz
LOG_S = 6.0          # the inverse coupling scales the noise by e^-6 (-34 dB under the voice)
EPS = 0.06           # tanh's input is ~0.3 in speech (mean log mel ~ -5), where it is linear within 3 %
GAMMA = -2.5         # sigmoid(L - 2.5) ~ exp(L - 2.5), 20 % under it at the data's loudest (L = 1.1)
# fp16 (the GPU engine's default) folds the end and skip layers into one
# product, e^LOG_S x the largest gain: 15,600 here, under fp16's 65,504. At
# LOG_S = 7, EPS = 0.03, GAMMA = -4 it was 375,000, and every sample was NaN.
PHASE_SEED = 0       # the harmonics' fixed phases (random: a pulse train is harsher, 28 % WER)


def step_patterns(group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two orthonormal within-step patterns orthogonal to a constant and a
    ramp (the envelope, held constant inside a step, cannot leak into them)."""
    j = torch.arange(group, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.stack([torch.ones(group), j, j ** 2, j ** 3], 1))
    return q[:, 2], q[:, 3]


def harmonic_bands(s: MelSettings = MelSettings()) -> tuple[torch.Tensor, torch.Tensor]:
    """Each harmonic's band (the nearest centre) and that band's width in Hz."""
    edges = band_edges(s)
    centres, widths = edges[1:-1], edges[2:] - edges[:-2]
    hz = torch.arange(1, HARMONICS + 1, dtype=torch.float64) * s.sampling_rate / s.hop_length
    band = (hz[:, None] - centres[None]).abs().argmin(1)
    return band, widths[band]


def build(level: float = 1.0) -> WaveGlow:
    """The constructed WaveGlow, float32, eval mode; ``level`` scales its
    output (``calibrate`` finds the one that matches espeak-ng)."""
    d, c = DIMS, DIMS.wn_channels
    model = WaveGlow(d)
    for p in model.parameters():
        p.data.zero_()
    h = torch.arange(1, HARMONICS + 1, dtype=torch.float64)
    phase = 2 * math.pi * torch.rand(HARMONICS, generator=torch.Generator().manual_seed(PHASE_SEED),
                                     dtype=torch.float64)
    p_cos, p_sin = step_patterns(d.n_group)

    # Upsampler: each frame held for its own hop (so the first and last hops
    # are covered as fully as the rest: a triangle fading in from a zero
    # frame would read as a loud log mel there and click), plus the mean log
    # mel times each channel's carrier, frame-locked.
    k = torch.arange(d.upsample_kernel, dtype=torch.float64)
    hold = (k < d.hop_length).double()
    sub = (k % d.n_group).long()
    step_phase = 2 * math.pi * h[:, None] * (k - k % d.n_group)[None] / d.hop_length + phase[:, None]
    carriers = hold * (torch.cos(step_phase) * p_cos[sub] + torch.sin(step_phase) * p_sin[sub])
    upsample = torch.eye(d.n_mel, dtype=torch.float64)[:, :, None] * hold + carriers[None] / d.n_mel
    model.upsample.weight.data.copy_(upsample.float())

    band, width = harmonic_bands()
    gain = level * width / 2
    for flow, first_sample in ((1, 0), (0, d.n_group // 2)):
        wn = model.WN[flow]
        cond = torch.zeros(2 * c * d.wn_layers, d.n_mel * d.n_group, dtype=torch.float64)
        bias = torch.zeros(2 * c * d.wn_layers, dtype=torch.float64)
        for u in range(HARMONICS):
            carrier = slice(u * d.n_group, (u + 1) * d.n_group)            # channel u carries harmonic u + 1
            level_of = slice(int(band[u]) * d.n_group, (int(band[u]) + 1) * d.n_group)
            for layer, pattern in ((0, p_cos), (1, p_sin)):
                tanh_row, sigmoid_row = 2 * c * layer + u, 2 * c * layer + c + u
                cond[tanh_row, carrier] = EPS * pattern
                cond[sigmoid_row, level_of] = 1.0 / d.n_group
                bias[sigmoid_row] = GAMMA
        wn.cond_layer.weight.data.copy_(cond[:, :, None].float())
        wn.cond_layer.bias.data.copy_(bias.float())
        samples = torch.arange(d.n_group // 2, dtype=torch.float64) + first_sample
        angle = 2 * math.pi * h[:, None] * samples[None] / d.hop_length
        # layer 0 (its skip rows follow its residual rows) holds cos, layer 1 -sin
        wn.res_skip_layers[0].weight.data[c: c + len(samples), :HARMONICS, 0] = (gain[:, None] * torch.cos(angle)).T.float()
        wn.res_skip_layers[1].weight.data[: len(samples), :HARMONICS, 0] = (-gain[:, None] * torch.sin(angle)).T.float()
        half = len(samples)
        wn.end.weight.data[torch.arange(half), torch.arange(half), 0] = -math.exp(LOG_S)
        wn.end.bias.data[half:] = LOG_S
    swap = torch.cat((torch.arange(d.n_group // 2, d.n_group), torch.arange(d.n_group // 2)))
    model.convinv[1].conv.weight.data.copy_(torch.eye(d.n_group)[swap][:, :, None])
    model.convinv[0].conv.weight.data.copy_(torch.eye(d.n_group)[:, :, None])
    return model.eval()


@torch.inference_mode()
def calibrate(data: Path, clips: int = 20) -> float:
    """The level at which the WaveGlow's rms equals espeak-ng's, median over
    the first ``clips`` training clips (their own mels)."""
    model, extract = build(1.0), MelExtractor()
    ratios = []
    for uid, _ in read_filelist(data / "train.psv")[:clips]:
        audio = read_wav(data / "wavs" / f"{uid}.wav")
        mel = extract(audio)[None]
        out = model.infer(mel, torch.tensor([mel.shape[2]]), torch.tensor([0]), 0.666)[0]
        ratios.append(float(audio.pow(2).mean().sqrt() / out.pow(2).mean().sqrt()))
    return statistics.median(ratios)


def export(model: WaveGlow, path: Path, level: float) -> None:
    """DeepLearningExamples / NGC layout, fp16 (``module.`` names; the
    conditioning layer fused, as ``tts_cli`` names it), deflated, with the
    demo voice's settings (``common.DEMO_VOICE``)."""
    config = {**common.waveglow_config(model.dims),
              "demo_voice_construction": {"harmonics": HARMONICS, "log_s": LOG_S, "eps": EPS,
                                          "gamma": GAMMA, "level": level, "phase_seed": PHASE_SEED}}
    state = {"module." + k: v.half() for k, v in model.state_dict().items()}
    common.save_checkpoint(path, compressed=True, epoch=0, config=config, state_dict=state, **common.DEMO_VOICE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="folder made by make_data.py (for the level)")
    p.add_argument("--out", type=Path, required=True, help="the WaveGlow file to write")
    args = p.parse_args(argv)
    level = calibrate(args.data)
    export(build(level), args.out, level)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB), level {level:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
