"""tts_cli against NVIDIA's reference code.

The checkpoints in tests/data were built, saved and run by NVIDIA's own
Tacotron2 and WaveGlow (tests/data/make_goldens.py, at the commits that
tests/data/README.md names), on CPU in float32, one line at a time. Here the
same files go through tts_cli's loader and engine, on CPU in float32, and
must give NVIDIA's symbol ids, stop frames, mels (within MEL_TOLERANCE) and
audio (within AUDIO_TOLERANCE). NVIDIA's prenet dropout and WaveGlow noise
were made to be tts_cli's draws for each case's seed, so a seeded line here
is compared with NVIDIA's run of the same line with the same random draws.
"""
from pathlib import Path

import pytest
import torch

from checkpoint_files import write_ngc_waveglow
from tts_cli import randomness
from tts_cli.checkpoints import load_waveglow_weights
from tts_cli.config import Settings
from tts_cli.engine import Engine, Job
from tts_cli.loading import load_models
from tts_cli.text import text_to_sequence
from tts_cli.voice import Voice
from tiny_models import engine_settings

DATA = Path(__file__).parent / "data"
GOLDENS = torch.load(DATA / "nvidia_goldens.pt", weights_only=True)
TACOTRON2 = GOLDENS["tacotron2"]
MEL_TOLERANCE = 1e-4
AUDIO_TOLERANCE = 2e-5

# The WaveGlow files: NVIDIA's current pickled module (zip serialization),
# its release format before Aug 2019 (per-layer conditioning, torch's
# older non-zip serialization), and the current one's weights as
# DeepLearningExamples' state_dict (written here: NVIDIA's code makes none).
NGC_FORM = "nvidia_waveglow.pt as a DeepLearningExamples state_dict"
WAVEGLOW_FORMS = ["nvidia_waveglow.pt", "nvidia_waveglow_2019.pt", NGC_FORM]


def _id(case: dict) -> str:
    dropout = f"seed {case['seed']}" if case["seed"] is not None else "no dropout"
    return f"text {case['text']}, {dropout}"


def _settings(prenet_dropout: float, sigma: float = 0.666) -> Settings:
    """NVIDIA's decoding rules as the goldens ran them; no denoiser (NVIDIA's
    inference runs none unless asked); no alignment checks (they could keep
    a retry's seed instead of the line's)."""
    return engine_settings(max_decoder_steps=TACOTRON2["decode"]["max_decoder_steps"],
                           gate_threshold=TACOTRON2["decode"]["gate_threshold"], prenet_dropout=prenet_dropout,
                           sigma=sigma, denoiser_strength=0.0)


@pytest.fixture(scope="module")
def waveglow_files(tmp_path_factory) -> dict[str, Path]:
    ngc = tmp_path_factory.mktemp("ngc") / "waveglow_ngc.pt"
    write_ngc_waveglow(ngc, load_waveglow_weights(DATA / "nvidia_waveglow.pt"))
    return {"nvidia_waveglow.pt": DATA / "nvidia_waveglow.pt",
            "nvidia_waveglow_2019.pt": DATA / "nvidia_waveglow_2019.pt", NGC_FORM: ngc}


def _engine(waveglow_file: Path, settings: Settings) -> Engine:
    """The files read and built as the CLI does (loading.load_models), in an engine on CPU, float32."""
    tacotron2, waveglow = load_models(Settings(), Voice(DATA / "nvidia_tacotron2.pt", waveglow_file))
    return Engine(tacotron2, waveglow, torch.device("cpu"), torch.float32, settings)


@pytest.mark.parametrize("text, ids", list(zip(TACOTRON2["texts"], TACOTRON2["ids"])))
def test_symbol_ids_are_nvidias(text, ids):
    """NVIDIA's text_to_sequence(text, ['english_cleaners']), which the
    reference normalization is: numbers, money, an abbreviation, non-ASCII
    punctuation and letters, £, ARPAbet in braces."""
    assert text_to_sequence(text, "reference") == ids


@pytest.mark.parametrize("case", TACOTRON2["cases"], ids=_id)
def test_mel_stop_and_attention_are_nvidias(case):
    engine = _engine(DATA / "nvidia_waveglow.pt", _settings(case["prenet_dropout"]))
    ids = TACOTRON2["ids"][case["text"]]
    decoded = engine.decode_only([Job(ids, seed=case["seed"] or 0)])
    frames = int(decoded.frames[0])
    assert frames == case["frames"] and not bool(decoded.truncated[0]), "the gate stops where NVIDIA's does"
    torch.testing.assert_close(decoded.mel[0, :, :frames], case["mel"], rtol=0, atol=MEL_TOLERANCE)
    # the attention's path (its peak symbol and weight per frame), which the alignment checks judge
    assert decoded.attention.positions[0, :frames].tolist() == case["attention_position"].tolist()
    torch.testing.assert_close(decoded.attention.peaks[0, :frames], case["attention_peak"], rtol=0, atol=MEL_TOLERANCE)


@pytest.mark.parametrize("form", WAVEGLOW_FORMS)
@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "plain model"])
def test_audio_from_nvidias_mel_is_nvidias(form, fast, waveglow_files):
    file = "nvidia_waveglow.pt" if form == NGC_FORM else form
    cases = [c for c in GOLDENS["waveglow"] if c["file"] == file]
    engine = _engine(waveglow_files[form], _settings(0.0, sigma=cases[0]["sigma"]))
    if fast:
        assert engine.fast_waveglow is not None, "the CPU default is the fast path"
    else:
        engine = engine.eager()
    for case in cases:
        mel = TACOTRON2["cases"][case["mel_of"]]["mel"]
        audio = engine.vocode(mel[None], torch.tensor([mel.shape[1]]), torch.tensor([case["seed"]]))
        torch.testing.assert_close(audio[0], case["audio"], rtol=0, atol=AUDIO_TOLERANCE)


def _whole_line_cases():
    """WaveGlow cases whose line, with one seed, is NVIDIA's whole run: the
    mel made with the same seed as the noise, or with dropout off."""
    for case in GOLDENS["waveglow"]:
        line = TACOTRON2["cases"][case["mel_of"]]
        if line["seed"] in (None, case["seed"]):
            yield pytest.param(case, line, id=f"{case['file']}, {_id(line)}")


@pytest.mark.parametrize("case, line", list(_whole_line_cases()))
def test_a_line_synthesized_is_nvidias_audio(case, line):
    """Text in, audio out, through the engine as the CLI runs it: NVIDIA's
    Tacotron2 then NVIDIA's WaveGlow on its mel, with the line's seed."""
    engine = _engine(DATA / case["file"], _settings(line["prenet_dropout"], sigma=case["sigma"]))
    text = TACOTRON2["texts"][line["text"]]
    [result] = engine.synthesize([Job(text_to_sequence(text, "reference"), seed=case["seed"])])
    assert result.frames == line["frames"] and not result.truncated
    torch.testing.assert_close(torch.from_numpy(result.audio), case["audio"], rtol=0, atol=AUDIO_TOLERANCE)


def test_the_goldens_random_draws_are_still_tts_clis():
    """The goldens hold NVIDIA's outputs for tts_cli's prenet masks and noise
    as drawn when they were made. Should the draws for a seed change (and a
    seeded line's audio with them), the comparisons above fail for that
    reason alone: this test says so, and the goldens must be made again."""
    for line in TACOTRON2["cases"]:
        if line["seed"] is None:
            continue
        head = line["prenet_mask_head"]                   # (steps, both layers' units)
        width = head.shape[1] // 2
        for step in range(head.shape[0]):
            seed, at = torch.tensor([line["seed"]]), torch.tensor([step])
            drawn = torch.cat([randomness.dropout_keep(seed, at, 1 + layer, width, line["prenet_dropout"])[0]
                               for layer in (0, 1)])
            assert torch.equal(drawn, head[step]), f"prenet masks of seed {line['seed']}, step {step}"
    for case in GOLDENS["waveglow"]:
        channels, steps = case["noise_shape"]             # the first draw: the last flow's channels
        head = case["noise_head"]
        noise = randomness.normal(torch.tensor([case["seed"]]), randomness.NOISE_STREAM, channels, steps)
        # Box-Muller's log and cos round differently by a unit in the last
        # place on CPUs with and without AVX-512; a changed draw is another number
        assert torch.allclose(noise.flatten()[: head.numel()], head, rtol=0, atol=1e-6), \
            f"WaveGlow noise of seed {case['seed']}"
