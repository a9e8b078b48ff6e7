"""The benchmark's arithmetic and report (the timing itself runs only on a GPU;
tests/test_bench_distributed.py runs the whole bench on CPU with tiny models)."""
import pytest

from tts_cli.bench import covered_fraction, waveglow_flops_per_sample
from tts_cli.bench_report import format_table
from tts_cli.waveglow import PUBLISHED_DIMS


def test_waveglow_costs_447_gflop_per_audio_second_as_published():
    assert waveglow_flops_per_sample(PUBLISHED_DIMS) * 22050 == pytest.approx(447e9, rel=0.01)
    # the fast path folds the upsampler into the conditioning (half its cost) and
    # the skip outputs into the end layer: 27 % fewer multiply-adds
    assert waveglow_flops_per_sample(PUBLISHED_DIMS, folded=True) * 22050 == pytest.approx(326e9, rel=0.01)


def test_gpu_busy_counts_overlapping_kernels_once_and_only_inside_the_window():
    # two streams overlapping on [2, 4], a kernel straddling the window's end, one outside
    intervals = [(0, 4), (2, 6), (9, 12), (20, 30)]
    assert covered_fraction(intervals, 0, 10) == pytest.approx(0.7)
    assert covered_fraction([], 0, 10) == 0.0


def test_the_table_formats_each_measure_and_says_n_a_for_what_this_device_cannot_measure():
    result = {"lines": 10, "audio_seconds": 61.2, "batch_size": 4, "precision": "fp32", "device": "cpu",
              "torch": "2.x", "audio_seconds_per_second": 12.345, "gpu_busy_fraction": float("nan"),
              "speedup_over_baseline": 3.04, "peak_gpu_memory_gib": None}
    table = format_table(result)
    assert table.splitlines()[0] == "10 lines, 61 s of audio, batch 4, fp32, cpu, torch 2.x"
    assert "| audio seconds per wall second | 12.3 |" in table
    assert "| speed-up over naive loop | 3.0x |" in table
    assert "| GPU busy (steady state: middle half of a 4-batch window) | n/a |" in table
    assert "| peak GPU memory GiB | n/a |" in table
    assert "nan" not in table
    assert "WaveGlow TFLOP/s" not in table, "a measure not taken gets no row"
