"""The matrix-product WaveGlow computes the same function as the plain model,
for every shape the loader accepts, and its weights padded for the CUDA
kernels change nothing."""
import copy
import dataclasses

import numpy as np
import pytest
import torch

from tts_cli.kernels import waveglow as wg_kernels
from tts_cli.waveglow import WaveGlow
from tts_cli.waveglow_fast import FastWaveGlow, shifted_taps, supports
from tiny_models import N_MEL, WAVEGLOW_DIMS, random_waveglow


def padded_batch(frames: list[int], n_mel: int = N_MEL, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    frames = torch.tensor(frames)
    longest = int(frames.max())
    mel = torch.randn(len(frames), n_mel, longest, generator=g) * (torch.arange(longest)[None, None, :]
                                                                   < frames[:, None, None])
    return mel, frames, torch.arange(5, 5 + len(frames))


def test_shifted_taps_are_zero_outside_the_sequence():
    x = torch.arange(1, 6, dtype=torch.float32).view(1, 5, 1)
    taps = shifted_taps(x, 2)[0]
    assert taps[:, 0].tolist() == [0, 0, 1, 2, 3]
    assert taps[:, 1].tolist() == [1, 2, 3, 4, 5]
    assert taps[:, 2].tolist() == [3, 4, 5, 0, 0]


SHAPES = {   # WAVEGLOW_DIMS (n_mel 16, 4 flows, early every 2 of size 2, 2 layers, 8 channels) changed
    "tiny": {},
    "wn_channels 32, 3 layers": {"wn_channels": 32, "wn_layers": 3},
    "the demo voice's (80 channels, 2 flows, no early outputs)": {"wn_channels": 80, "n_flows": 2,
                                                                  "n_early_size": 0, "n_early_every": 2},
    "n_mel 20, 8 layers, group 4": {"n_mel": 20, "wn_layers": 8, "n_group": 4, "n_early_size": 0,
                                    "n_early_every": 4},
    "6 flows, early every 3": {"n_flows": 6, "n_early_every": 3, "wn_channels": 24},
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@torch.inference_mode()
def test_fast_waveglow_equals_the_plain_model_on_a_padded_batch(shape):
    model = random_waveglow(seed=7, **shape)
    mel, frames, seeds = padded_batch([4, 23, 9], n_mel=model.dims.n_mel)
    expected = model.infer(mel, frames, seeds, sigma=0.666)
    got = FastWaveGlow(model, torch.float32).infer(mel, frames, seeds, sigma=0.666)
    assert got.shape == expected.shape
    assert float((got - expected).norm() / expected.norm()) < 1e-5


@pytest.mark.parametrize("channels", [8, 80, 96, 192])
@torch.inference_mode()
def test_zero_channels_added_for_the_kernels_change_no_coupling_output(channels):
    """The kernels need the channel count and the window width to be
    multiples of 64; FastWaveGlow pads a narrower model with zero channels
    (and zero window columns) where they run. Here the plain torch coupling
    runs on both weight sets: every flow's output is the same."""
    model = random_waveglow(seed=3, wn_channels=channels, n_mel=20)
    plain = FastWaveGlow(model, torch.float32, use_kernels=False)
    padded = FastWaveGlow(model, torch.float32, use_kernels=True)   # weights only: nothing runs on CUDA here
    assert padded.channels % 64 == 0 and padded.channels >= channels and padded.window % 64 == 0
    assert plain.channels == channels and padded.padded_dims.wn_channels == padded.channels
    mel, frames, _ = padded_batch([3, 6], n_mel=20)
    keep = (torch.arange(6 * 32)[None, :] < frames[:, None] * 32)[..., None].float()
    for w, wp in zip(plain.flows, padded.flows):
        a0 = torch.randn(2, 6 * 32, w.start.shape[0])
        expected = plain.coupling(w, a0, plain.frame_windows(mel), keep)
        got = padded.coupling(wp, a0, padded.frame_windows(mel), keep)
        assert float((got - expected).norm() / expected.norm()) < 1e-6


def test_only_three_tap_dilated_convolutions_are_served():
    assert supports(WAVEGLOW_DIMS)
    five = dataclasses.replace(WAVEGLOW_DIMS, wn_kernel=5)
    assert not supports(five)
    with pytest.raises(ValueError, match="three-tap"):
        FastWaveGlow(WaveGlow(five), torch.float32)


def test_the_waveglow_memory_budget_is_about_a_million_rows_at_15_gib_for_the_published_model():
    from tts_cli.waveglow import PUBLISHED_DIMS as published
    from tts_cli.waveglow_fast import waveglow_rows_within
    rows = waveglow_rows_within(15 * 2 ** 30, published, torch.float16)
    assert 1.0e6 < rows < 1.1e6              # 30 values of 2 bytes per channel-row, ~15 KB a row
    assert waveglow_rows_within(30 * 2 ** 30, published, torch.float16) == pytest.approx(2 * rows, rel=1e-6)
    assert waveglow_rows_within(15 * 2 ** 30, published, torch.float32) == pytest.approx(rows / 2, rel=0.01)
    assert waveglow_rows_within(1, published, torch.float16) == 1


def test_each_launch_config_tiles_every_width_the_padding_gives_and_no_other_width_is_launched():
    # The shapes the kernels serve are exactly the padded ones: the launch
    # config chosen for a width tiles it in every dtype, and an unpadded
    # width is refused before any launch instead of running with blocks
    # that do not tile it.
    for width in range(64, 1024 + 1, 64):
        for configs in (wg_kernels.TAPS_COND_GATE_CONFIGS, wg_kernels.RESIDUAL_CONFIGS):
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                cfg = wg_kernels.launch_config(configs, width, dtype)
                assert width % cfg["BLOCK_N"] == 0 and width % cfg["BLOCK_K"] == 0
                assert wg_kernels.PHASE_ROWS_MULTIPLE % cfg["BLOCK_M"] == 0
    # the published width gets the widest tiles
    assert wg_kernels.launch_config(wg_kernels.TAPS_COND_GATE_CONFIGS, 256, torch.float16)["BLOCK_N"] == 128
    with pytest.raises(ValueError, match="multiple of 64"):
        wg_kernels.residual_update(torch.zeros(4, 80), torch.zeros(80, 80), torch.zeros(80), torch.zeros(4, 80))


def test_paired_gate_columns_interleave_tanh_and_sigmoid_and_pad_with_zeros():
    w = torch.arange(6.0).view(1, 6)                       # C = 3: tanh 0 1 2 | sigmoid 3 4 5
    assert wg_kernels.paired_gate_columns(w, 4).tolist() == [[0, 3, 1, 4, 2, 5, 0, 0]]


def test_phase_major_rows_put_each_group_step_where_the_kernel_reads_it():
    rows = wg_kernels.PhaseRows(items=3, frames=5, phases=4)
    assert rows.phase_rows == wg_kernels.PHASE_ROWS_MULTIPLE and rows.n_rows == 4 * wg_kernels.PHASE_ROWS_MULTIPLE
    y = torch.randn(3, 5 * 4, 2)                        # (items, group steps, channels)
    laid = rows.gather(y)
    for b, t in [(0, 0), (1, 7), (2, 19)]:               # step t = 4q + p lies at row p R + (b F + q)
        q, p = divmod(t, 4)
        assert torch.equal(laid[p * rows.phase_rows + b * 5 + q], y[b, t])
    dummy = laid.view(4, rows.phase_rows, 2)[:, rows.item_rows:]
    assert dummy.numel() > 0 and not dummy.any()         # rows no step maps to hold zeros
    assert torch.equal(rows.scatter(laid), y)


@torch.inference_mode()
def test_the_engine_runs_a_waveglow_the_fast_path_cannot_serve_as_the_plain_model_and_says_so():
    from tts_cli.engine import Engine, Job
    from tiny_models import engine_settings, force_lengths, tiny_tacotron2
    model = random_waveglow(seed=2, wn_kernel=5)
    reference = copy.deepcopy(model)
    frames = {4: 7, 2: 3}
    engine = Engine(force_lengths(tiny_tacotron2(seed=2), frames), model, torch.device("cpu"), torch.float32,
                    engine_settings(sigma=0.6, denoiser_strength=0.0, max_decoder_steps=20))
    assert engine.fast_waveglow is None
    assert len(engine.notices) == 1 and "5 taps" in engine.notices[0] and "plain model" in engine.notices[0]
    jobs = [Job([20, 31, 40, 12], seed=3), Job([33, 21], seed=4)]
    for job, got in zip(jobs, engine.synthesize(jobs), strict=True):
        # the line's audio is what the 5-tap model itself makes of its mel, alone, with its seed
        alone = reference.infer(torch.from_numpy(got.mel)[None], torch.tensor([got.frames]),
                                torch.tensor([job.seed]), 0.6)[0]
        assert got.frames == frames[len(job.ids)] and got.audio.shape == alone.shape
        assert torch.allclose(torch.from_numpy(got.audio), alone, atol=1e-5), (got.audio, alone)
        assert np.abs(got.audio).max() > 1e-3, "a real signal, not silence"
