"""WaveGlow and the denoiser: dimensions from weights, lengths, batch independence."""
import pytest
import torch

from tts_cli.waveglow import PUBLISHED_DIMS as PUBLISHED, Denoiser, WaveGlow, WaveGlowDims
from tiny_models import HOP, N_MEL, WAVEGLOW_DIMS, tiny_waveglow



def test_dimensions_are_read_from_the_weights():
    for dims in (WAVEGLOW_DIMS, PUBLISHED):
        with torch.device("meta"):
            sd = WaveGlow(dims).state_dict()
        assert WaveGlowDims.from_state_dict(sd) == dims


def padded_mels(frames, seed=0):
    g = torch.Generator().manual_seed(seed)
    mel = torch.randn(len(frames), N_MEL, max(frames), generator=g)
    keep = torch.arange(max(frames))[None, None, :] < torch.tensor(frames)[:, None, None]
    return mel * keep, torch.tensor(frames)


@torch.inference_mode()
def test_audio_has_hop_samples_per_frame_and_batched_equals_alone():
    model = tiny_waveglow()
    mel, frames = padded_mels([3, 29, 11])
    seeds = torch.tensor([4, 5, 6])
    audio = model.infer(mel, frames, seeds, sigma=0.666)
    assert audio.shape == (3, 29 * HOP)
    assert audio.dtype == torch.float32
    for i, n in enumerate(frames.tolist()):
        alone = model.infer(mel[i:i + 1, :, :n], frames[i:i + 1], seeds[i:i + 1], sigma=0.666)
        assert alone.shape == (1, n * HOP)
        scale = alone.abs().max()
        assert torch.allclose(audio[i, : n * HOP], alone[0], atol=1e-5 * scale), f"item {i}"
        assert audio[i, n * HOP:].abs().max() == 0 if n < 29 else True


@torch.inference_mode()
def test_sigma_zero_is_deterministic_and_noise_follows_the_seed():
    model = tiny_waveglow()
    mel, frames = padded_mels([6])
    quiet = [model.infer(mel, frames, torch.tensor([s]), sigma=0.0) for s in (1, 2)]
    assert torch.equal(quiet[0], quiet[1])
    noisy = [model.infer(mel, frames, torch.tensor([s]), sigma=0.666) for s in (1, 1, 2)]
    assert torch.equal(noisy[0], noisy[1])
    assert not torch.allclose(noisy[0], noisy[2])


@torch.inference_mode()
def test_denoiser_removes_the_models_own_bias_and_keeps_length():
    model = tiny_waveglow()
    denoiser = Denoiser.for_model(model, torch.float32)
    assert denoiser.bias_magnitude.shape == (513, 1)
    mel = torch.zeros(1, N_MEL, 20)
    bias_audio = model.infer(mel, torch.tensor([20]), torch.tensor([0]), sigma=0.0)[0]
    cleaned = denoiser(bias_audio, strength=1.0)
    assert cleaned.shape == bias_audio.shape
    assert cleaned.pow(2).mean() < 0.5 * bias_audio.pow(2).mean()
    untouched = denoiser(bias_audio, strength=0.0)
    assert torch.equal(untouched, bias_audio)


@pytest.mark.parametrize("fft_rows", [None, 4096, 7])
@torch.inference_mode()
def test_the_batched_denoiser_gives_each_item_what_it_gets_alone(fft_rows):
    # The engine denoises a whole batch at once; each line's audio must not
    # depend on its neighbours' lengths (reflection at its own end, its own
    # frames' window sum), nor on how its frames fall into the FFT groups.
    denoiser = Denoiser.for_model(tiny_waveglow(), torch.float32)
    denoiser.fft_rows = fft_rows
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([513, 4000, 256 * 30, 1100, 777, 300])   # 300: too short to pad, unchanged
    audio = torch.randn(len(lengths), int(lengths.max()) + 256, generator=g)
    batched = denoiser.batch(audio, lengths, strength=0.5)
    for item, n in enumerate(lengths.tolist()):
        alone = denoiser(audio[item, :n].clone(), strength=0.5)
        torch.testing.assert_close(batched[item, :n], alone, atol=1e-5, rtol=0)
        assert not batched[item, n:].any()
    assert not torch.allclose(batched[1, :4000], audio[1, :4000], atol=1e-3), "the denoiser changed nothing"


@torch.inference_mode()
def test_the_batched_denoiser_transforms_the_same_number_of_frames_whatever_the_batch(monkeypatch):
    # cuFFT makes a plan for every new transform shape. With one shape per
    # batch length, a process's first corpus run made two plans for each
    # batch; later runs found them cached.
    denoiser = Denoiser.for_model(tiny_waveglow(), torch.float32)
    denoiser.fft_rows = 16
    shapes = []
    for name in ("rfft", "irfft"):
        transform = getattr(torch.fft, name)
        monkeypatch.setattr(torch.fft, name, lambda x, *a, _t=transform, **k: shapes.append(x.shape) or _t(x, *a, **k))
    for lengths in ([513, 4000, 2100], [9000], [600, 700, 800, 900, 1000]):
        audio = torch.randn(len(lengths), max(lengths))
        denoiser.batch(audio, torch.tensor(lengths), strength=0.5)
    assert len(shapes) > 6 and {rows for rows, _ in shapes} == {16}


def test_the_engine_denoises_in_batches_as_it_did_item_by_item():
    from tts_cli.engine import Engine, Job
    from tiny_models import engine_settings, force_lengths, tiny_tacotron2
    settings = engine_settings(denoiser_strength=0.5, max_decoder_steps=12)
    tacotron2 = force_lengths(tiny_tacotron2(seed=2), {4: 9, 2: 2, 3: 5})
    engine = Engine(tacotron2, tiny_waveglow(seed=2), torch.device("cpu"), torch.float32, settings)
    jobs = [Job([12, 20, 33, 40][:n], seed=n) for n in (4, 2, 3)]
    batched = engine.synthesize(jobs)
    denoiser, engine.denoiser = engine.denoiser, None
    raw = engine.synthesize(jobs)
    for a, b in zip(batched, raw, strict=True):
        one_by_one = denoiser(torch.from_numpy(b.audio), 0.5)   # the item alone, on its own samples
        assert a.audio.shape == b.audio.shape
        torch.testing.assert_close(torch.from_numpy(a.audio), one_by_one, atol=1e-5, rtol=0)
