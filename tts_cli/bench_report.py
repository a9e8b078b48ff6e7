"""The bench's results as a reader sees them: a Markdown table of the
measures ``bench.run_bench`` returns, and the JSON file ``--json`` writes."""
from __future__ import annotations

import json
from pathlib import Path

# (what the table calls it, the result's key, how to show it)
TABLE = [
    ("audio seconds per wall second", "audio_seconds_per_second", "{:.1f}"),
    ("GPU-hours per 1,000 hours of audio", "gpu_hours_per_1000_audio_hours", "{:.2f}"),
    ("the same without alignment checks", "audio_seconds_per_second_unchecked", "{:.1f}"),
    ("the same with them again", "audio_seconds_per_second_checked_again", "{:.1f}"),
    ("alignment checks' cost (1 - again / without)", "alignment_checks_cost", "{:.1%}"),
    ("the same as 16 kHz FLAC (resampled)", "audio_seconds_per_second_flac_16khz", "{:.1f}"),
    ("16 kHz FLAC as a share of WAV", "flac_16khz_share_of_wav", "{:.1%}"),
    ("GPU busy (steady state: middle half of a 4-batch window)", "gpu_busy_fraction", "{:.1%}"),
    ("Tacotron2 ms per decoder step, batch 1", "decoder_ms_per_step_batch1", "{:.3f}"),
    ("Tacotron2 frames/s at bench batch", "decoder_frames_per_second_bench_batch", "{:.0f}"),
    ("Tacotron2 decoder alone at bench batch: audio s per wall s", "decoder_alone_audio_seconds_per_second",
     "{:.1f}"),
    ("WaveGlow alone: audio s per wall s", "waveglow_alone_audio_seconds_per_second", "{:.1f}"),
    ("WaveGlow TFLOP/s (reference arithmetic / time)", "waveglow_tflops", "{:.1f}"),
    ("WaveGlow TFLOP/s (arithmetic executed / time)", "waveglow_executed_tflops", "{:.1f}"),
    ("matmul ceiling TFLOP/s (measured now)", "matmul_ceiling_tflops", "{:.1f}"),
    ("WaveGlow fraction of ceiling (reference arithmetic)", "waveglow_fraction_of_ceiling", "{:.1%}"),
    ("end to end as a share of WaveGlow alone", "end_to_end_share_of_waveglow_alone", "{:.1%}"),
    ("WaveGlow fast path, SNR dB against eager fp32 (demo voice, real mels, this dtype)",
     "waveglow_fast_snr_db_demo_voice", "{:.1f}"),
    ("the eager WaveGlow in this dtype, SNR dB against eager fp32 (same mels)",
     "waveglow_eager_snr_db_demo_voice", "{:.1f}"),
    ("peak GPU memory GiB", "peak_gpu_memory_gib", "{:.1f}"),
    ("startup s (build, warm-up)", "startup_seconds", "{:.1f}"),
    ("naive batch-1 loop: audio s per wall s", "baseline_audio_seconds_per_second", "{:.1f}"),
    ("speed-up over naive loop", "speedup_over_baseline", "{:.1f}x"),
]

END_TO_END_TABLE = [
    ("processes", "processes", "{}"),
    ("audio seconds", "audio_seconds", "{:.1f}"),
    ("wall seconds", "wall_seconds", "{:.1f}"),
    ("audio seconds per wall second", "audio_seconds_per_second", "{:.1f}"),
    ("audio seconds per wall second per process", "audio_seconds_per_second_per_process", "{:.1f}"),
    ("GPU-hours per 1,000 hours of audio", "gpu_hours_per_1000_audio_hours", "{:.2f}"),
    ("startup s (build, warm-up; the slowest process)", "startup_seconds", "{:.1f}"),
    ("peak GPU memory GiB (this process, the corpus run)", "peak_gpu_memory_gib", "{:.1f}"),
]


def format_table(r: dict) -> str:
    head = (f"{r['lines']} lines, {r['audio_seconds']:.0f} s of audio, batch {r['batch_size']}, "
            f"{r['precision']}, {r['device']}, torch {r['torch']}")
    return _markdown_table(head, TABLE, r)


def format_end_to_end_table(r: dict) -> str:
    """The end-to-end run alone (--end-to-end-only, or under torchrun)."""
    head = (f"end to end only: {r['lines']} lines, batch {r['batch_size']}, {r['precision']}, "
            f"{r['device']}, torch {r['torch']}, corpus {Path(r['corpus']).name}")
    return _markdown_table(head, END_TO_END_TABLE, r)


def _markdown_table(head: str, measures: list, r: dict) -> str:
    """A row per measure present in ``r``; one this device cannot measure
    (NaN, such as GPU busy on CPU) reads n/a."""
    unmeasured = lambda v: v is None or (isinstance(v, float) and v != v)
    rows = [f"| {name} | {'n/a' if unmeasured(r[key]) else fmt.format(r[key])} |"
            for name, key, fmt in measures if key in r]
    return "\n".join([head, "", "| measure | value |", "|---|---|", *rows])


def write_json(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
