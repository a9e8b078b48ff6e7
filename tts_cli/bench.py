"""``tts-batch bench``: one run, one table, ratios measured side by side.

Builds Tacotron2 and WaveGlow with random weights in the published shapes (no
download), runs a corpus end to end through the same pipeline as ``tts-batch``
(WAVs and manifest written to a temporary directory), and measures in the same
process: audio seconds per wall second, GPU busy fraction (profiler trace),
Tacotron2 ms per decoder step, WaveGlow TFLOP/s against a matmul ceiling
measured now, peak memory, startup time, and the same lines through a naive
batch-of-one loop of our own models (the reference's way of running).

Random weights never stop on their own, so every line's decode length is fixed
at round(5.7 x symbols) frames (LJSpeech's average speaking rate) through the
benchmark-only frame override; the gate is still computed every step.

Under torchrun (``run_bench_processes``) only the end-to-end run is measured,
over all processes, one GPU each, with the same random weights everywhere; the
other measures describe one GPU. ``end_to_end_only`` gives the same figures in
one process, the single-GPU side of the scaling ratio.

The models come from ``random_models``, looked up when the engine is built:
the tests put tiny models in its place.
"""
from __future__ import annotations

import contextlib
import copy
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tts_cli import distributed, kernels
from tts_cli import text as frontend
from tts_cli.config import Settings, load_settings
from tts_cli.decoder_graph import GraphedDecoder
from tts_cli.distributed import Group
from tts_cli.engine import DECODER_FUSIONS, PRECISIONS, Engine, Job, resolve_device, resolve_precision
from tts_cli.pipeline import RunSummary, synthesize_corpus
from tts_cli.voice import synthesis_settings
from tts_cli.tacotron2 import PUBLISHED_DIMS as TACOTRON2_DIMS, Tacotron2
from tts_cli.waveglow import PUBLISHED_DIMS as WAVEGLOW_DIMS, WaveGlow, WaveGlowDims
from tts_cli.waveglow_fast import FastWaveGlow

FRAMES_PER_SYMBOL = 5.7
SAMPLE_CORPUS = Path(__file__).parent / "data" / "ljspeech_2000.psv"


def random_models(seed: int = 0) -> tuple[Tacotron2, WaveGlow]:
    """Full-size models with PyTorch's default initialisation; the 1x1
    convolutions are random rotations (invertible), as WaveGlow initialises them."""
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
    if device.type != "cuda":
        return float("nan")
    a = torch.randn(8192, 8192, device=device, dtype=dtype)
    b = torch.randn(8192, 8192, device=device, dtype=dtype)
    seconds = _timed(lambda: [a @ b for _ in range(10)], device) / 10
    return 2 * 8192 ** 3 / seconds / 1e12


def gpu_busy(run, device: torch.device, trim: float = 0.25) -> dict:
    """Union of kernel and copy intervals over wall time while ``run()`` runs,
    in steady state: the first and last ``trim`` of the wall time (pipeline
    filling and draining) are left out. Also the busiest stream's own share
    (WaveGlow's, in a corpus run): the gap between the two is time when only
    the other streams (the decoder, copies) kept the GPU busy, and the
    busiest stream's idle share is time WaveGlow waited."""
    if device.type != "cuda":
        return {"gpu_busy_fraction": float("nan"), "gpu_busy_busiest_stream_fraction": float("nan"),
                "busiest_stream_long_gaps": 0, "busiest_stream_long_gap_fraction": float("nan")}
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("bench.window"):
            run()
            _sync(device)
    events = prof.events()
    window = next(e for e in events if e.name == "bench.window").time_range
    span = window.end - window.start
    lo, hi = window.start + trim * span, window.end - trim * span
    intervals = [(getattr(e, "device_resource_id", None), e.time_range.start, e.time_range.end)
                 for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    every, busiest = busy_fractions(intervals, lo, hi)
    gaps = idle_gaps(busiest_stream(intervals, lo, hi), lo, hi, LONG_GAP_US)
    return {"gpu_busy_fraction": every, "gpu_busy_busiest_stream_fraction": busiest,
            "busiest_stream_long_gaps": len(gaps),
            "busiest_stream_long_gap_fraction": sum(gaps) / (hi - lo)}


LONG_GAP_US = 1000.0   # profiler times are in microseconds


def idle_gaps(intervals, lo: float, hi: float, at_least: float) -> list[float]:
    """Lengths of the idle stretches of [lo, hi] (outside the union of
    (start, end) intervals) that last at least ``at_least``: a few long ones
    mean the stream waited for work (the decoder, the host); many short ones
    mean launches could not keep up."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    gaps, end = [], lo
    for s, e in clipped + [(hi, hi)]:
        if s - end >= at_least:
            gaps.append(s - end)
        end = max(end, e)
    return gaps


def busy_fractions(intervals, lo: float, hi: float) -> tuple[float, float]:
    """(all streams, the busiest stream alone): covered fractions of [lo, hi]
    by (stream, start, end) intervals."""
    every = covered_fraction([(start, end) for _, start, end in intervals], lo, hi)
    return every, covered_fraction(busiest_stream(intervals, lo, hi), lo, hi)


def busiest_stream(intervals, lo: float, hi: float) -> list:
    """The (start, end) intervals of the stream that covers most of [lo, hi]."""
    by_stream: dict = {}
    for stream, start, end in intervals:
        by_stream.setdefault(stream, []).append((start, end))
    return max(by_stream.values(), key=lambda one: covered_fraction(one, lo, hi), default=[])


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
    batch_size: int = 128
    baseline_lines: int = 20          # lines through the naive batch-of-one loop
    device: str | None = None
    precision: str | None = None
    end_to_end_only: bool = False     # only the corpus run, as under torchrun
    repeat: int = 1                   # with end_to_end_only: corpus runs in this process
    warm_up: str = "batch"            # one of BENCH_WARM_UPS


SKIPPED_UNDER_TORCHRUN = (
    "bench: under torchrun only the end-to-end run is measured, over all processes; GPU busy, "
    "decoder ms per step, WaveGlow TFLOP/s, the naive-loop baseline and --profile describe one "
    "GPU: plain tts-batch bench gives them")


def run_bench(b: BenchSettings, echo=print) -> dict:
    """Every measure, in this process; with ``b.end_to_end_only`` only the corpus run."""
    device, dtype, settings = _run_settings(b)
    precision = settings.precision
    corpus = _first_lines(b.corpus, b.lines)
    echo(_banner(b, device, precision))
    engine, startup = _ready_engine(device, dtype, settings, b.warm_up)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    with tempfile.TemporaryDirectory() as tmp:
        before = _one_off_counters(engine, device)
        summary = _corpus_run(settings, corpus, Path(tmp) / "out", engine)
        first_run = _one_off_costs(engine, device, before, "first_run")
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
        if b.end_to_end_only:
            later = [_corpus_run(settings, corpus, Path(tmp) / f"out{i}", engine).speed
                     for i in range(1, b.repeat)]
            return {**end_to_end_result(b, device, settings, summary, startup), **first_run,
                    "peak_gpu_memory_gib": peak,
                    **({"later_runs_audio_seconds_per_second": [round(x, 1) for x in later]} if later else {})}
        window = _first_lines(b.corpus, min(4 * b.batch_size, summary.counts["ok"] or 1), Path(tmp) / "w.txt")
        busy = _busy_window(settings, window, Path(tmp) / "busy", engine)
        baseline = _baseline(engine, b, settings, Path(tmp))
        variants = _end_to_end_variants(engine, settings, corpus, window, summary.speed)

    step_ms_1 = _decoder_ms_per_step(engine, 1)
    step_ms_b = _decoder_ms_per_step(engine, b.batch_size)
    decoder_candidates = {}
    for name, (_, fusions) in DECODER_CANDIDATES.items():
        decoder_candidates.update(_decoder_candidate(engine, step_ms_1, b.batch_size, name, fusions))
    wg_tflops, wg_executed = _waveglow_tflops(engine)
    fast_kernels = _fused_waveglow(engine)
    other_kernels = _waveglow_other_kernels(engine, wg_tflops)
    ceiling = matmul_ceiling_tflops(device, torch.float16 if dtype == torch.float32 else dtype)
    speed = summary.speed
    result = {
        **_corpus_result(b, device, settings, summary),
        **busy,
        "decoder_fusions": "+".join(_running_fusions(engine)) or "none",
        "waveglow_kernels": fast_kernels.kernels_mode if fast_kernels else "none",
        "waveglow_gate": fast_kernels.gate if fast_kernels else "none",
        "decoder_ms_per_step_batch1": step_ms_1,
        "decoder_frames_per_second_bench_batch": b.batch_size / step_ms_b * 1e3,
        "waveglow_tflops": wg_tflops, "waveglow_executed_tflops": wg_executed,
        "matmul_ceiling_tflops": ceiling,
        "waveglow_fraction_of_ceiling": wg_tflops / ceiling,
        **_stage_rates(engine, settings, wg_tflops, b.batch_size / step_ms_b * 1e3, speed),
        "peak_gpu_memory_gib": peak, "startup_seconds": startup,
        "baseline_lines": baseline["lines"],
        "baseline_audio_seconds_per_second": baseline["speed"],
        "speedup_over_baseline": speed / baseline["speed"] if baseline["speed"] else float("nan"),
        **first_run,
        **other_kernels,
        **decoder_candidates,
        **variants,
        "autotune_ms": kernels.autotune_timings(),
    }
    return result


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
    engine, startup = _ready_engine(device, dtype, settings, b.warm_up)
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
    precision = next(name for name, d in PRECISIONS.items() if d == dtype)
    settings = load_settings(overrides={"batch_size": b.batch_size, "format": b.format,
                                        "device": str(device), "precision": precision,
                                        "quiet": True, "seed": 0})
    return device, dtype, settings


def _banner(b: BenchSettings, device: torch.device, precision: str) -> str:
    return (f"bench: {device} {torch.cuda.get_device_name(device) if device.type == 'cuda' else ''} "
            f"{precision}, torch {torch.__version__}, corpus {b.corpus.name}")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _ready_engine(device: torch.device, dtype: torch.dtype, settings: Settings,
                  warm_up: str = "batch") -> tuple[Engine, float]:
    """An engine on random_models(), warmed up (BENCH_WARM_UPS), and the seconds that took."""
    _sync(device)
    started = time.perf_counter()
    engine = Engine(*random_models(), device, dtype, synthesis_settings(settings))
    _warm_up(engine, settings.batch_size if warm_up == "batch" else 0)
    _sync(device)
    return engine, time.perf_counter() - started


def _one_off_counters(engine: Engine, device: torch.device) -> dict:
    """Counters of the work a corpus run does once per process rather than
    once per batch: decoder graphs captured (and the seconds that took),
    Triton kernel variants compiled or loaded, cudaMalloc calls by the
    caching allocator, cuFFT plans made (the denoiser's), pinned host blocks
    allocated by the caching host allocator (cudaHostAlloc) and the seconds
    that took (None where torch cannot count them)."""
    graphed = engine.graphed
    on_cuda = device.type == "cuda"
    host_stats = getattr(torch.cuda, "host_memory_stats", None)
    # off CUDA nothing is pinned; on CUDA without the stats, unknown (None)
    host = ((host_stats() if host_stats else {}) if on_cuda
            else {"num_host_alloc": 0, "host_alloc_time.total": 0})
    alloc_us = host.get("host_alloc_time.total")
    return {"graph_captures": len(graphed.graphs) if graphed else 0,
            "graph_capture_seconds": graphed.capture_seconds if graphed else 0.0,
            "triton_compiled_kernels": kernels.compiled_kernels(),
            "device_allocations": (torch.cuda.memory_stats(device).get("num_device_alloc", 0)
                                   if on_cuda else 0),
            "fft_plans": (torch.backends.cuda.cufft_plan_cache[device.index or 0].size if on_cuda else 0),
            "host_allocations": host.get("num_host_alloc"),
            "host_allocation_seconds": None if alloc_us is None else alloc_us / 1e6}


def _one_off_costs(engine: Engine, device: torch.device, before: dict, key: str) -> dict:
    """What each of _one_off_counters grew by since ``before``, as ``key_name``."""
    after = _one_off_counters(engine, device)
    return {f"{key}_{name}": (after[name] - before[name] if None not in (after[name], before[name]) else None)
            for name in before}


def _corpus_run(settings: Settings, corpus: Path, out: Path, engine: Engine,
                group: Group | None = None) -> RunSummary:
    """The corpus end to end through the pipeline, each line's length fixed."""
    return synthesize_corpus(settings, corpus, out, on_notice=lambda m: None, engine=engine,
                             frames_per_symbol=FRAMES_PER_SYMBOL, group=group)


def _busy_window(settings: Settings, window: Path, out: Path, engine: Engine) -> dict:
    """``gpu_busy`` over the window's lines run again end to end (forced:
    none reused from an earlier run into ``out``)."""
    return gpu_busy(lambda: _corpus_run(replace(settings, force=True), window, out, engine), engine.device)


def _corpus_result(b: BenchSettings, device: torch.device, settings: Settings,
                   summary: RunSummary) -> dict:
    """What every bench result reports about the corpus run."""
    speed = summary.speed
    return {
        "device": _device_name(device),
        "torch": torch.__version__, "precision": settings.precision, "corpus": str(b.corpus),
        "lines": len(summary.rows), "batch_size": b.batch_size,
        "audio_seconds": summary.audio_seconds, "wall_seconds": summary.wall_seconds,
        "audio_seconds_per_second": speed,
        "samples_per_second": speed * settings.sample_rate,
    }


def end_to_end_result(b: BenchSettings, device: torch.device, settings: Settings,
                      summary: RunSummary, startup: float) -> dict:
    """The corpus run alone, in one process or (rank 0's summary) over a
    torchrun job; ``startup``: the slowest process's build and warm-up."""
    return {
        **_corpus_result(b, device, settings, summary),
        "processes": summary.processes,
        "audio_seconds_per_second_per_process": summary.speed / summary.processes,
        "startup_seconds": startup,
    }


def _engine(b: BenchSettings) -> Engine:
    device = resolve_device(b.device)
    dtype, _ = resolve_precision(device, b.precision)
    return Engine(*random_models(), device, dtype, synthesis_settings(load_settings()))


def profile_only(b: BenchSettings) -> str:
    engine = _engine(b)
    fast = _fused_waveglow(engine)
    running = f"kernels_mode={fast.kernels_mode!r}, gate={fast.gate!r}" if fast else "plain torch"
    report = f"{running} (running):\n" + waveglow_kernel_profile(engine)
    for name, change in _other_waveglow_candidates(engine).items():
        report += f"\n\n{name}:\n" + waveglow_kernel_profile(_waveglow_engine(engine, change)[0])
    return report


def _first_lines(corpus: Path, n: int | None, to: Path | None = None) -> Path:
    if n is None:
        return corpus
    to = to or Path(tempfile.mkdtemp()) / corpus.name
    with open(corpus, "rb") as f:
        to.write_bytes(b"".join(line for _, line in zip(range(n), f)))
    return to


def _warm_up(engine: Engine, batch_size: int) -> None:
    """One short line alone, then (batch_size > 0) a full batch of lines one to eight
    sentences long through the threaded path a corpus takes, so a full
    batch's kernels are loaded (CUDA loads a kernel's module on first use)
    and chosen before the clock starts. Suspected of the first corpus run's
    7-17 % penalty, it did not remove it (run M, BENCHMARKS.md); most of that
    was the denoiser's cuFFT plans, a new pair for each batch length, until
    the denoiser transformed a fixed number of frames at a time (run Q). On
    CPU the line alone (nothing loads lazily there)."""
    ids = frontend.text_to_sequence("Warming up the engine.")
    engine.synthesize([Job(ids, seed=0, frames=40)])
    if engine.device.type != "cuda" or batch_size == 0:
        return
    batch = [Job(ids * (1 + i % 8), seed=i, frames=100) for i in range(batch_size)]
    for _, results in engine.synthesize_all([batch]):
        if isinstance(results, Exception):
            raise results


def _baseline(engine: Engine, b: BenchSettings, settings: Settings, tmp: Path) -> dict:
    """The reference's way of running: batch of one, eager, line after line."""
    corpus = _first_lines(b.corpus, b.baseline_lines, tmp / "baseline.txt")
    summary = _corpus_run(replace(settings, batch_size=1), corpus, tmp / "baseline", engine.eager())
    return {"lines": len(summary.rows), "speed": summary.speed}


def _decoder_ms_per_step(engine: Engine, batch: int) -> float:
    """Slope of decode time against steps: fixed costs (encoder, postnet)
    cancel. 800 steps apart, median of 5: at batch 1 that is ~60 ms against
    run-to-run noise of a few hundred microseconds."""
    ids = frontend.text_to_sequence("A sentence of ordinary length for timing the decoder steps.")
    def run(frames):
        return _timed(lambda: engine.decode_only([Job(ids, seed=i, frames=frames) for i in range(batch)]),
                      engine.device, repeats=5)
    return (run(900) - run(100)) / 800 * 1e3


# Decoder fusions measured beside the running ones (engine.DECODER_FUSIONS),
# each changing them: name -> (label, flags). "fused_step" turns every one on
# (the stacked projection and gate product at large batches is the one left
# off); "rnn_off" is the step before the few-row kernels (the fused LSTM
# cells, the output kernel and the split query product at batch 1).
DECODER_CANDIDATES = {
    "fused_step": ("every fusion", {"fused_output": True, "fused_prenet": True, "fused_rnn": True}),
    "rnn_off": ("without the few-row kernels (before)", {"fused_rnn": False}),
}


def _running_fusions(engine: Engine) -> list[str]:
    if engine.graphed is None:
        return []
    return sorted(f.removeprefix("fused_") for f in engine.graphed.fusions)


def _candidate_decoder(engine: Engine, fusions: dict) -> GraphedDecoder:
    return GraphedDecoder(engine.tacotron2, engine.settings.decode, **{**DECODER_FUSIONS, **fusions})


def _decoder_candidate(engine: Engine, running_ms_batch1: float, batch: int, name: str,
                       fusions: dict) -> dict:
    """The decoder step with the running fusions plus ``fusions`` (same
    weights), measured like ``_decoder_ms_per_step`` in the same run: the
    candidate against the running path as one ratio, under keys named after
    ``name``. Empty where it cannot run (no CUDA or no Triton, a requested
    fusion not taken) or adds nothing; a failure of the candidate is
    reported, not raised (the run's other measures stand)."""
    if engine.graphed is None or not kernels.available():
        return {}
    if all(DECODER_FUSIONS.get(flag) == on for flag, on in fusions.items()):
        return {}
    try:
        fused = copy.copy(engine)
        fused.graphed = _candidate_decoder(engine, fusions)
        if any(on and flag not in fused.graphed.fusions for flag, on in fusions.items()):
            return {}
        ms_1 = _decoder_ms_per_step(fused, 1)
        ms_b = _decoder_ms_per_step(fused, batch)
    except Exception as e:   # noqa: BLE001 -- an unmeasured candidate must not sink the bench
        return {f"decoder_{name}_error": f"{type(e).__name__}: {e}"[:300]}
    return {f"decoder_ms_per_step_batch1_{name}": ms_1,
            f"decoder_{name}_speedup_batch1": running_ms_batch1 / ms_1,
            f"decoder_frames_per_second_bench_batch_{name}": batch / ms_b * 1e3}


def _denoiser_fft_rows(rows: int):
    """Variant: the denoiser transforming ``rows`` frames at a time."""
    def changes(engine: Engine) -> dict | None:
        if engine.denoiser is None:
            return None
        denoiser = copy.copy(engine.denoiser)
        denoiser.fft_rows = rows
        return {"denoiser": denoiser}
    return changes


def _fused_waveglow(engine: Engine) -> FastWaveGlow | None:
    """The engine's FastWaveGlow where its Triton kernels run (CUDA with
    Triton); elsewhere (None) it is plain torch, whatever its kernels mode."""
    fast = engine.fast_waveglow
    return fast if fast is not None and engine.device.type == "cuda" and kernels.available() else None


def _waveglow_with(**change):
    """Variant: WaveGlow changed by ``change`` (FastWaveGlow.with_kernels's
    arguments, which are also its attributes), where the fused kernels run
    and it is not what runs already."""
    def changes(engine: Engine) -> dict | None:
        fast = _fused_waveglow(engine)
        if fast is None or all(getattr(fast, k) == v for k, v in change.items()):
            return None
        return {"fast_waveglow": fast.with_kernels(**change)}
    return changes


# The corpus end to end again with one thing changed (same weights): name ->
# (label, the engine attributes it sets, or None where it cannot run).
# "no_denoiser" changes the audio, so it is not a candidate: it says what the
# denoiser costs.
END_TO_END_VARIANTS = {
    # Nothing changed: what the first corpus run of a process paid.
    "again": ("the running path again (a second run)", lambda e: {}),
    "no_overlap": ("each batch handed on before the next is queued (before)",
                   lambda e: {"overlap_batches": False}),
    "denoiser_per_item": ("denoiser item by item (before)", lambda e: {"denoise_in_batches": False}),
    "no_denoiser": ("without the denoiser (diagnostic: other audio)", lambda e: {"denoiser": None}),
    "denoiser_fft_rows_4096": ("denoiser FFTs 4,096 frames at a time (before)", _denoiser_fft_rows(4096)),
    "exact_gate": ("WaveGlow's gate computed exactly (before)", _waveglow_with(gate="exact")),
    "separate_cond": ("WaveGlow's conditioning as a product of its own (matmul_paired, before)",
                      _waveglow_with(kernels_mode="matmul_paired")),
}


def _end_to_end_variants(engine: Engine, settings: Settings, corpus: Path, window: Path,
                         running_speed: float) -> dict:
    """Each of END_TO_END_VARIANTS: its speed over the corpus as a ratio to
    the running path's from this run, and its GPU busy fractions over the
    same window. A failure is reported, not raised: an unmeasured variant
    must not sink the bench."""
    result = {}
    for name, (_, make) in END_TO_END_VARIANTS.items():
        key = f"end_to_end_{name}"
        try:
            changes = make(engine)
            if changes is None:
                continue
            variant = copy.copy(engine)
            vars(variant).update(changes)
            with tempfile.TemporaryDirectory() as tmp:
                before = _one_off_counters(variant, engine.device)
                summary = _corpus_run(settings, corpus, Path(tmp) / "out", variant)
                result.update(_one_off_costs(variant, engine.device, before, key))
                busy = _busy_window(settings, window, Path(tmp) / "busy", variant)
        except Exception as e:   # noqa: BLE001
            result[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        result.update({f"{key}_audio_seconds_per_second": summary.speed,
                       f"{key}_speedup": summary.speed / running_speed,
                       f"{key}_gpu_busy_fraction": busy["gpu_busy_fraction"],
                       f"{key}_gpu_busy_busiest_stream_fraction": busy["gpu_busy_busiest_stream_fraction"]})
    return result


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
            waveglow_flops_per_sample(d, folded=engine.fast) * samples_per_second / 1e12)


def _stage_rates(engine: Engine, settings: Settings, wg_tflops: float, frames_per_second: float,
                 speed: float) -> dict:
    """Each stage alone as audio seconds per wall second (WaveGlow from its
    TFLOP/s, the decoder from its frames/s at the bench batch), and the end
    to end rate as a share of WaveGlow alone: how much the rest of the job
    (decoder, encoder and postnet, denoiser, copies, graph capture, files,
    pipeline filling and draining) costs beyond the slowest stage."""
    d = engine.waveglow.dims
    waveglow_alone = wg_tflops * 1e12 / (waveglow_flops_per_sample(d) * settings.sample_rate)
    return {"waveglow_alone_audio_seconds_per_second": waveglow_alone,
            "decoder_alone_audio_seconds_per_second": frames_per_second * d.hop_length / settings.sample_rate,
            "end_to_end_share_of_waveglow_alone": speed / waveglow_alone}


# WaveGlow alone with one thing changed (same weights): name -> (label,
# FastWaveGlow.with_kernels arguments). Every kernels mode and every gate
# form; the running ones are skipped.
WAVEGLOW_CANDIDATES = {
    **{f"{mode}_kernels": (f"{mode} kernels", {"kernels_mode": mode}) for mode in FastWaveGlow.KERNELS_MODES},
    **{f"gate_{gate}": (f"gate {gate}", {"gate": gate}) for gate in kernels.GATE_FORMS},
}


def _other_waveglow_candidates(engine: Engine) -> dict[str, dict]:
    """WAVEGLOW_CANDIDATES that differ from what runs, where the fused
    kernels can run (CUDA with Triton): name -> with_kernels arguments."""
    fast = _fused_waveglow(engine)
    if fast is None:
        return {}
    running = {"kernels_mode": fast.kernels_mode, "gate": fast.gate}
    return {name: change for name, (_, change) in WAVEGLOW_CANDIDATES.items()
            if any(running[k] != v for k, v in change.items())
            and (fast.dtype != torch.float32 or "gate" not in change)}


def _waveglow_engine(engine: Engine, change: dict) -> tuple[Engine, float]:
    """(the engine with WaveGlow changed by ``change``, with_kernels'
    arguments, same weights; seconds its autotuning took)."""
    _sync(engine.device)
    started = time.perf_counter()
    other = copy.copy(engine)
    other.fast_waveglow = engine.fast_waveglow.with_kernels(**change)
    _sync(engine.device)
    return other, time.perf_counter() - started


def _waveglow_other_kernels(engine: Engine, running_tflops: float) -> dict:
    """WaveGlow alone as each other candidate, measured like
    ``_waveglow_tflops`` in the same run: each against the running path as
    one ratio (> 1: faster than the running path). A failure is reported,
    not raised (the run's other measures stand)."""
    result = {}
    for name, change in _other_waveglow_candidates(engine).items():
        try:
            other, tune_seconds = _waveglow_engine(engine, change)
            tflops, _ = _waveglow_tflops(other)
        except Exception as e:   # noqa: BLE001 -- an unmeasured candidate must not sink the bench
            result[f"waveglow_{name}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        result.update({f"waveglow_{name}_tflops": tflops,
                       f"waveglow_{name}_speedup": tflops / running_tflops,
                       f"waveglow_{name}_tune_seconds": tune_seconds})
    return result


def _decoder_candidate_rows() -> list:
    """Table rows of each decoder candidate (CUDA with Triton only)."""
    rows = []
    for name, (label, _) in DECODER_CANDIDATES.items():
        rows += [(f"Tacotron2 ms per decoder step, batch 1, {label}", f"decoder_ms_per_step_batch1_{name}", "{:.3f}"),
                 (f"Tacotron2 step speed-up at batch 1, {label} over the running step",
                  f"decoder_{name}_speedup_batch1", "{:.3f}x"),
                 (f"Tacotron2 frames/s at bench batch, {label}",
                  f"decoder_frames_per_second_bench_batch_{name}", "{:.0f}"),
                 (f"decoder {label}: failed", f"decoder_{name}_error", "{}")]
    return rows


def _end_to_end_variant_rows() -> list:
    rows = []
    for name, (label, _) in END_TO_END_VARIANTS.items():
        key = f"end_to_end_{name}"
        rows += [(f"end to end, {label}: audio s per wall s", f"{key}_audio_seconds_per_second", "{:.1f}"),
                 (f"end to end, {label}: speed-up over the running path", f"{key}_speedup", "{:.3f}x"),
                 (f"end to end, {label}: GPU busy (same window)", f"{key}_gpu_busy_fraction", "{:.1%}"),
                 (f"end to end, {label}: busiest stream alone", f"{key}_gpu_busy_busiest_stream_fraction",
                  "{:.1%}"),
                 (f"end to end, {label}: failed", f"{key}_error", "{}")]
    return rows


def _waveglow_mode_rows() -> list:
    """Table rows of each WaveGlow candidate not running (CUDA with Triton only)."""
    rows = []
    for name, (label, _) in WAVEGLOW_CANDIDATES.items():
        rows += [(f"WaveGlow TFLOP/s, {label} (reference arithmetic)", f"waveglow_{name}_tflops", "{:.1f}"),
                 (f"WaveGlow speed-up, {label} over the running path", f"waveglow_{name}_speedup", "{:.3f}x"),
                 (f"{label}: autotuning s", f"waveglow_{name}_tune_seconds", "{:.1f}"),
                 (f"{label}: failed", f"waveglow_{name}_error", "{}")]
    return rows


# Work the first corpus run of a process did once (_one_off_counters).
FIRST_RUN_ROWS = [
    ("first corpus run: decoder graphs captured", "first_run_graph_captures", "{}"),
    ("first corpus run: seconds capturing them", "first_run_graph_capture_seconds", "{:.2f}"),
    ("first corpus run: Triton kernel variants compiled or loaded", "first_run_triton_compiled_kernels", "{}"),
    ("first corpus run: cudaMalloc calls", "first_run_device_allocations", "{}"),
    ("first corpus run: cuFFT plans made", "first_run_fft_plans", "{}"),
    ("first corpus run: pinned host blocks allocated (cudaHostAlloc)", "first_run_host_allocations", "{}"),
    ("first corpus run: seconds allocating them", "first_run_host_allocation_seconds", "{:.2f}"),
]


TABLE = [
    ("audio seconds per wall second", "audio_seconds_per_second", "{:.1f}"),
    ("samples per second", "samples_per_second", "{:.3g}"),
    ("GPU busy (steady state: middle half of a 4-batch window)", "gpu_busy_fraction", "{:.1%}"),
    ("  the busiest stream alone (WaveGlow's), same window", "gpu_busy_busiest_stream_fraction", "{:.1%}"),
    ("  its idle stretches of 1 ms or more: count", "busiest_stream_long_gaps", "{}"),
    ("  its idle stretches of 1 ms or more: share of the window", "busiest_stream_long_gap_fraction",
     "{:.1%}"),
    ("decoder fusions running", "decoder_fusions", "{}"),
    ("WaveGlow kernels running", "waveglow_kernels", "{}"),
    ("WaveGlow gate running", "waveglow_gate", "{}"),
    ("Tacotron2 ms per decoder step, batch 1", "decoder_ms_per_step_batch1", "{:.3f}"),
    ("Tacotron2 frames/s at bench batch", "decoder_frames_per_second_bench_batch", "{:.0f}"),
    *_decoder_candidate_rows(),
    ("WaveGlow TFLOP/s (reference arithmetic / time)", "waveglow_tflops", "{:.1f}"),
    ("WaveGlow TFLOP/s (arithmetic executed / time)", "waveglow_executed_tflops", "{:.1f}"),
    *_waveglow_mode_rows(),
    *_end_to_end_variant_rows(),
    ("matmul ceiling TFLOP/s (measured now)", "matmul_ceiling_tflops", "{:.1f}"),
    ("WaveGlow fraction of ceiling (reference arithmetic)", "waveglow_fraction_of_ceiling", "{:.1%}"),
    ("WaveGlow alone: audio s per wall s", "waveglow_alone_audio_seconds_per_second", "{:.1f}"),
    ("Tacotron2 decoder alone at bench batch: audio s per wall s", "decoder_alone_audio_seconds_per_second",
     "{:.1f}"),
    ("end to end as a share of WaveGlow alone", "end_to_end_share_of_waveglow_alone", "{:.1%}"),
    ("peak GPU memory GiB", "peak_gpu_memory_gib", "{:.1f}"),
    ("startup s (build, warm-up)", "startup_seconds", "{:.1f}"),
    *FIRST_RUN_ROWS,
    ("naive batch-1 loop: audio s per wall s", "baseline_audio_seconds_per_second", "{:.1f}"),
    ("speed-up over naive loop", "speedup_over_baseline", "{:.1f}x"),
]


END_TO_END_TABLE = [
    ("processes", "processes", "{}"),
    ("device", "device", "{}"),
    ("lines", "lines", "{}"),
    ("audio seconds", "audio_seconds", "{:.1f}"),
    ("wall seconds", "wall_seconds", "{:.1f}"),
    ("audio seconds per wall second", "audio_seconds_per_second", "{:.1f}"),
    ("audio seconds per wall second per process", "audio_seconds_per_second_per_process", "{:.1f}"),
    ("startup s (build, warm-up; the slowest process)", "startup_seconds", "{:.1f}"),
    ("peak GPU memory GiB (this process, the corpus run)", "peak_gpu_memory_gib", "{:.1f}"),
    *FIRST_RUN_ROWS,
    ("later runs in the same process (--repeat): audio s per wall s", "later_runs_audio_seconds_per_second", "{}"),
]


def format_table(r: dict) -> str:
    head = (f"{r['lines']} lines, {r['audio_seconds']:.0f} s of audio, batch {r['batch_size']}, "
            f"{r['precision']}, {r['device']}, torch {r['torch']}")
    return _markdown_table(head, TABLE, r)


def format_end_to_end_table(r: dict) -> str:
    """The end-to-end run alone (--end-to-end-only, or under torchrun)."""
    head = (f"end to end only: batch {r['batch_size']}, {r['precision']}, torch {r['torch']}, "
            f"corpus {Path(r['corpus']).name}")
    return _markdown_table(head, END_TO_END_TABLE, r)


def _markdown_table(head: str, measures: list, r: dict) -> str:
    rows = [f"| {name} | {'n/a' if r[key] is None else fmt.format(r[key])} |"
            for name, key, fmt in measures if key in r]
    return "\n".join([head, "", "| measure | value |", "|---|---|", *rows])


def write_json(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def waveglow_kernel_profile(engine: Engine, batch: int = 32, frames: int = 800, top: int = 12) -> str:
    """Where WaveGlow's GPU time goes: the ``top`` kernels by total CUDA time."""
    from torch.profiler import ProfilerActivity, profile
    d = engine.waveglow.dims
    mel = torch.randn(batch, d.n_mel, frames, device=engine.device, dtype=engine.dtype)
    lengths = torch.full((batch,), frames, device=engine.device)
    engine.vocode(mel, lengths)
    _sync(engine.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.vocode(mel, lengths)
        _sync(engine.device)
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] = kernels.get(e.name, 0.0) + e.time_range.elapsed_us()
    total = sum(kernels.values())
    lines = [f"WaveGlow {batch} x {frames} frames: {total / 1e3:.1f} ms of kernels"]
    for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{us / 1e3:8.2f} ms {us / total:6.1%}  {name[:90]}")
    return "\n".join(lines)
