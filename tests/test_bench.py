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


def test_the_busiest_streams_share_leaves_out_what_only_the_others_covered():
    from tts_cli.bench import busy_fractions
    # stream 7 (WaveGlow) busy on [0, 6]; stream 3 (decoder) on [4, 9]
    intervals = [(7, 0, 2), (7, 2, 6), (3, 4, 9)]
    every, busiest = busy_fractions(intervals, 0, 10)
    assert every == pytest.approx(0.9) and busiest == pytest.approx(0.6)
    assert busy_fractions([], 0, 10) == (0.0, 0.0)


def test_idle_gaps_are_the_long_stretches_between_kernels_within_the_window():
    from tts_cli.bench import idle_gaps
    # idle on [-, 0] (outside), [2, 2.5] (short), [6, 9], and [9.5, 10] up to the window's end
    intervals = [(-3, 0), (0, 2), (2.5, 5), (4, 6), (9, 9.5)]
    assert idle_gaps(intervals, 0, 10, 1.0) == [pytest.approx(3.0)]
    assert idle_gaps(intervals, 0, 10, 0.5) == [pytest.approx(0.5), pytest.approx(3.0), pytest.approx(0.5)]
    assert idle_gaps([], 0, 10, 1.0) == [10]


def test_the_first_run_counters_see_graphs_captured_once_and_reused_after():
    # The bench tells a process's one-off work from its per-batch work: a
    # second run over the same batches must capture no decoder graph.
    import torch
    from tts_cli.bench import _one_off_costs, _one_off_counters
    from tts_cli.decoder_graph import GraphedDecoder
    from tts_cli.engine import Engine, Job, SynthesisSettings
    from tts_cli.tacotron2 import DecodeSettings
    from tiny_models import tiny_tacotron2, tiny_waveglow

    settings = SynthesisSettings(decode=DecodeSettings(max_decoder_steps=20))
    cpu = torch.device("cpu")
    engine = Engine(tiny_tacotron2(seed=1), tiny_waveglow(seed=1), cpu, torch.float32, settings)
    engine.graphed = GraphedDecoder(engine.tacotron2, settings.decode)   # off CUDA: no capture, same bookkeeping
    batches = [[Job(list(range(12, 12 + n)), seed=n, frames=6) for n in (5, 40)], [Job([13] * 70, seed=1, frames=6)]]
    costs = []
    for run in ("first", "again"):
        before = _one_off_counters(engine, cpu)
        assert all(not isinstance(r, Exception) for _, r in engine.synthesize_all(batches))
        costs.append(_one_off_costs(engine, cpu, before, run))
    assert costs[0]["first_graph_captures"] == 2          # (2 rows, 64 symbols) and (1 row, 96)
    assert costs[1]["again_graph_captures"] == 0
