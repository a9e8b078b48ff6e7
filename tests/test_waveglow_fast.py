"""The matrix-product WaveGlow computes the same function as the plain model."""
import torch

from tts_cli.waveglow_fast import FastWaveGlow, shifted_taps
from tiny_models import N_MEL, tiny_waveglow


def test_shifted_taps_are_zero_outside_the_sequence():
    x = torch.arange(1, 6, dtype=torch.float32).view(1, 5, 1)
    taps = shifted_taps(x, 2)[0]
    assert taps[:, 0].tolist() == [0, 0, 1, 2, 3]
    assert taps[:, 1].tolist() == [1, 2, 3, 4, 5]
    assert taps[:, 2].tolist() == [3, 4, 5, 0, 0]


@torch.inference_mode()
def test_fast_waveglow_equals_the_plain_model_on_a_padded_batch():
    model = tiny_waveglow(seed=7)
    fast = FastWaveGlow(model, torch.float32)
    frames = torch.tensor([4, 23, 9])
    mel = torch.randn(3, N_MEL, 23) * (torch.arange(23)[None, None, :] < frames[:, None, None])
    seeds = torch.tensor([5, 6, 7])
    expected = model.infer(mel, frames, seeds, sigma=0.666)
    got = fast.infer(mel, frames, seeds, sigma=0.666)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-5 * expected.abs().max())
