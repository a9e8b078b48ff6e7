"""``tts-batch bench``: one run, one table, the product measured as it runs.

Builds Tacotron2 and WaveGlow with random weights in the published shapes (no
download), runs a corpus end to end through the same pipeline as ``tts-batch``
(WAVs and manifest written to a temporary directory), and measures in the same
process: audio seconds per wall second, GPU busy fraction (profiler trace),
Tacotron2 ms per decoder step, WaveGlow alone and its TFLOP/s against a matmul
ceiling measured now, peak memory, startup time, and the same lines through a
naive batch-of-one loop of our own models (the reference's way of running).
Speed is only speed at the quality bar, so the same table gives the fast
WaveGlow's error in the run's dtype on trained weights: the demo voice's
WaveGlow on mels from its own Tacotron2 (quality.py), beside the eager
model's in that dtype.

Random weights never stop on their own, so the bench swaps its Tacotron2's
stop rule from outside (``force_lengths``): every line decodes round(5.7 x
symbols) frames (LJSpeech's average speaking rate), at most
max_decoder_steps; the gate is still computed every step. Its lines are
checked but not retried (``retries`` 0): each is decoded once, to its fixed
length, so every run times the same work.

Under torchrun (``run_bench_processes``) only the end-to-end run is measured,
over all processes, one GPU each, with the same random weights everywhere; the
other measures describe one GPU. ``end_to_end_only`` gives the same figures in
one process, the single-GPU side of the scaling ratio.

The models come from ``random_models``, looked up when the engine is built:
the tests put tiny models in its place.
"""
from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tts_cli import distributed
from tts_cli import text as frontend
from tts_cli.config import BATCH_SIZES, REFERENCE_SAMPLE_RATE, Settings, load_settings
from tts_cli.corpus import read_corpus
from tts_cli.decode_rules import StopAfter
from tts_cli.distributed import Group
from tts_cli.engine import Engine, Job, precision_name, resolve_device, resolve_precision
from tts_cli.pipeline import RunSummary
from tts_cli.loading import load_models
from tts_cli.quality import QUALITY_LINES, Fidelity, voice_mels, waveglow_fidelity
from tts_cli.synthesizer import Synthesizer
from tts_cli.tacotron2 import PUBLISHED_DIMS as TACOTRON2_DIMS, Tacotron2
from tts_cli.voice import demo_voice
from tts_cli.waveglow import PUBLISHED_DIMS as WAVEGLOW_DIMS, WaveGlow, WaveGlowDims

FRAMES_PER_SYMBOL = 5.7
SAMPLE_CORPUS = Path(__file__).parent / "data" / "ljspeech_2000.psv"


def random_models(device: torch.device, seed: int = 0) -> tuple[Tacotron2, WaveGlow]:
    """Full-size models with PyTorch's default initialisation; the 1x1
    convolutions are random rotations (invertible), as WaveGlow initialises
    them. For a GPU only: refused on CPU, where the bench's 2,000 lines would
    take hours and its figures (GPU busy, TFLOP/s) mean nothing."""
    if device.type != "cuda":
        raise ValueError("bench measures the GPU path and its figures are GPU figures; on CPU "
                         f"({'no CUDA device here' if not torch.cuda.is_available() else '--device cpu'}) it is "
                         "refused. To time a CPU run, synthesize a corpus with --device cpu: its summary "
                         "gives audio seconds per second")
    torch.manual_seed(seed)
    tacotron2, waveglow = Tacotron2(TACOTRON2_DIMS).eval(), WaveGlow(WAVEGLOW_DIMS).eval()
    for conv in waveglow.convinv:
        c = conv.conv.weight.shape[0]
        conv.conv.weight.data = torch.linalg.qr(torch.randn(c, c))[0][:, :, None]
    return tacotron2, waveglow


def waveglow_flops_per_sample(d: WaveGlowDims, folded: bool = False) -> float:
    """Multiply-adds x 2 of WaveGlow's inverse per audio sample: the reference's
    arithmetic (upsampler, then conditioning), or with ``folded`` what the fast
    path executes (upsampler folded into the conditioning, skip outputs folded
    into the end layer; see waveglow_fast.py)."""
    c, layers, per_step = d.wn_channels, d.wn_layers, 0
    cond_inputs = (d.upsample_kernel // d.hop_length if folded else d.n_group) * d.n_mel
    remaining = d.n_group
    for k in range(d.n_flows):
        if k % d.n_early_every == 0 and k > 0:
            remaining -= d.n_early_size
        half = remaining // 2
        per_step += half * c + cond_inputs * 2 * c * layers               # start, conditioning
        per_step += layers * c * d.wn_kernel * 2 * c                      # dilated convolutions
        if folded:   # residual halves only; skip halves and end folded into one (L*C, 2h)
            per_step += (layers - 1) * c * c + layers * c * 2 * half
        else:
            per_step += (layers - 1) * c * 2 * c + c * c + c * 2 * half   # res/skip, end
        per_step += remaining * remaining                                 # 1x1 inverse
    upsample = 0 if folded else d.n_mel * d.n_mel * d.upsample_kernel / d.hop_length
    return 2.0 * (per_step / d.n_group + upsample)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, repeats: int = 3) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_ceiling_tflops(device: torch.device, dtype: torch.dtype) -> float:
    """An 8192^3 product on random data, the rate the GPU's matrix units reach now."""
    if device.type != "cuda":
        return float("nan")
    a = torch.randn(8192, 8192, device=device, dtype=dtype)
    b = torch.randn(8192, 8192, device=device, dtype=dtype)
    seconds = _timed(lambda: [a @ b for _ in range(10)], device) / 10
    return 2 * 8192 ** 3 / seconds / 1e12


def gpu_busy(run, device: torch.device, trim: float = 0.25) -> float:
    """Union of kernel and copy intervals over wall time while ``run()`` runs,
    in steady state: the first and last ``trim`` of the wall time (pipeline
    filling and draining) are left out."""
    if device.type != "cuda":
        return float("nan")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("bench.window"):
            run()
            _sync(device)
    events = prof.events()
    window = next(e for e in events if e.name == "bench.window").time_range
    span = window.end - window.start
    intervals = [(e.time_range.start, e.time_range.end)
                 for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return covered_fraction(intervals, window.start + trim * span, window.end - trim * span)


def covered_fraction(intervals, lo: float, hi: float) -> float:
    """Fraction of [lo, hi] covered by the union of (start, end) intervals
    (kernels on several streams overlap; overlapping time counts once)."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    busy, end = 0.0, lo
    for s, e in clipped:
        if e > end:
            busy += e - max(s, end)
            end = e
    return busy / (hi - lo)


@dataclass
class BenchSettings:
    corpus: Path = SAMPLE_CORPUS
    format: str = "ljspeech"
    lines: int | None = None          # first N lines; None = all
    batch_size: int = BATCH_SIZES["cuda"]
    baseline_lines: int = 10          # lines through the naive batch-of-one loop
    device: str | None = None
    precision: str | None = None
    end_to_end_only: bool = False     # only the corpus run, as under torchrun


SKIPPED_UNDER_TORCHRUN = (
    "bench: under torchrun only the end-to-end run is measured, over all processes; GPU busy, "
    "decoder ms per step, WaveGlow TFLOP/s and the naive-loop baseline describe one GPU: plain "
    "tts-batch bench gives them")


def run_bench(b: BenchSettings, echo=print) -> dict:
    """Every measure, in this process; with ``b.end_to_end_only`` only the corpus run."""
    device, dtype, settings = _run_settings(b)
    corpus = _first_lines(b.corpus, b.lines)
    echo(_banner(b, device, settings.precision))
    engine, startup = _ready_engine(device, dtype, settings)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as tmp:
        summary = _corpus_run(settings, corpus, Path(tmp) / "out", engine)
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
        result = {**end_to_end_result(b, device, settings, summary, startup), "peak_gpu_memory_gib": peak}
        if b.end_to_end_only:
            return result
        echo("bench: the end-to-end run is done; the same without alignment checks, then again with them")
        checks = _alignment_checks_cost(settings, corpus, Path(tmp), engine)
        echo("bench: the same as 16 kHz FLAC")
        dataset = _dataset_output_cost(settings, corpus, Path(tmp), engine,
                                       checks["audio_seconds_per_second_checked_again"])
        echo("bench: measuring the stages")
        made = summary.lines - summary.counts["skipped"] - summary.counts["error"] - summary.counts["pending"]
        window = _first_lines(b.corpus, min(4 * b.batch_size, made or 1), Path(tmp) / "w.txt")
        busy = gpu_busy(lambda: _corpus_run(replace(settings, force=True), window, Path(tmp) / "busy", engine),
                        device)
        baseline = _baseline(engine, b, settings, Path(tmp))
    step_ms_1 = _decoder_ms_per_step(engine, 1)
    frames_per_second = b.batch_size / _decoder_ms_per_step(engine, b.batch_size) * 1e3
    wg_tflops, wg_executed = _waveglow_tflops(engine)
    ceiling = matmul_ceiling_tflops(device, torch.float16 if dtype == torch.float32 else dtype)
    fidelity = demo_voice_fidelity(settings, b, device, dtype)
    waveglow_alone = wg_tflops * 1e12 / (waveglow_flops_per_sample(engine.waveglow.dims) * settings.sample_rate)
    hop = engine.waveglow.dims.hop_length
    return {
        **result,
        **checks,
        **dataset,
        "gpu_busy_fraction": busy,
        "decoder_ms_per_step_batch1": step_ms_1,
        "decoder_frames_per_second_bench_batch": frames_per_second,
        "decoder_alone_audio_seconds_per_second": frames_per_second * hop / settings.sample_rate,
        "waveglow_alone_audio_seconds_per_second": waveglow_alone,
        "waveglow_tflops": wg_tflops, "waveglow_executed_tflops": wg_executed,
        "matmul_ceiling_tflops": ceiling,
        "waveglow_fraction_of_ceiling": wg_tflops / ceiling,
        "end_to_end_share_of_waveglow_alone": summary.speed / waveglow_alone,
        "baseline_lines": baseline.lines,
        "baseline_audio_seconds_per_second": baseline.speed,
        "speedup_over_baseline": summary.speed / baseline.speed if baseline.speed else float("nan"),
        "waveglow_fast_snr_db_demo_voice": fidelity.fast if fidelity else float("nan"),
        "waveglow_eager_snr_db_demo_voice": fidelity.eager if fidelity else float("nan"),
    }


def demo_voice_fidelity(settings: Settings, b: BenchSettings, device: torch.device,
                        dtype: torch.dtype) -> Fidelity | None:
    """The fast WaveGlow and the eager one in ``dtype`` against eager
    float32 (quality.py) with the demo voice, on mels its Tacotron2 makes
    for the corpus's first QUALITY_LINES lines; None where the demo voice's
    files are not found."""
    voice = demo_voice()
    if voice is None:
        return None
    tacotron2, waveglow = load_models(settings, voice)
    texts = [u.text for u in read_corpus(b.corpus, b.format) if u.problem is None][:QUALITY_LINES]
    mel, frames, seeds = voice_mels(tacotron2, texts, device)
    return waveglow_fidelity(waveglow, mel, frames, seeds, dtype, settings.sigma)


def run_bench_processes(b: BenchSettings, group: Group, echo=print) -> dict | None:
    """The end-to-end run over a torchrun job (inside ``distributed.joined``):
    each process builds the same random models on its own device
    (``b.device``, from distributed.device_for) and warms up; then all run
    the corpus together, sharing one temporary output directory. The result
    on rank 0, None on the others, which print nothing."""
    device, dtype, settings = _run_settings(b)
    corpus = _first_lines(b.corpus, b.lines)
    if group.rank == 0:
        echo(_banner(b, device, settings.precision))
        echo(SKIPPED_UNDER_TORCHRUN)
    engine, startup = _ready_engine(device, dtype, settings)
    with _shared_temporary_directory(group) as tmp:
        distributed.barrier()   # every engine is warm: the wall time starts alike for all
        summary = _corpus_run(settings, corpus, tmp / "out", engine, group)
        startups = distributed.gather_to_first(group, startup)
    if group.rank != 0:
        return None
    return end_to_end_result(b, device, settings, summary, max(startups))


@contextlib.contextmanager
def _shared_temporary_directory(group: Group):
    """One temporary directory for the whole job: rank 0 makes it and sends
    the others its path. Removed once every process is done with it, by
    local rank 0 (on several machines each one has its own copy)."""
    made = tempfile.mkdtemp(prefix="tts-bench-") if group.rank == 0 else None
    path = Path(distributed.from_first(made))
    try:
        yield path
        distributed.barrier()
    finally:
        if group.local_rank == 0:
            shutil.rmtree(path, ignore_errors=True)


def _run_settings(b: BenchSettings) -> tuple[torch.device, torch.dtype, Settings]:
    """The device, its dtype and the pipeline settings the bench runs with."""
    device = resolve_device(b.device)
    dtype, _ = resolve_precision(device, b.precision)
    precision = precision_name(dtype)
    # random_models() are NVIDIA's voice's shape: its sample rate; lines
    # checked but not retried (the module docstring says why)
    settings = load_settings(overrides={"batch_size": b.batch_size, "format": b.format,
                                        "device": str(device), "precision": precision,
                                        "quiet": True, "seed": 0, "sample_rate": REFERENCE_SAMPLE_RATE,
                                        "retries": 0})
    return device, dtype, settings


def _banner(b: BenchSettings, device: torch.device, precision: str) -> str:
    return f"bench: {_device_name(device)} {precision}, torch {torch.__version__}, corpus {b.corpus.name}"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _ready_engine(device: torch.device, dtype: torch.dtype, settings: Settings) -> tuple[Engine, float]:
    """An engine on random_models(), its lines' lengths forced
    (``force_lengths``), warmed up, and the seconds that took."""
    _sync(device)
    started = time.perf_counter()
    engine = Engine(*random_models(device), device, dtype, settings)
    force_lengths(engine.tacotron2)
    _warm_up(engine, settings.batch_size)
    _sync(device)
    return engine, time.perf_counter() - started


def force_lengths(tacotron2: Tacotron2, frames_per_symbol: float = FRAMES_PER_SYMBOL) -> None:
    """Every line ``tacotron2`` decodes is round(frames_per_symbol x
    symbols) frames long (at most max_decoder_steps), its gate computed
    but not heeded: its decoder's stop rule swapped for a ``StopAfter``."""
    tacotron2.decoder.stop_rule = StopAfter(lambda lengths: (lengths.double() * frames_per_symbol).round())


@contextlib.contextmanager
def _every_line(tacotron2: Tacotron2, frames: int):
    """Every line ``tacotron2`` decodes in the block ``frames`` frames
    long, then its stop rule as it was (the graphed decoder keeps each
    rule's graphs apart)."""
    decoder = tacotron2.decoder
    kept, decoder.stop_rule = decoder.stop_rule, StopAfter(lambda lengths: torch.full_like(lengths, frames))
    try:
        yield
    finally:
        decoder.stop_rule = kept


def _warm_up(engine: Engine, batch_size: int) -> None:
    """One short line alone, 40 frames long, then on CUDA a full batch of
    lines one to eight sentences long, 100 frames each, through the
    threaded path a corpus takes, so a full batch's kernels are loaded
    (CUDA loads a kernel's module on first use) before the clock starts."""
    ids = frontend.text_to_sequence("Warming up the engine.")
    with _every_line(engine.tacotron2, 40):
        engine.synthesize([Job(ids, seed=0)])
    if engine.device.type != "cuda":
        return
    batch = [Job(ids * (1 + i % 8), seed=i) for i in range(batch_size)]
    with _every_line(engine.tacotron2, 100):
        for _, results in engine.synthesize_all([batch]):
            if isinstance(results, Exception):
                raise results


def _corpus_run(settings: Settings, corpus: Path, out: Path, engine: Engine,
                group: Group | None = None) -> RunSummary:
    """The corpus end to end through the pipeline, each line as long as the
    engine's stop rule makes it (``force_lengths``)."""
    return Synthesizer.around(engine, settings).synthesize_to_dir(
        read_corpus(corpus, settings.format), out, group=group)


def end_to_end_result(b: BenchSettings, device: torch.device, settings: Settings,
                      summary: RunSummary, startup: float) -> dict:
    """The corpus run, in one process or (rank 0's summary) over a torchrun
    job; ``startup``: the slowest process's build and warm-up."""
    return {
        "device": _device_name(device),
        "torch": torch.__version__, "precision": settings.precision, "corpus": str(b.corpus),
        "lines": summary.lines, "batch_size": b.batch_size,
        "audio_seconds": summary.audio_seconds, "wall_seconds": summary.wall_seconds,
        "audio_seconds_per_second": summary.speed,
        "processes": summary.processes,
        "audio_seconds_per_second_per_process": summary.speed / summary.processes,
        # a GPU-hour makes speed-per-GPU hours of audio
        "gpu_hours_per_1000_audio_hours": 1000 / (summary.speed / summary.processes),
        "startup_seconds": startup,
    }


def _first_lines(corpus: Path, n: int | None, to: Path | None = None) -> Path:
    if n is None:
        return corpus
    to = to or Path(tempfile.mkdtemp()) / corpus.name
    with open(corpus, "rb") as f:
        to.write_bytes(b"".join(line for _, line in zip(range(n), f)))
    return to


def _baseline(engine: Engine, b: BenchSettings, settings: Settings, tmp: Path) -> RunSummary:
    """The reference's way of running: batch of one, eager, line after line."""
    corpus = _first_lines(b.corpus, b.baseline_lines, tmp / "baseline.txt")
    return _corpus_run(replace(settings, batch_size=1), corpus, tmp / "baseline", engine.eager())


def _alignment_checks_cost(settings: Settings, corpus: Path, tmp: Path, engine: Engine) -> dict:
    """The corpus end to end without the alignment checks, then with them
    again (the bench retries no line, so no line is decoded twice: this is
    what measuring costs): their cost is 1 - again / without. The first
    run is left out of it: a process's first corpus run pays one-time costs
    (BENCHMARKS.md, Limits)."""
    without = _corpus_run(replace(settings, check_alignment=False), corpus, tmp / "unchecked",
                          engine.unchecked()).speed
    again = _corpus_run(settings, corpus, tmp / "checked", engine).speed
    return {"audio_seconds_per_second_unchecked": without, "audio_seconds_per_second_checked_again": again,
            "alignment_checks_cost": 1 - again / without}


DATASET_OUTPUT = {"sample_rate": 16000, "audio_format": "flac", "sample_format": "pcm16"}


def _dataset_output_cost(settings: Settings, corpus: Path, tmp: Path, engine: Engine, wav_speed: float) -> dict:
    """The corpus end to end as a recognizer's dataset wants it (16 kHz FLAC,
    resampled and encoded beside the GPU), as a share of the same run
    writing the voice's own rate as WAV just before it."""
    flac = _corpus_run(replace(settings, **DATASET_OUTPUT), corpus, tmp / "flac16k", engine).speed
    return {"audio_seconds_per_second_flac_16khz": flac, "flac_16khz_share_of_wav": flac / wav_speed}


def _decoder_ms_per_step(engine: Engine, batch: int) -> float:
    """Slope of decode time against steps: fixed costs (encoder, postnet)
    cancel. 800 steps apart, median of 3: at batch 1 that is ~30 ms against
    run-to-run noise of a few hundred microseconds."""
    ids = frontend.text_to_sequence("A sentence of ordinary length for timing the decoder steps.")
    def run(frames):
        with _every_line(engine.tacotron2, frames):
            return _timed(lambda: engine.decode_only([Job(ids, seed=i) for i in range(batch)]), engine.device)
    return (run(900) - run(100)) / 800 * 1e3


def _waveglow_tflops(engine: Engine) -> tuple[float, float]:
    """(reference arithmetic, executed arithmetic) per second of WaveGlow time, in TFLOP/s."""
    # 32 lines x 800 frames fills a GPU; a CPU gets a size it finishes.
    batch, frames = (32, 800) if engine.device.type == "cuda" else (1, 50)
    d = engine.waveglow.dims
    mel = torch.randn(batch, d.n_mel, frames, device=engine.device, dtype=engine.dtype)
    lengths = torch.full((batch,), frames, device=engine.device)
    seconds = _timed(lambda: engine.vocode(mel, lengths), engine.device)
    samples_per_second = batch * frames * d.hop_length / seconds
    return (waveglow_flops_per_sample(d) * samples_per_second / 1e12,
            waveglow_flops_per_sample(d, folded=engine.fast_waveglow is not None) * samples_per_second / 1e12)
