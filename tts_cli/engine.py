"""Runs the models on a device: device and precision policy, batched synthesis.

This is the one place that decides where and in which dtype the models run.
Tacotron2 and WaveGlow run in the chosen dtype; WaveGlow's audio state and its
1x1 inverses stay float32, and the gate and the denoiser run in float32.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from tts_cli import kernels
from tts_cli.alignment import Checked, Health, Thresholds, best
from tts_cli.batching import pad_sequences
from tts_cli.config import FIELDS, REFERENCE_DENOISER_STRENGTH, WAVEGLOW_MEMORY_SHARE
from tts_cli.devices import expected_precision
from tts_cli.errors import OutputNotice, first_line
from tts_cli.tacotron2 import DecodeSettings, Decoded, Tacotron2, alignment_measures, decode
from tts_cli.decoder_graph import GraphedDecoder
from tts_cli.waveglow import Denoiser, WaveGlow
from tts_cli.waveglow_fast import FastWaveGlow, supports, waveglow_rows_within

_DONE = object()   # end-of-stream marker between pipeline threads
# How often a pipeline thread waiting on a queue looks whether the run was
# halted (a get or put returns at once when the other side is ready).
_POLL_SECONDS = 0.05


class _Crash:
    """An unexpected exception that ended a pipeline thread; re-raised downstream."""

    def __init__(self, error: BaseException):
        self.error = error


def _start(stage, sink: queue.Queue, halt: threading.Event, *args) -> threading.Thread:
    """``stage(*args, sink, halt)`` on a thread of its own, on the engine's device."""
    def run():
        try:
            with stage.__self__.on_device():
                stage(*args, sink, halt)
        except BaseException as e:  # noqa: BLE001 - handed to the consuming thread
            _put(sink, _Crash(e), halt)
    # Daemon as a last resort only: synthesize_all joins its stages on every
    # way out, since a thread still running torch code when the interpreter
    # exits aborts the process ("terminate called without an active
    # exception", exit status 134).
    thread = threading.Thread(target=run, daemon=True, name=f"tts-{stage.__name__}")
    thread.start()
    return thread


def _on_its_device(method):
    """Runs an engine method with the engine's GPU as the thread's current
    device: streams, graph captures and Triton launches go to the current
    device, which is GPU 0 on every thread until set."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.on_device():
            return method(self, *args, **kwargs)
    return run


def _put(q: queue.Queue, item, halt: threading.Event) -> bool:
    """Put ``item`` unless the run is halted first (its consumer may be gone
    and never make room); whether it was put."""
    while not halt.is_set():
        try:
            q.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            pass
    return False


def _get(q: queue.Queue, halt: threading.Event):
    """The next item, or ``_DONE`` once the run is halted."""
    while not halt.is_set():
        try:
            return q.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            pass
    return _DONE


def _wait_until_taken(q: queue.Queue, halt: threading.Event) -> None:
    """Until the consumer has taken (``task_done``) everything put on ``q``,
    or the run is halted."""
    with q.all_tasks_done:
        while q.unfinished_tasks and not halt.is_set():
            q.all_tasks_done.wait(_POLL_SECONDS)


def _record_event(device: torch.device):
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def _wait_for(event, tensors, device: torch.device) -> None:
    """Make the current stream wait for tensors produced on another stream."""
    if event is None:
        return
    stream = torch.cuda.current_stream(device)
    stream.wait_event(event)
    for tensor in tensors:
        tensor.record_stream(stream)


PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(name: str | None) -> torch.device:
    """``cuda``, ``cuda:N`` or ``cpu``; None picks CUDA when there is one."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device {name}: use cuda, cuda:N or cpu")
    return device


def precision_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``fp16``: PRECISIONS the other way round."""
    return next(name for name, d in PRECISIONS.items() if d == dtype)


def resolve_precision(device: torch.device, name: str | None) -> tuple[torch.dtype, str | None]:
    """The dtype to run in, and a one-line notice when the request was changed
    (devices.expected_precision)."""
    precision, notice = expected_precision(device.type, name)
    return PRECISIONS[precision], notice


@dataclass(frozen=True)
class SynthesisSettings:
    sigma: float = FIELDS["sigma"].default   # the run's default (config.py), written there alone
    denoiser_strength: float = REFERENCE_DENOISER_STRENGTH
    decode: DecodeSettings = DecodeSettings()
    # WaveGlow's activations at once; a batch runs in slices within it (the GPU default's cap)
    waveglow_memory_gib: float = WAVEGLOW_MEMORY_SHARE["cuda"][1]
    # Result.mel filled in. Off, the mels stay on the device: their host copy
    # was a third of the audio's bytes and half the pinned blocks of a run
    # (the pipeline asks for them only with --save-mels).
    return_mels: bool = True
    # Each line's alignment checked against these, and a line that fails
    # decoded again with its retry seeds (Job.retry_seeds); None: no checks.
    alignment: Thresholds | None = None


@dataclass(frozen=True)
class Job:
    ids: list[int]          # symbol ids of one line (or piece)
    seed: int               # its own seed (prenet dropout, WaveGlow noise)
    frames: int | None = None  # decode exactly this many frames, the gate aside (the bench; tests)
    index: int = -1         # the caller's number for it (the pipeline's: its place in the run's work)
    retry_seeds: tuple[int, ...] = ()  # the seeds of its retries, should its alignment fail
    # Set by the decoder: the kept attempt's alignment check (``seed`` is then that attempt's).
    checked: Checked | None = None


@dataclass(frozen=True)
class Result:
    audio: np.ndarray       # (samples,) float32, samples = frames * hop
    mel: np.ndarray | None  # (n_mel, frames) float32, the postnet mel; None unless return_mels
    frames: int
    truncated: bool         # hit max_decoder_steps without the gate firing
    checked: Checked | None = None   # its alignment check; None when the run checks none


# Both streams run at the default CUDA priority: the decoder's stream at the
# highest measured no faster end to end (BENCHMARKS.md, tried and lost).
# The denoiser's spectra for at most this many bytes of a batch at once.
DENOISER_SLICE_BYTES = 2 ** 30
# On CUDA the denoiser transforms this many frames at a time: cuFFT makes a
# plan for each new transform shape, and with shapes following the batch a
# process's first corpus run would make a pair for every batch length. Of
# the fixed sizes timed, this one was as fast as any (fewer, larger
# transforms; BENCHMARKS.md, tried and lost).
DENOISER_FFT_ROWS = 16384


class Engine:
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
                 dtype: torch.dtype, settings: SynthesisSettings, fast: bool = True):
        self.device, self.dtype, self.settings, self.fast = device, dtype, settings, fast
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
        # One-line notices for the run: a model the fast path cannot serve runs plain.
        self.notices: list[str] = []
        # built from the float32 weights too (the folds are computed in float32)
        self.fast_waveglow = None
        if self.fast and supports(waveglow.dims):
            self.fast_waveglow = FastWaveGlow(waveglow.to(device), dtype)
        elif self.fast:
            self.notices.append(f"this WaveGlow's dilated convolutions have {waveglow.dims.wn_kernel} taps; "
                                "the fast path needs 3, so it runs as the plain model (slower)")
        self.tacotron2 = tacotron2.to(device=device, dtype=dtype).eval()
        self.waveglow = waveglow.to(device=device, dtype=dtype).eval()
        on_gpu = self.fast and device.type == "cuda"
        self.graphed = GraphedDecoder(self.tacotron2, settings.decode) if on_gpu else None
        # First run of these shapes on this machine: Triton compiles the kernels.
        self.compiled = None
        if on_gpu and kernels.available():
            self.compiled = kernels.CompiledMark(f"{tacotron2.dims} {waveglow.dims} {dtype}")
            kernels.remembered_triton_key()
            if not self.compiled.seen():
                self.notices.append(f"first run of this voice in {precision_name(dtype)} on this machine: "
                                    f"compiling its GPU kernels, {kernels.FIRST_COMPILE} (once; later runs "
                                    f"load them from {self.compiled.path.parent})")
        # WaveGlow runs over at most this many (item x group step) rows at once,
        # which bounds its memory whatever the batch (15 GiB: ~1M rows in fp16).
        dims = self.fast_waveglow.padded_dims if self.fast_waveglow is not None else self.waveglow.dims
        self.max_waveglow_rows = waveglow_rows_within(settings.waveglow_memory_gib * 2 ** 30, dims, dtype)
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

    @property
    def hop_length(self) -> int:
        return self.waveglow.dims.hop_length

    def eager(self) -> "Engine":
        """This engine without its fast paths (the reference's way of running)."""
        plain = copy.copy(self)
        plain.fast, plain.graphed = False, None
        return plain

    def unchecked(self) -> "Engine":
        """This engine, on the same models and graphs, without the alignment checks."""
        plain = copy.copy(self)
        plain.settings = dataclasses.replace(self.settings, alignment=None)
        return plain

    @_on_its_device
    @torch.inference_mode()
    def decode_only(self, jobs: list[Job]) -> Decoded:
        """Tacotron2 for one batch, unchecked: ``tacotron2.Decoded``."""
        ids, lengths = pad_sequences([j.ids for j in jobs], device=self.device)
        seeds = torch.tensor([j.seed for j in jobs], dtype=torch.long, device=self.device)
        override = None
        if any(j.frames is not None for j in jobs):
            override = torch.tensor([j.frames or 0 for j in jobs], device=self.device)
        if self.graphed is not None:
            return self.graphed.decode(ids, lengths, seeds, override)
        return decode(self.tacotron2, ids, lengths, seeds, self.settings.decode, override)

    @_on_its_device
    @torch.inference_mode()
    def decode_checked(self, jobs: list[Job], alone=None):
        """``decode_only`` with the alignment checks: a line that fails them
        is decoded again with each of its retry seeds in turn until one
        passes, and its best attempt kept (``alignment.best``). Returns the
        jobs as kept (each with its kept attempt's seed, which WaveGlow's
        noise then follows, and its ``checked``), the kept attempts'
        (mel, frames, truncated), and their frames and verdicts on the host.
        A job with forced frames is checked but not retried. ``alone(b, t)``:
        a context to decode a batch of b lines of up to t symbols in, when
        that shape was not met before (on CUDA it may need a graph captured)."""
        t = self.settings.alignment
        decoded = self.decode_only(jobs)
        if t is None:
            return jobs, decoded[:3], (decoded.frames.tolist(), decoded.truncated.tolist())
        tried = [[health] for health in self._health(jobs, decoded)]
        attempts, rows = [decoded], [list(range(len(jobs)))]   # attempt k decoded rows[k]
        failing = [n for n, job in enumerate(jobs) if job.frames is None and tried[n][0].failures(t)]
        for k in range(1, 1 + max(len(job.retry_seeds) for job in jobs)):
            failing = [n for n in failing if len(jobs[n].retry_seeds) >= k]
            if not failing:
                break
            again = [dataclasses.replace(jobs[n], seed=jobs[n].retry_seeds[k - 1]) for n in failing]
            with alone(len(again), max(len(job.ids) for job in again)) if alone else contextlib.nullcontext():
                attempts.append(self.decode_only(again))
            rows.append(failing)
            for n, health in zip(failing, self._health(again, attempts[-1])):
                tried[n].append(health)
            failing = [n for n in failing if tried[n][-1].failures(t)]
        kept = [best(healths, t) for healths in tried]
        counts = [h[k].frames for h, k in zip(tried, kept)]
        kept_jobs = [dataclasses.replace(job, seed=job.seed if k == 0 else job.retry_seeds[k - 1],
                                         checked=Checked(tried[n][k], tuple(tried[n][k].failures(t)), k + 1,
                                                         len(tried[n])))
                     for n, (job, k) in enumerate(zip(jobs, kept))]
        return kept_jobs, self._kept(attempts, rows, kept, max(counts)), (counts, [not h[k].gated for h, k in
                                                                               zip(tried, kept)])

    def _health(self, jobs: list[Job], decoded: Decoded) -> list["Measured"]:
        """Each job's alignment health (``measured``)."""
        lengths = torch.tensor([len(job.ids) for job in jobs], device=self.device)
        return measured(decoded, lengths, max(len(job.ids) for job in jobs))

    @staticmethod
    def _kept(attempts: list[Decoded], rows: list[list[int]], kept: list[int], longest: int):
        """(mel, frames, truncated) of each row's kept attempt; ``longest``:
        the most frames among them."""
        first = attempts[0]
        if not any(kept):
            return first.mel, first.frames, first.truncated
        mel = first.mel.new_zeros(first.mel.shape[0], first.mel.shape[1], longest)
        width = min(longest, first.mel.shape[2])
        mel[:, :, :width] = first.mel[:, :, :width]
        frames, truncated = first.frames.clone(), first.truncated.clone()
        for k in range(1, len(attempts)):
            mine = [n for n in rows[k] if kept[n] == k]
            if not mine:
                continue
            at = torch.tensor([rows[k].index(n) for n in mine], device=mel.device)
            to = torch.tensor(mine, device=mel.device)
            width = min(longest, attempts[k].mel.shape[2])
            mel[to] = 0
            mel[to, :, :width] = attempts[k].mel[at, :, :width]
            frames[to] = attempts[k].frames[at]
            truncated[to] = attempts[k].truncated[at]
        return mel, frames, truncated

    @_on_its_device
    @torch.inference_mode()
    def vocode(self, mel: torch.Tensor, frames: torch.Tensor,
               seeds: torch.Tensor | None = None) -> torch.Tensor:
        """WaveGlow for one batch: float32 audio (B, F*hop), garbage past frames*hop."""
        if seeds is None:
            seeds = torch.zeros(mel.shape[0], dtype=torch.long, device=self.device)
        step = self._items_within_rows(mel.shape[2])
        return torch.cat([self._vocode(mel[i: i + step], frames[i: i + step], seeds[i: i + step])
                          for i in range(0, mel.shape[0], step)])

    def _items_within_rows(self, frames: int) -> int:
        """How many lines of ``frames`` mel frames WaveGlow runs at once within
        ``max_waveglow_rows`` (at least one)."""
        return max(1, self.max_waveglow_rows // (frames * self.hop_length // self.waveglow.dims.n_group))

    def _vocode(self, mel, frames, seeds):
        sigma = self.settings.sigma
        if self.fast and self.fast_waveglow is not None:
            return self.fast_waveglow.infer(mel, frames, seeds, sigma)
        return self.waveglow.infer(mel, frames, seeds, sigma, self.inverse_weights)

    @_on_its_device
    @torch.inference_mode()
    def synthesize(self, jobs: list[Job]) -> list[Result]:
        """One batch, results in the order of ``jobs``."""
        kept, decoded, host = self.decode_checked(jobs)
        return self._vocode_and_finish(kept, *decoded)

    @torch.inference_mode()
    def _vocode_and_finish(self, jobs: list[Job], mel: torch.Tensor, frames: torch.Tensor,
                           truncated: torch.Tensor) -> list[Result]:
        return self._finish(self._vocode_launch(jobs, mel, frames, truncated))

    @torch.inference_mode()
    def _vocode_launch(self, jobs: list[Job], mel: torch.Tensor, frames: torch.Tensor,
                       truncated: torch.Tensor, counts: list[int] | None = None,
                       cut: list[bool] | None = None) -> "_Launched":
        """WaveGlow, the denoiser and the copies to the host for one batch,
        queued on the current stream; ``_finish`` waits for them. ``counts``
        and ``cut``: ``frames`` and ``truncated`` already on the host (read
        here they would wait for everything queued on this stream before)."""
        if counts is None:
            counts, cut = frames.tolist(), truncated.tolist()
        seeds = torch.tensor([j.seed for j in jobs], dtype=torch.long, device=self.device)
        audio = self.vocode(mel, frames, seeds)     # (B, F*hop) float32
        if self.denoiser is not None:
            audio = self._denoise(audio, frames * self.hop_length, counts)
        # One copy of the whole batch each: per-item copies would stall the stream.
        overlap = self.device.type == "cuda"
        audio = _to_host(audio, overlap)
        mel = _to_host(mel.float(), overlap) if self.settings.return_mels else None
        return _Launched(jobs, audio, mel, counts, cut, _record_event(self.device) if overlap else None)

    def _finish(self, launched: "_Launched") -> list[Result]:
        if launched.ready is not None:
            launched.ready.synchronize()
        audio = launched.audio.numpy()
        mel = launched.mel.numpy() if launched.mel is not None else None
        return [Result(audio=audio[i, : n * self.hop_length], mel=mel[i, :, :n] if mel is not None else None,
                       frames=n, truncated=launched.cut[i], checked=launched.jobs[i].checked)
                for i, n in enumerate(launched.counts)]

    def _denoise(self, audio: torch.Tensor, samples: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The denoiser over a batch's audio, each item on its own samples,
        in slices of items (its spectra take ~64 bytes per sample)."""
        strength = self.settings.denoiser_strength
        step = max(1, DENOISER_SLICE_BYTES // (64 * audio.shape[1]))
        for i in range(0, audio.shape[0], step):
            audio[i: i + step] = self.denoiser.batch(audio[i: i + step], samples[i: i + step], strength)
        return audio

    def synthesize_all(self, batches: Iterable[list[Job]], depth: int = 2,
                       stop: threading.Event | None = None, abort: threading.Event | None = None
                       ) -> Iterator[tuple[list[Job], list[Result] | Exception]]:
        """``synthesize`` over many batches, run ahead on background threads so
        the GPU keeps working while the caller writes files. On CUDA, Tacotron2
        (decoder graphs, small kernels) and WaveGlow (large products) run on two
        threads and two streams, so the decoder's work fills WaveGlow's gaps.

        Yields ``(jobs, results)`` in batch order, where ``results`` is the
        jobs' results or the SynthesisError that failed them. A batch that runs out
        of GPU memory is split in halves and retried, down to single jobs, so
        one batch may come back as several smaller ones (on CPU a batch also
        comes back in the slices WaveGlow runs at once); only a job that fails
        alone comes back with the error.

        The decoder works at most one batch ahead of WaveGlow. Once ``stop``
        is set no batch enters the decoder, and one that finishes decoding
        after it is dropped; the batches decoded before it still come out.
        Once ``abort`` is set, or the caller stops iterating (close the
        generator: ``contextlib.closing``), nothing more comes out and the
        work in flight is dropped at its next slice. On every way out the
        two threads are stopped and joined before this returns."""
        batches = list(batches)
        # A decoder graph captured while the other thread launches WaveGlow's
        # work can fail (CUDA forbids some calls from any thread during a
        # capture), so a capture after this start-up (a shape met only when
        # a batch is split, or every shape if out of memory here) runs with
        # the GPU to the decoder alone: WaveGlow's thread holds this lock
        # while it works.
        gpu_alone, capture_later = threading.RLock(), False
        if self.graphed is not None:
            try:
                with self.on_device():
                    self.graphed.prepare({(len(jobs), max(len(j.ids) for j in jobs)) for jobs in batches})
            except torch.cuda.OutOfMemoryError:
                self._release_memory()
                capture_later = True
        stop, abort, halt = stop or threading.Event(), abort or threading.Event(), threading.Event()
        decoded: queue.Queue = queue.Queue()
        results: queue.Queue = queue.Queue(maxsize=depth)
        stages = [_start(self._decode_stage, decoded, halt, batches, stop, gpu_alone, capture_later),
                  _start(self._vocode_stage, results, halt, decoded, gpu_alone)]
        try:
            while (item := _get(results, abort)) is not _DONE:
                if isinstance(item, _Crash):
                    raise item.error
                if self.compiled is not None and not isinstance(item[1], Exception):
                    self.compiled.remember()
                    self.compiled = None
                yield item
        finally:
            halt.set()
            for thread in stages:
                thread.join()

    def _stream(self):
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return torch.cuda.stream(torch.cuda.Stream(self.device))

    def _release_memory(self) -> None:
        """Hand cached blocks back before retrying smaller: the failed batch's
        allocations are free now but still held by the caching allocator."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def _decode_stage(self, batches: list[list[Job]], stop: threading.Event, gpu_alone: threading.RLock,
                      capture_later: bool, out: queue.Queue, halt: threading.Event) -> None:
        with self._stream():
            for jobs in batches:
                # One batch decoded ahead of WaveGlow keeps both busy; more
                # only lengthens what a stop leaves to finish.
                _wait_until_taken(out, halt)
                if stop.is_set() or halt.is_set():
                    break
                with gpu_alone if capture_later else contextlib.nullcontext():
                    self._decode_split(jobs, out, stop, halt, gpu_alone)
        _put(out, _DONE, halt)

    def _decode_split(self, jobs: list[Job], out: queue.Queue, stop: threading.Event,
                      halt: threading.Event, gpu_alone: threading.RLock) -> None:
        """Decode ``jobs``; out of memory, decode each half on its own. A
        batch whose decoding ends after ``stop`` was set is dropped: WaveGlow
        would take far longer over it than the decoder did."""
        try:
            # frames and verdicts read on this stream, not behind WaveGlow's queue
            jobs, decoded, host = self.decode_checked(jobs, self._alone_for_new_shapes(gpu_alone))
        except torch.cuda.OutOfMemoryError as e:
            error = _failure(e)
        except RuntimeError as e:
            _put(out, (jobs, _failure(e)), halt)
            return
        else:
            if not stop.is_set():
                _put(out, (jobs, decoded, _record_event(self.device), host), halt)
            return
        # out of memory: retried outside the except clause, as _vocode_split does
        if len(jobs) == 1:
            _put(out, (jobs, error), halt)
            return
        with gpu_alone:   # the halves' shapes may need graphs captured
            self._release_memory()
            for half in _halves(jobs):
                if not halt.is_set():
                    self._decode_split(half, out, stop, halt, gpu_alone)

    def _alone_for_new_shapes(self, gpu_alone: threading.RLock):
        """``decode_checked``'s ``alone``: a retry batch whose decoder graph
        is not captured yet is decoded with the GPU to the decoder alone
        (see ``synthesize_all``)."""
        @contextlib.contextmanager
        def alone(batch: int, symbols: int):
            if self.graphed is not None and not self.graphed.captured(batch, symbols):
                with gpu_alone:
                    yield
            else:
                yield
        return alone

    @torch.inference_mode()
    def _vocode_stage(self, decoded: queue.Queue, gpu_alone: threading.RLock, out: queue.Queue,
                      halt: threading.Event) -> None:
        """Vocode each decoded batch, results in batch order; the next
        batch's GPU work is queued before the previous batch is waited for
        and handed on (``_vocode_item``)."""
        pending = None
        with self._stream():
            while (item := _get(decoded, halt)) is not _DONE:
                decoded.task_done()
                with gpu_alone:
                    if isinstance(item, _Crash):
                        self._hand_on(pending, out, halt)
                        _put(out, item, halt)
                        return
                    pending = self._vocode_item(item, pending, out, halt)
            with gpu_alone:
                self._hand_on(pending, out, halt)
        _put(out, _DONE, halt)

    def _vocode_item(self, item, pending: "_Launched | None", out: queue.Queue,
                     halt: threading.Event) -> "_Launched | None":
        """One decoded batch (or the error that failed it) through WaveGlow;
        the batch launched last, whose results are still to be handed on."""
        jobs, tensors, *rest = item
        if isinstance(tensors, Exception):
            self._hand_on(pending, out, halt)
            _put(out, (jobs, tensors), halt)
            return None
        event, host = rest
        _wait_for(event, tensors, self.device)
        for part_jobs, part, part_host in self._waveglow_parts(jobs, tensors, host):
            if halt.is_set():
                break
            # Queued before the previous batch is waited for and handed on,
            # so WaveGlow's stream does not idle while this thread turns a
            # finished batch into host arrays.
            try:
                launched = self._vocode_launch(part_jobs, *part, *part_host)
            except RuntimeError:
                launched = None   # out of memory among them: the halving path below, in order
            self._hand_on(pending, out, halt)
            pending = launched
            if launched is None:
                self._vocode_split(part_jobs, part, out, halt)
        return pending

    def _waveglow_parts(self, jobs: list[Job], tensors, host):
        """A decoded batch as WaveGlow runs it: on CUDA whole; on CPU, where a
        batch can take WaveGlow minutes, in the slices of whole lines that
        ``vocode`` would run one after another anyway (same shapes, same
        audio), each on its own, so that a halted run waits for one slice."""
        if self.device.type == "cuda":
            return [(jobs, tensors, host)]
        mel, frames, truncated = tensors
        counts, cut = host
        step = self._items_within_rows(mel.shape[2])
        return [(jobs[i: i + step], (mel[i: i + step], frames[i: i + step], truncated[i: i + step]),
                 (counts[i: i + step], cut[i: i + step])) for i in range(0, len(jobs), step)]

    def _hand_on(self, launched: "_Launched | None", out: queue.Queue, halt: threading.Event) -> None:
        """Wait for a launched batch and put its results out (None: nothing)."""
        if launched is None:
            return
        try:
            _put(out, (launched.jobs, self._finish(launched)), halt)
        except RuntimeError as e:
            _put(out, (launched.jobs, _failure(e)), halt)

    def _vocode_split(self, jobs: list[Job], tensors, out: queue.Queue, halt: threading.Event) -> None:
        """Vocode one decoded batch; out of memory, vocode each half on its own
        (each half's mel cut to its own longest line)."""
        try:
            _put(out, (jobs, self._vocode_and_finish(jobs, *tensors)), halt)
            return
        except torch.cuda.OutOfMemoryError as e:
            error = _failure(e)
        except RuntimeError as e:
            _put(out, (jobs, _failure(e)), halt)
            return
        # Retried here, outside the except clause, where the failed attempt's
        # frames and the activations they held are gone.
        if len(jobs) == 1:
            _put(out, (jobs, error), halt)
            return
        self._release_memory()
        mel, frames, truncated = tensors
        middle = (len(jobs) + 1) // 2
        for part in (slice(0, middle), slice(middle, len(jobs))):
            if halt.is_set():
                return
            longest = int(frames[part].max())
            self._vocode_split(jobs[part], (mel[part, :, :longest], frames[part], truncated[part]), out, halt)


# alignment_measures' measures that count symbols
_WHOLE = ("backward_jump", "forward_jump", "symbols_left")


@dataclass(frozen=True)
class Measured(Health):
    """A decoded row's health and its frames."""
    frames: int = 0


def measured(decoded: Decoded, lengths: torch.Tensor, symbols: int) -> list[Measured]:
    """Each decoded row's alignment health (``tacotron2.alignment_measures``),
    read to the host in one copy; ``lengths``: the rows' symbols (on the
    decoder's device), ``symbols``: the padded length of their ids."""
    measures = alignment_measures(decoded.attention, decoded.frames, lengths, symbols)
    names = list(measures)
    table = torch.stack([measures[name].double() for name in names]
                        + [decoded.frames.double(), decoded.truncated.double()], 1).tolist()
    return [Measured(frames=int(row[-2]), gated=not row[-1],
                     **{name: (int(v) if name in _WHOLE else v) for name, v in zip(names, row)})
            for row in table]


@dataclass
class _Launched:
    """One batch whose GPU work and copies are queued: its results once
    ``ready`` (None: the copies were synchronous) has passed."""
    jobs: list[Job]
    audio: torch.Tensor     # host (B, F*hop) float32
    mel: torch.Tensor | None  # host (B, n_mel, F) float32; None unless return_mels
    counts: list[int]
    cut: list[bool]
    ready: object | None


def _to_host(tensor: torch.Tensor, asynchronous: bool) -> torch.Tensor:
    """A host copy; ``asynchronous``: into pinned memory, queued on the current
    stream (valid once an event recorded after it has passed)."""
    if not asynchronous:
        return tensor.cpu()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class SynthesisError(Exception):
    """Why a batch (or, out of memory, a single line) came back without
    audio, as one line for its manifest rows. It holds no traceback: the
    failed attempt's frames hold its tensors, GPU memory included, for as
    long as their traceback is kept (a retry inside the except clause, or a
    line's error handed on), and out of memory the retries then fail too."""

    def __init__(self, reason: str, out_of_memory: bool = False):
        super().__init__(reason)
        self.out_of_memory = out_of_memory


def _failure(error: Exception) -> SynthesisError:
    """``error`` as the SynthesisError that goes out instead (traceback left behind)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return SynthesisError(f"out of GPU memory even in a batch of one: {first_line(error)}", True)
    return SynthesisError(f"synthesis failed: {first_line(error)}")


def _halves(jobs: list[Job]) -> list[list[Job]]:
    middle = (len(jobs) + 1) // 2
    return [jobs[:middle], jobs[middle:]]
