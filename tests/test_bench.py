"""The benchmark's arithmetic and report (the timing itself runs only on a GPU)."""
import pytest

from tts_cli.bench import TABLE, format_table, waveglow_flops_per_sample
from tts_cli.waveglow import PUBLISHED_DIMS


def test_waveglow_costs_447_gflop_per_audio_second_as_published():
    assert waveglow_flops_per_sample(PUBLISHED_DIMS) * 22050 == pytest.approx(447e9, rel=0.01)
    # the fast path folds the upsampler into the conditioning (half its cost) and
    # the skip outputs into the end layer: 27 % fewer multiply-adds
    assert waveglow_flops_per_sample(PUBLISHED_DIMS, folded=True) * 22050 == pytest.approx(326e9, rel=0.01)


def test_the_table_has_every_measure():
    result = {key: 1.0 for _, key, _ in TABLE}
    result.update(lines=10, audio_seconds=60.0, batch_size=4, precision="fp16", device="gpu", torch="x")
    table = format_table(result)
    for name, _, _ in TABLE:
        assert name in table


def test_gpu_busy_counts_overlapping_kernels_once_and_only_inside_the_window():
    from tts_cli.bench import covered_fraction
    # two streams overlapping on [2, 4], a kernel straddling the window's end, one outside
    intervals = [(0, 4), (2, 6), (9, 12), (20, 30)]
    assert covered_fraction(intervals, 0, 10) == pytest.approx(0.7)
    assert covered_fraction([], 0, 10) == 0.0
