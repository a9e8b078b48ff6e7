"""Vocoding: WaveGlow over a decoded batch, the denoiser, and the copies of
the audio to the host.

WaveGlow runs fast (``waveglow_fast.FastWaveGlow``) or as the plain model,
over at most ``max_waveglow_rows`` rows at once. ``Vocoding`` is the part
of ``engine.Engine`` that does this; ``Result`` is a line's audio.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tts_cli.alignment import Checked
from tts_cli.decoding import Job
from tts_cli.devices import on_its_device

# The denoiser's spectra for at most this many bytes of a batch at once.
DENOISER_SLICE_BYTES = 2 ** 30
# On CUDA the denoiser transforms this many frames at a time: cuFFT makes a
# plan for each new transform shape, and with shapes following the batch a
# process's first corpus run would make a pair for every batch length. Of
# the fixed sizes timed, this one was as fast as any (fewer, larger
# transforms; BENCHMARKS.md, tried and lost).
DENOISER_FFT_ROWS = 16384


@dataclass(frozen=True)
class Result:
    audio: np.ndarray       # (samples,) float32, samples = frames * hop
    mel: np.ndarray | None  # (n_mel, frames) float32, the postnet mel; None unless the settings' save_mels
    frames: int
    truncated: bool         # hit max_decoder_steps without the gate firing
    checked: Checked | None = None   # its alignment check; None when the run checks none


@dataclass
class Launched:
    """One batch whose GPU work and copies are queued: its results once
    ``ready`` (None: the copies were synchronous) has passed."""
    jobs: list[Job]
    audio: torch.Tensor     # host (B, F*hop) float32
    mel: torch.Tensor | None  # host (B, n_mel, F) float32; None unless the settings' save_mels
    counts: list[int]
    cut: list[bool]
    ready: object | None


def record_event(device: torch.device):
    """A CUDA event recorded on the current stream; None off CUDA."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def _to_host(tensor: torch.Tensor, asynchronous: bool) -> torch.Tensor:
    """A host copy; ``asynchronous``: into pinned memory, queued on the current
    stream (valid once an event recorded after it has passed)."""
    if not asynchronous:
        return tensor.cpu()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class Vocoding:
    """Engine methods that vocode. They read the engine's ``device``,
    ``settings`` (``sigma``, ``denoiser_strength``, ``save_mels``),
    ``waveglow``, ``fast_waveglow`` (None: the plain model), ``fast``,
    ``inverse_weights``, ``max_waveglow_rows`` and ``denoiser`` (or None)."""

    @property
    def hop_length(self) -> int:
        return self.waveglow.dims.hop_length

    @on_its_device
    @torch.inference_mode()
    def vocode(self, mel: torch.Tensor, frames: torch.Tensor, seeds: torch.Tensor | None = None,
               counts: list[int] | None = None) -> torch.Tensor:
        """WaveGlow for one batch: float32 audio (B, F*hop), garbage past frames*hop.
        ``counts``: ``frames`` already on the host. Each slice of lines runs
        over its own longest line's frames: padding costs WaveGlow as much
        as audio does, and the audio is the same (each line is masked)."""
        if seeds is None:
            seeds = torch.zeros(mel.shape[0], dtype=torch.long, device=self.device)
        if counts is None:
            counts = frames.tolist()
        slices = self.waveglow_slices(counts)
        if len(slices) == 1 and max(counts) == mel.shape[2]:
            return self._vocode(mel, frames, seeds)
        audio = torch.zeros(mel.shape[0], mel.shape[2] * self.hop_length, device=mel.device)
        for rows in slices:
            longest = max(counts[rows])
            audio[rows, : longest * self.hop_length] = self._vocode(mel[rows, :, :longest], frames[rows], seeds[rows])
        return audio

    def waveglow_slices(self, counts: list[int]) -> list[slice]:
        """The batch's lines (their frame counts) in the runs of consecutive
        lines that WaveGlow takes at once: as many as fit ``max_waveglow_rows``
        at the run's longest line (at least one)."""
        rows_per_frame = self.hop_length // self.waveglow.dims.n_group
        slices, start, longest = [], 0, 0
        for i, n in enumerate(counts):
            longest = max(longest, n)
            if i > start and (i + 1 - start) * longest * rows_per_frame > self.max_waveglow_rows:
                slices.append(slice(start, i))
                start, longest = i, n
        return slices + [slice(start, len(counts))] if counts else slices

    def _vocode(self, mel, frames, seeds):
        sigma = self.settings.sigma
        if self.fast and self.fast_waveglow is not None:
            return self.fast_waveglow.infer(mel, frames, seeds, sigma)
        return self.waveglow.infer(mel, frames, seeds, sigma, self.inverse_weights)

    @torch.inference_mode()
    def _vocode_and_finish(self, jobs: list[Job], mel: torch.Tensor, frames: torch.Tensor,
                           truncated: torch.Tensor) -> list[Result]:
        return self._finish(self._vocode_launch(jobs, mel, frames, truncated))

    @torch.inference_mode()
    def _vocode_launch(self, jobs: list[Job], mel: torch.Tensor, frames: torch.Tensor,
                       truncated: torch.Tensor, counts: list[int] | None = None,
                       cut: list[bool] | None = None) -> Launched:
        """WaveGlow, the denoiser and the copies to the host for one batch,
        queued on the current stream; ``_finish`` waits for them. ``counts``
        and ``cut``: ``frames`` and ``truncated`` already on the host (read
        here they would wait for everything queued on this stream before)."""
        if counts is None:
            counts, cut = frames.tolist(), truncated.tolist()
        seeds = torch.tensor([j.seed for j in jobs], dtype=torch.long, device=self.device)
        audio = self.vocode(mel, frames, seeds, counts)     # (B, F*hop) float32
        if self.denoiser is not None:
            audio = self._denoise(audio, frames * self.hop_length)
        # One copy of the whole batch each: per-item copies would stall the stream.
        overlap = self.device.type == "cuda"
        audio = _to_host(audio, overlap)
        mel = _to_host(mel.float(), overlap) if self.settings.save_mels else None
        return Launched(jobs, audio, mel, counts, cut, record_event(self.device) if overlap else None)

    def _finish(self, launched: Launched) -> list[Result]:
        if launched.ready is not None:
            launched.ready.synchronize()
        audio = launched.audio.numpy()
        mel = launched.mel.numpy() if launched.mel is not None else None
        return [Result(audio=audio[i, : n * self.hop_length], mel=mel[i, :, :n] if mel is not None else None,
                       frames=n, truncated=launched.cut[i], checked=launched.jobs[i].checked)
                for i, n in enumerate(launched.counts)]

    def _denoise(self, audio: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
        """The denoiser over a batch's audio, each item on its own samples,
        in slices of items (its spectra take ~64 bytes per sample)."""
        strength = self.settings.denoiser_strength
        step = max(1, DENOISER_SLICE_BYTES // (64 * audio.shape[1]))
        for i in range(0, audio.shape[0], step):
            audio[i: i + step] = self.denoiser.batch(audio[i: i + step], samples[i: i + step], strength)
        return audio
