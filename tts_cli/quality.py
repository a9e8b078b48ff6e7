"""How close a path's audio is to the reference's, on a voice's real mels.

A 16-bit fast path is judged against the eager model in float32 and beside
the eager model in the same dtype: the fast path must be at least as close
to float32 as the eager model is. Random weights cannot show where an
approximation hurts (they drive no gate where a trained voice does), so
this runs on a voice's own WaveGlow and on mels from its own Tacotron2.
Used by the bench's quality rows and the GPU tests on trained weights.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tts_cli.batching import pad_sequences
from tts_cli.tacotron2 import DecodeSettings, Tacotron2, decode
from tts_cli.text import text_to_sequence
from tts_cli.waveglow import WaveGlow
from tts_cli.waveglow_fast import FastWaveGlow

# How many of a corpus's lines the bench's quality rows speak.
QUALITY_LINES = 64


def snr_db(audio: Tensor, reference: Tensor, lengths: Tensor) -> float:
    """Signal-to-noise ratio in dB of ``audio`` against ``reference`` (both
    (B, T)), over each row's first ``lengths[b]`` samples, pooled: reference
    energy over error energy, summed over every row. Infinite when equal."""
    signal = error = 0.0
    for row, n in enumerate(lengths.tolist()):
        a, r = audio[row, :n].double(), reference[row, :n].double()
        signal += float(r.square().sum())
        error += float((a - r).square().sum())
    return math.inf if error == 0 else 10 * math.log10(signal / error)


@dataclass(frozen=True)
class Fidelity:
    """SNR in dB against the eager model in float32, in one dtype."""
    fast: float     # FastWaveGlow (on CUDA: its kernels)
    eager: float    # the plain model cast to the dtype, as the reference code runs it

    @property
    def margin(self) -> float:
        """How much closer to float32 the fast path is than eager (dB; < 0: further)."""
        return self.fast - self.eager


@torch.inference_mode()
def waveglow_fidelity(waveglow: WaveGlow, mel: Tensor, frames: Tensor, seeds: Tensor, dtype: torch.dtype,
                      sigma: float = 0.666) -> Fidelity:
    """The fast path and the eager model in ``dtype`` against the eager model
    in float32, on ``mel`` (B, n_mel, F) with ``frames`` (B,) and the same
    noise (``seeds``), on the device ``mel`` is on. ``waveglow`` is left as
    it was."""
    device = mel.device
    reference_model = copy.deepcopy(waveglow).float().to(device).eval()
    inverses = [w.to(device) for w in reference_model.inverse_weights()]
    samples = frames * reference_model.dims.hop_length
    reference = reference_model.infer(mel.float(), frames, seeds, sigma, inverses)
    fast = FastWaveGlow(reference_model, dtype).infer(mel.to(dtype), frames, seeds, sigma)
    eager_model = reference_model.to(dtype)
    eager = eager_model.infer(mel.to(dtype), frames, seeds, sigma, inverses)
    return Fidelity(fast=snr_db(fast, reference, samples), eager=snr_db(eager, reference, samples))


@torch.inference_mode()
def voice_mels(tacotron2: Tacotron2, texts: list[str], device: torch.device,
               first_seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Mels a voice's own Tacotron2 makes for ``texts``: the plain model in
    float32, decoding as a run does (prenet dropout on, each line stopping on
    its gate). Returns (mel (B, n_mel, F), frames (B,), seeds (B,)); line i
    has seed first_seed + i. ``tacotron2`` is left as it was."""
    model = copy.deepcopy(tacotron2).float().to(device).eval()
    ids, lengths = pad_sequences([text_to_sequence(t) for t in texts], device=device)
    seeds = torch.arange(first_seed, first_seed + len(texts), device=device)
    decoded = decode(model, ids, lengths, seeds, DecodeSettings())
    return decoded.mel, decoded.frames, seeds
