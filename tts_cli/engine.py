"""Runs the models on a device: device and precision policy, batched synthesis.

This is the one place that decides where and in which dtype the models run.
Tacotron2 and WaveGlow run in the chosen dtype; WaveGlow's audio state and its
1x1 inverses stay float32, and the gate and the denoiser run in float32.
``Engine`` builds the models for its device and runs them by job: decoding
(decoding.py), vocoding (vocoding.py) and the two threads of a run of many
batches (scheduler.py).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch

from tts_cli import kernels
from tts_cli.config import DEVICE_NAME, REFERENCE_DENOISER_STRENGTH, WAVEGLOW_MEMORY_SHARE, Settings
from tts_cli.decoder_graph import GraphedDecoder
from tts_cli.decoding import Decoding, Job, Measured, measured
from tts_cli.devices import available_ram, expected_precision, on_its_device
from tts_cli.errors import OutputNotice, option
from tts_cli.scheduler import Scheduling, SynthesisError
from tts_cli.tacotron2 import DecodeSettings, Tacotron2
from tts_cli.vocoding import DENOISER_FFT_ROWS, Result, Vocoding
from tts_cli.waveglow import Denoiser, WaveGlow
from tts_cli.waveglow_fast import FastWaveGlow, supports, waveglow_rows_within

__all__ = ["Engine", "Job", "Measured", "PRECISIONS", "Result", "SynthesisError", "measured", "precision_name",
           "resolve_device", "resolve_precision"]

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(name: str | None) -> torch.device:
    """``cuda``, ``cuda:N`` or ``cpu``; None picks CUDA when there is one."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not DEVICE_NAME.fullmatch(name):
        raise ValueError(f"{option('device', name)}: use cuda, cuda:N or cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{option('device', name)}: no CUDA device is available here; use {option('device', 'cpu')}")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{option('device', name)}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def precision_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``fp16``: PRECISIONS the other way round."""
    return next(name for name, d in PRECISIONS.items() if d == dtype)


def resolve_precision(device: torch.device, name: str | None) -> tuple[torch.dtype, str | None]:
    """The dtype to run in, and a one-line notice when the request was changed
    (devices.expected_precision)."""
    precision, notice = expected_precision(device.type, name)
    return PRECISIONS[precision], notice


def waveglow_memory_gib(device: torch.device) -> float:
    """WaveGlow's default budget on ``device``, in GiB (WAVEGLOW_MEMORY_SHARE)."""
    share, most = WAVEGLOW_MEMORY_SHARE[device.type]
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_ram()
    return min(share * free / 2 ** 30, most) if free is not None else most


def engine_settings(settings: Settings, device: torch.device) -> Settings:
    """``settings`` with what the engine must know filled in where the run
    leaves it to the voice or the machine: the reference's denoiser strength
    (a loaded voice's own is filled in before, ``loading.with_voice``) and
    WaveGlow's share of ``device``'s memory."""
    return dataclasses.replace(
        settings,
        denoiser_strength=(REFERENCE_DENOISER_STRENGTH if settings.denoiser_strength is None
                           else settings.denoiser_strength),
        waveglow_memory=settings.waveglow_memory or waveglow_memory_gib(device))


class Engine(Decoding, Vocoding, Scheduling):
    """Tacotron2 + WaveGlow + denoiser on one device, in one dtype.

    The fast paths run by default: WaveGlow as large matrix products
    (waveglow_fast.py; on CUDA through Triton kernels, on CPU in plain
    torch, where it is also faster than the plain model, at the cost of
    memory and build time for its folded conditioning weights; BENCHMARKS.md,
    what each step bought), and on CUDA the decoder replayed from
    CUDA graphs through its kernels (decoder_graph.py). A WaveGlow the fast
    path cannot serve (``waveglow_fast.supports``) runs as the plain model,
    and ``notices`` says so. ``eager()`` gives the same engine without
    them: the plain model code, as the reference runs it.
    """

    def __init__(self, tacotron2: Tacotron2, waveglow: WaveGlow, device: torch.device,
                 dtype: torch.dtype, settings: Settings, fast: bool = True):
        self.device, self.dtype, self.fast = device, dtype, fast
        self.settings = engine_settings(settings, device)
        self.decode_settings = DecodeSettings.from_settings(settings)
        with self.on_device():
            self._build(tacotron2, waveglow)

    def on_device(self):
        """The engine's GPU as this thread's current device, for a block
        (``cuda`` without an index is the current device already)."""
        if self.device.type != "cuda" or self.device.index is None:
            return contextlib.nullcontext()
        return torch.cuda.device(self.device)

    def _build(self, tacotron2: Tacotron2, waveglow: WaveGlow) -> None:
        device, dtype, settings = self.device, self.dtype, self.settings
        if dtype == torch.float32:
            # fp32 means fp32: cuDNN would otherwise run convolutions in TF32.
            torch.backends.cudnn.allow_tf32 = False
        # float32 inverses of the 1x1 convolutions, computed once from the
        # float32 weights, before the model is cast.
        self.inverse_weights = [w.to(device) for w in waveglow.float().inverse_weights()]
        on_gpu = self.fast and device.type == "cuda"
        # The GPU kernels run on the GPUs they are checked for; elsewhere a notice says why not.
        use_kernels, refused = kernels.usable(device) if on_gpu else (False, None)
        # One-line notices for the run: a model the fast path cannot serve runs plain.
        self.notices: list[str] = [refused] if refused else []
        # built from the float32 weights too (the folds are computed in float32)
        self.fast_waveglow = None
        if self.fast and supports(waveglow.dims):
            self.fast_waveglow = FastWaveGlow(waveglow.to(device), dtype, use_kernels=use_kernels)
        elif self.fast:
            self.notices.append(f"this WaveGlow's dilated convolutions have {waveglow.dims.wn_kernel} taps; "
                                "the fast path needs 3, so it runs as the plain model (slower)")
        self.tacotron2 = tacotron2.to(device=device, dtype=dtype).eval()
        self.waveglow = waveglow.to(device=device, dtype=dtype).eval()
        self.graphed = GraphedDecoder(self.tacotron2, self.decode_settings, use_kernels=use_kernels) if on_gpu else None
        self.notices += self.graphed.notices if on_gpu else []
        # First run of these shapes on this machine: Triton compiles the kernels.
        self.compiled = None
        if use_kernels:
            self.compiled = kernels.CompiledMark(f"{tacotron2.dims} {waveglow.dims} {dtype}")
            kernels.remembered_triton_key()
            if not self.compiled.seen():
                self.notices.append(f"first run of this voice in {precision_name(dtype)} on this machine: "
                                    f"compiling its GPU kernels, {kernels.FIRST_COMPILE} (once; later runs "
                                    f"load them from {self.compiled.path.parent})")
        # WaveGlow runs over at most this many (item x group step) rows at once,
        # which bounds its memory whatever the batch (15 GiB: ~1M rows in fp16).
        dims = self.fast_waveglow.padded_dims if self.fast_waveglow is not None else self.waveglow.dims
        self.max_waveglow_rows = waveglow_rows_within(settings.waveglow_memory * 2 ** 30, dims, dtype)
        self.denoiser = (Denoiser.for_model(self.waveglow, dtype)
                         if settings.denoiser_strength > 0 else None)
        if self.denoiser is not None and not self.denoiser.bias_magnitude.any():
            # Nothing to subtract (the demo voice's WaveGlow: its carriers scale
            # with the mel, so a silent mel gives silence); without the denoiser
            # the audio is the same, made without its transforms.
            self.notices.append(OutputNotice(
                f"denoiser strength {settings.denoiser_strength:g} has no effect with this WaveGlow: its output "
                "for an all-zero mel, the bias the denoiser removes, is silence; running without the denoiser"))
            self.denoiser = None
        if self.denoiser is not None and device.type == "cuda":
            self.denoiser.fft_rows = DENOISER_FFT_ROWS

    def eager(self) -> "Engine":
        """This engine without its fast paths (the reference's way of running)."""
        plain = copy.copy(self)
        plain.fast, plain.graphed = False, None
        return plain

    def unchecked(self) -> "Engine":
        """This engine, on the same models and graphs, without the alignment checks."""
        plain = copy.copy(self)
        plain.settings = dataclasses.replace(self.settings, check_alignment=False)
        return plain

    @on_its_device
    @torch.inference_mode()
    def synthesize(self, jobs: list[Job]) -> list[Result]:
        """One batch, results in the order of ``jobs``."""
        kept = self.decode_checked(jobs)
        return self._vocode_and_finish(kept.jobs, kept.mel, kept.frames, kept.truncated)
