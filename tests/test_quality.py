"""quality.py: the SNR that judges a fast path, and the demo voice's WaveGlow
in 16 bits on CPU against float32, on mels from its own Tacotron2 (the GPU
kernels' side of the same check is tests/test_gpu_quality.py)."""
import copy
import math

import pytest
import torch

from tts_cli.config import Settings
from tts_cli.loading import load_models
from tts_cli.quality import snr_db, voice_mels, waveglow_fidelity
from tts_cli.voice import demo_voice
from tts_cli.waveglow_fast import FastWaveGlow

LINES = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
         "It's easy to tell the depth of a well.", "Four hours of steady work faced us."]


def test_snr_is_infinite_for_equal_audio_and_20_db_for_a_tenth_of_the_amplitude_in_error():
    reference = torch.tensor([[1.0, -1.0, 1.0, -1.0], [2.0, 2.0, 0.0, 0.0]])
    assert snr_db(reference.clone(), reference, torch.tensor([4, 2])) == math.inf
    assert snr_db(reference * 1.1, reference, torch.tensor([4, 2])) == pytest.approx(20.0)


def test_snr_counts_only_each_rows_own_samples():
    reference = torch.ones(2, 6)
    audio = reference.clone()
    audio[0, 4:] = 100.0          # past row 0's four samples: not its audio
    audio[1, 1] = 0.0             # inside row 1's two samples: one sample wholly wrong
    # signal 4 + 2 = 6, error 1
    assert snr_db(audio, reference, torch.tensor([4, 2])) == pytest.approx(10 * math.log10(6))


@pytest.fixture(scope="module")
def demo_models_and_mels():
    voice = demo_voice()
    assert voice is not None, "the demo voice ships in checkpoints/"
    tacotron2, waveglow = load_models(Settings(device="cpu"), voice)
    return waveglow, voice_mels(tacotron2, LINES, torch.device("cpu"))


def test_the_demo_voices_tacotron2_makes_mels_that_stop_on_their_own(demo_models_and_mels):
    _, (mel, frames, seeds) = demo_models_and_mels
    assert mel.shape[0] == len(LINES) and seeds.tolist() == [0, 1, 2, 3]
    # each line stops on its gate, at about espeak-ng's pace (15 characters a
    # second, 22050 / 256 frames a second), not at the decoder's step limit
    expected = torch.tensor([len(line) / 15 * 22050 / 256 for line in LINES])
    assert ((frames > 0.6 * expected) & (frames < 1.5 * expected)).all(), (frames, expected)
    assert torch.isfinite(mel).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_the_fast_waveglow_in_16_bits_is_as_close_to_fp32_as_the_eager_model_on_the_demo_voice(
        demo_models_and_mels, dtype):
    """On CPU the fast path is plain torch over folded, re-laid weights: in
    16 bits on trained weights it must lose nothing to the eager model in
    the same dtype (folding, the folded weights' range, the gate). Both
    round their products' outputs to 16 bits, in different places, so the
    fast path may sit a rounding's worth from eager: 1 dB, where the
    gate's sigmoid taken from a half-precision tanh cost 27 dB."""
    waveglow, (mel, frames, seeds) = demo_models_and_mels
    fidelity = waveglow_fidelity(waveglow, mel, frames, seeds, dtype)
    print(f"{dtype}: fast {fidelity.fast:.1f} dB, eager {fidelity.eager:.1f} dB against fp32")
    floor = {torch.float16: 45.0, torch.bfloat16: 30.0}[dtype]   # a 16-bit model, not a broken one
    assert fidelity.eager > floor
    assert fidelity.margin >= -1.0, fidelity


def test_the_fast_waveglow_in_bf16_on_a_cpu_never_makes_nan(demo_models_and_mels):
    """A 16-bit CPU matmul over one layer's columns of the activations read
    the later layers' columns, not written yet: where the memory held NaN
    (half the runs), whole stretches of audio were NaN."""
    waveglow, (mel, frames, seeds) = demo_models_and_mels
    model = copy.deepcopy(waveglow).float().eval()
    for _ in range(6):
        with torch.inference_mode():
            audio = FastWaveGlow(model, torch.bfloat16).infer(mel.to(torch.bfloat16), frames, seeds, 0.666)
        assert torch.isfinite(audio).all()


def test_fidelity_leaves_the_model_in_float32_on_its_device(demo_models_and_mels):
    waveglow, (mel, frames, seeds) = demo_models_and_mels
    waveglow_fidelity(waveglow, mel[:1, :, :20], torch.tensor([20]), seeds[:1], torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in waveglow.parameters())
