"""recipes/demo-voice: mel features, data split, and both training scripts
(tiny models, synthetic audio, CPU): they train, checkpoint, resume, and export
files that tts_cli's own loader reads into models that synthesize."""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import soundfile
import torch
from torch.nn import functional as F

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "demo-voice"
sys.path.insert(0, str(RECIPE))

import common  # noqa: E402
import construct_waveglow  # noqa: E402
import evaluate  # noqa: E402
import make_data  # noqa: E402
import mel  # noqa: E402
import train_tacotron2  # noqa: E402
import train_waveglow  # noqa: E402
import word_timings  # noqa: E402
from tts_cli import checkpoints  # noqa: E402
from tts_cli import waveglow as waveglow_module  # noqa: E402
from tts_cli.tacotron2 import DecodeSettings, Tacotron2, decode  # noqa: E402
from tts_cli.waveglow import WaveGlow  # noqa: E402

SR = 22050
# What every demo WaveGlow export says about its voice (common.DEMO_VOICE).
DEMO_VOICE = checkpoints.VoiceInfo(name="demo", sample_rate=SR, denoiser_strength=0.0)

# --------------------------------------------------------------------------
# Mel features


def test_slaney_mel_scale_matches_hand_values():
    # Linear below 1 kHz at 200/3 Hz per mel; above, 27 mels per factor 6.4.
    hz = torch.tensor([0.0, 500.0, 1000.0, 6400.0])
    assert mel.hz_to_mel(hz).tolist() == pytest.approx([0.0, 7.5, 15.0, 42.0])
    assert mel.mel_to_hz(mel.hz_to_mel(hz)).tolist() == pytest.approx(hz.tolist())


def test_filterbank_bands_have_equal_area_and_stay_inside_0_to_8000_hz():
    bank = mel.mel_filterbank()
    bin_hz = SR / 1024
    assert bank.shape == (80, 513)
    assert bool((bank >= 0).all())
    freqs = torch.arange(513) * bin_hz
    assert float(bank[:, freqs > 8000].abs().max()) == 0.0
    # Slaney normalisation: each triangle has unit area in Hz, so bands above
    # 1 kHz (sampled by many bins) sum to about 1 / bin width; without it the
    # high bands, many times wider, would dominate the features.
    edges = mel.mel_to_hz(torch.linspace(0, float(mel.hz_to_mel(torch.tensor(8000.0))), 82))
    wide = [i for i in range(80) if edges[i] > 1000]
    areas = bank[wide].sum(1) * bin_hz
    assert areas.tolist() == pytest.approx([1.0] * len(wide), rel=0.05)
    assert float(areas.mean()) == pytest.approx(1.0, rel=0.01)


def test_pure_tone_lands_in_the_band_centred_nearest_its_frequency():
    extract = mel.MelExtractor()
    edges = mel.mel_to_hz(torch.linspace(0, float(mel.hz_to_mel(torch.tensor(8000.0))), 82))
    centres = edges[1:-1]
    for tone in (440.0, 2000.0, 5000.0):
        t = torch.arange(SR) / SR
        spec = extract(0.5 * torch.sin(2 * math.pi * tone * t))
        loudest = int(spec[:, 10:-10].mean(1).argmax())
        assert loudest == int((centres - tone).abs().argmin()), tone


def test_frame_count_and_silence_floor_match_the_reference():
    extract = mel.MelExtractor()
    for samples in (1000, 2560, 22050):
        assert extract(torch.zeros(samples)).shape == (80, samples // 256 + 1)
    # Silence sits exactly at log(1e-5), the reference's clamp.
    assert float(extract(torch.zeros(4096)).max()) == pytest.approx(math.log(1e-5))


def test_wav_is_read_at_reference_scale(tmp_path):
    path = tmp_path / "a.wav"
    soundfile.write(str(path), torch.tensor([0, 16384, -32768], dtype=torch.int16).numpy(), SR,
                    subtype="PCM_16")
    assert mel.read_wav(path).tolist() == [0.0, 0.5, -1.0]
    soundfile.write(str(path), torch.zeros(10).numpy(), 16000, subtype="PCM_16")
    with pytest.raises(ValueError, match="16000 Hz"):
        mel.read_wav(path)


# --------------------------------------------------------------------------
# Data


def test_held_out_lines_depend_only_on_ids():
    rows = [(f"LJ001-{i:04d}", f"line {i}") for i in range(300)]
    train, held = make_data.split_held_out(rows)
    assert len(held) == 100 and len(train) == 200
    _, held_reversed = make_data.split_held_out(rows[::-1] + [("LJ999-0001", "extra")])
    # Adding a line may take one slot; the rest of the held-out set stays put.
    assert len({u for u, _ in held} & {u for u, _ in held_reversed}) >= 99


def test_a_larger_corpus_holds_out_the_same_lines_as_the_sample():
    # Models trained on the 2,000-line sample go on training on the 12,500
    # lines: none of the 100 lines they are measured on may enter training.
    sample = make_data.read_transcripts(make_data.SAMPLE_TRANSCRIPTS)
    full = make_data.read_transcripts(make_data.DEFAULT_TRANSCRIPTS)
    ids = {u for u, _ in sample}
    assert len(sample) == 2000 and len(full) == 12500 and ids <= {u for u, _ in full}
    _, held_sample = make_data.split_held_out(sample, among=ids)
    train_full, held_full = make_data.split_held_out(full, among=ids)
    assert held_full == held_sample and len(train_full) == 12400
    assert not {u for u, _ in held_sample} & {u for u, _ in train_full}
    # a corpus sharing too few ids with the sample holds out its own
    other = [(f"X{i}", "line") for i in range(150)] + sample[:5]
    _, held_other = make_data.split_held_out(other, among=ids)
    assert len(held_other) == 100 and not {u for u, _ in held_other} <= ids


def test_espeak_reads_the_cleaned_line():
    assert make_data.spoken_text("Mr. Smith paid $5.") == "mister smith paid five dollars."


def test_word_error_rate_counts_edits_over_reference_words():
    assert evaluate.wer([("the cat sat", "the cat sat")]) == 0.0
    # "20" is cleaned to "twenty" first, so it matches the spelled-out reference.
    assert evaluate.wer([("twenty feet away", "20 feet, away!")]) == 0.0
    assert evaluate.wer([("a b c d", "a x c"), ("e f", "e f g")]) == pytest.approx(3 / 6)


def _word_firsts(text: str) -> list[int]:
    """Where each space-separated word of ``text`` starts."""
    return [i for i, c in enumerate(text) if c != " " and (i == 0 or text[i - 1] == " ")]


def _tone_data(folder: Path, lines: list[tuple[str, str]], seconds: float = 0.4) -> Path:
    """A make_data-style folder with synthetic speech (tones, not espeak-ng)."""
    (folder / "wavs").mkdir(parents=True)
    for n, (uid, _) in enumerate(lines):
        t = torch.arange(int(SR * (seconds + 0.1 * n))) / SR
        audio = 0.3 * torch.sin(2 * math.pi * (200 + 100 * n) * t) + 0.01 * torch.randn(len(t))
        soundfile.write(str(folder / "wavs" / f"{uid}.wav"), audio.numpy(), SR, subtype="PCM_16")
    make_data.write_filelist(folder / "train.psv", lines[:-1])
    make_data.write_filelist(folder / "heldout.psv", lines[-1:])
    mel.cache_mels(folder, "cpu")
    # word starts in word_timings.py's layout: the words spread evenly over each tone
    starts = {}
    for n, (uid, text) in enumerate(lines):
        samples = int(SR * (seconds + 0.1 * n))
        firsts = _word_firsts(text)
        starts[uid] = torch.tensor([(c, k * samples // len(firsts)) for k, c in enumerate(firsts)]
                                   + [(len(text), samples)])
    torch.save(starts, folder / "word_starts.pt")
    return folder


@pytest.fixture(scope="module")
def tone_data(tmp_path_factory):
    lines = [("a1", "hello there."), ("a2", "a cat sat."), ("a3", "on the mat."), ("a4", "hi.")]
    return _tone_data(tmp_path_factory.mktemp("data"), lines)


# --------------------------------------------------------------------------
# Tacotron2


TINY_T2 = ("embedding_dim=16,attention_rnn_dim=16,decoder_rnn_dim=16,attention_dim=8,"
           "location_filters=4,location_kernel=7,postnet_dim=8,prenet_dims=16:16")


def _no_dropout(monkeypatch):
    for name in ("P_DROPOUT", "P_ATTENTION_DROPOUT", "P_DECODER_DROPOUT"):
        monkeypatch.setattr(train_tacotron2, name, 0.0)


def test_teacher_forced_pass_reproduces_inference_on_its_own_output(monkeypatch):
    # Fed the frames the inference decoder produced, the training pass must
    # compute the same frames, gates and postnet mel; otherwise the model is
    # trained for a computation it never runs.
    _no_dropout(monkeypatch)
    torch.manual_seed(0)
    dims = train_tacotron2.DEMO_DIMS.__class__(**{
        **train_tacotron2.DEMO_DIMS.__dict__, **common.parse_dims(TINY_T2)})
    model = Tacotron2(dims).eval()
    ids = torch.tensor([[30, 31, 32, 11, 40], [33, 34, 35, 0, 0]])
    lengths = torch.tensor([5, 3])
    with torch.no_grad():
        memory, invalid = model.encode(ids, lengths)
        processed = model.decoder.attention_layer.memory_layer(memory)
        state = model.decoder.initial_state(memory)
        frames, gates = [], []
        for _ in range(12):
            state, gate = model.decoder.step(state, memory, processed, invalid, None)
            frames.append(state.frame)
            gates.append(gate)
        frames, gates = torch.stack(frames, 2), torch.stack(gates, 1)
        out = train_tacotron2.forward(model, ids, lengths, frames, torch.tensor([12, 12]))
        post = model.postprocess(frames, torch.tensor([12, 12]))
    torch.testing.assert_close(out["frames"], frames, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out["gates"], gates, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out["post"], post, atol=1e-5, rtol=1e-4)


def _tiny_t2(seed=0) -> Tacotron2:
    torch.manual_seed(seed)
    dims = train_tacotron2.DEMO_DIMS.__class__(**{
        **train_tacotron2.DEMO_DIMS.__dict__, **common.parse_dims(TINY_T2)})
    return Tacotron2(dims)


def test_frame_dropout_makes_the_teacher_forced_frames_come_from_the_text(monkeypatch):
    # With every true frame dropped, what the decoder is fed no longer
    # matters: two different mels give the same frames. Without it they differ.
    _no_dropout(monkeypatch)
    model = _tiny_t2().train()
    for module in model.modules():          # BatchNorm's batch statistics aside
        if isinstance(module, torch.nn.BatchNorm1d):
            module.eval()
    ids, lengths, mel_lengths = torch.tensor([[30, 31, 32, 11, 40]]), torch.tensor([5]), torch.tensor([8])
    one, other = torch.randn(1, 80, 8), torch.randn(1, 80, 8)

    def frames(mels):
        with torch.no_grad():
            return train_tacotron2.forward(model, ids, lengths, mels, mel_lengths)["frames"]
    assert not torch.allclose(frames(one), frames(other))
    monkeypatch.setattr(train_tacotron2, "frame_dropout", 1.0)
    torch.testing.assert_close(frames(one), frames(other))


def test_encoder_without_packing_equals_the_packed_encoder():
    # CUDA graphs cannot hold pack_padded_sequence (it reads the lengths on
    # the host); the in-place version must give the same memory and gradients.
    model = _tiny_t2().train()
    model.encoder.lstm.train()
    ids = torch.tensor([[30, 31, 32, 11, 40, 41, 42], [33, 34, 0, 0, 0, 0, 0], [35, 36, 37, 38, 0, 0, 0]])
    lengths = torch.tensor([7, 2, 4])
    results = []
    for static in (False, True):
        model.zero_grad()
        torch.manual_seed(1)   # the same encoder dropout masks for both
        memory, _ = train_tacotron2.encode(model, ids, lengths, static)
        (memory * torch.linspace(-1, 1, memory.shape[2])).sum().backward()
        results.append((memory.detach(), model.encoder.lstm.weight_hh_l0_reverse.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-6, rtol=1e-5)


def test_step_padded_to_a_bucket_has_the_eager_steps_losses_and_gradients(monkeypatch):
    # The captured steps pad every batch to its bucket's text and frame
    # lengths; with the losses normalised by the batch's own length the
    # training signal must not change. (BatchNorm held in eval mode: in
    # training mode its batch statistics include padding, as the reference's do.)
    _no_dropout(monkeypatch)
    model = _tiny_t2().eval()
    ids = torch.tensor([[30, 31, 32, 11, 40], [33, 34, 35, 0, 0]])
    lengths, mel_lengths = torch.tensor([5, 3]), torch.tensor([9, 6])
    torch.manual_seed(2)
    mels = torch.randn(2, 80, 9) * (torch.arange(9) < mel_lengths[:, None])[:, None, :]

    # a words guide path, padded (as CapturedSteps does) with zeros past each line
    centres = torch.tensor([[0, 0, 1, 1, 2, 3, 3, 4, 4.5], [0, 0.5, 1, 1.5, 2, 2.5, 0, 0, 0]])
    widths = torch.tensor([3.0, 3.0])

    def loss_and_grads(ids, mels, static, frames, guide, path):
        model.zero_grad()
        out = train_tacotron2.forward(model, ids, lengths, mels, mel_lengths, static=static)
        parts = train_tacotron2.losses(out, mels, lengths, mel_lengths, guide, frames=frames,
                                       guide_path=path)
        parts["total"].backward()
        return parts["total"].detach(), [p.grad.clone() for p in model.parameters()]

    eager = loss_and_grads(ids, mels, False, None, 0.5, (centres, widths))
    padded = loss_and_grads(torch.nn.functional.pad(ids, (0, 4)), torch.nn.functional.pad(mels, (0, 7)),
                            True, torch.tensor(9.0), torch.tensor(0.5),
                            (torch.nn.functional.pad(centres, (0, 7)), widths))
    assert eager[0] > train_tacotron2.losses(
        train_tacotron2.forward(model, ids, lengths, mels, mel_lengths), mels, lengths, mel_lengths,
        0.0)["total"]   # the guide is in the total
    torch.testing.assert_close(padded[0], eager[0], atol=1e-6, rtol=1e-5)
    for a, b in zip(padded[1], eager[1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_packed_checkpoint_resumes_with_the_same_weights_and_second_moments(tmp_path):
    import portable
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
    common.save_checkpoint(tmp_path / "c.pt", model=model.state_dict(), optimizer=optimizer.state_dict(), step=3)
    assert portable.main(["pack", str(tmp_path / "c.pt"), str(tmp_path / "p.pt")]) == 0
    assert portable.main(["unpack", str(tmp_path / "p.pt"), str(tmp_path / "u.pt")]) == 0
    assert (tmp_path / "p.pt").stat().st_size < (tmp_path / "c.pt").stat().st_size
    restored = torch.optim.Adam(torch.nn.Linear(4, 3).parameters(), lr=1e-3)
    unpacked = common.load_checkpoint(tmp_path / "u.pt")
    restored.load_state_dict(unpacked["optimizer"])
    assert unpacked["step"] == 3 and torch.equal(unpacked["model"]["weight"], model.weight.detach())
    for i, state in optimizer.state_dict()["state"].items():
        again = restored.state_dict()["state"][i]
        assert float(again["step"]) == 3
        torch.testing.assert_close(again["exp_avg_sq"], state["exp_avg_sq"], rtol=1e-2, atol=0)
        assert not again["exp_avg"].any()


def test_averaged_checkpoint_holds_the_mean_weights_and_resumes_as_the_last(tmp_path, capsys):
    # average.py: the voice may ship the mean of a run's last states; the
    # mean must be of the weights only, the rest (step, Adam, BatchNorm's
    # batch count) the last state's, so the result exports and resumes.
    import average
    states = []
    for step in (10, 20, 30):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
        for _ in range(step // 10):  # the last state has seen the most batches
            model(torch.randn(8, 4))
        optimizer = torch.optim.Adam(model.parameters())
        common.save_checkpoint(tmp_path / f"{step}.pt", model=model.state_dict(),
                               optimizer=optimizer.state_dict(), step=step)
        states.append(model.state_dict())
    paths = [str(tmp_path / f"{step}.pt") for step in (10, 20, 30)]
    assert average.main([str(tmp_path / "mean.pt"), *paths]) == 0
    mean = common.load_checkpoint(tmp_path / "mean.pt")
    assert mean["step"] == 30
    for name in ("0.weight", "0.bias", "1.running_mean", "1.running_var"):
        torch.testing.assert_close(mean["model"][name], sum(s[name] for s in states) / 3)
    assert mean["model"]["1.num_batches_tracked"] == states[-1]["1.num_batches_tracked"] == 3
    restored = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    restored.load_state_dict(mean["model"])
    torch.optim.Adam(restored.parameters()).load_state_dict(mean["optimizer"])

    common.save_checkpoint(tmp_path / "wide.pt", step=40,
                           model=torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5)).state_dict())
    assert average.main([str(tmp_path / "bad.pt"), paths[0], str(tmp_path / "wide.pt")]) == 1
    assert "not one model" in capsys.readouterr().err and not (tmp_path / "bad.pt").exists()
    assert average.main([str(tmp_path / "bad.pt"), paths[0], str(tmp_path / "gone.pt")]) == 1
    assert "gone.pt does not exist" in capsys.readouterr().err


def test_gate_target_turns_on_at_each_utterances_last_frame():
    targets = train_tacotron2.gate_targets(torch.tensor([3, 5]), 5)
    assert targets.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]


def test_the_gates_stop_frames_weigh_more_than_its_speaking_frames():
    logits, targets = torch.randn(3, 7), (torch.rand(3, 7) > 0.7).float()
    plain = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    weighted = train_tacotron2.gate_bce(logits, targets)
    w = train_tacotron2.GATE_POS_WEIGHT
    assert w > 1
    torch.testing.assert_close(weighted, torch.where(targets.bool(), w * plain, plain))
    torch.testing.assert_close(train_tacotron2.gate_bce(logits, targets, 1.0), plain)


def _train_t2(data, out, steps):
    return train_tacotron2.main(["--data", str(data), "--out", str(out), "--max-steps", str(steps),
                                 "--batch-size", "2", "--log-every", "1", "--dims", TINY_T2,
                                 "--device", "cpu"])


def _log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


def test_tacotron2_trains_resumes_and_exports_a_loadable_voice(tone_data, tmp_path):
    out = tmp_path / "t2"
    _train_t2(tone_data, out, 2)
    assert [r["step"] for r in _log(out) if "total" in r] == [1, 2]
    assert all(math.isfinite(r["total"]) for r in _log(out) if "total" in r)
    _train_t2(tone_data, out, 3)      # a second run continues from step 2
    log = _log(out)
    assert {"event": "resumed", "step": 2} in log
    assert [r["step"] for r in log if "total" in r] == [1, 2, 3]
    # Each run ends by decoding a held-out line free-running and logging how it went.
    checks = [r for r in log if "heldout_stop_rate" in r]
    assert [r["step"] for r in checks] == [2, 3]
    assert all(0 <= r["heldout_stop_rate"] <= 1 and r["heldout_duration_ratio"] > 0 for r in checks)
    # and the teacher-forced mel loss of held-out and training lines, to tell overfitting
    assert all(0 < r["heldout_mel_loss"] < math.inf and 0 < r["train_lines_mel_loss"] < math.inf for r in checks)
    saved = torch.load(out / "demo_tacotron2.pt", map_location="cpu", weights_only=True)
    assert saved["epoch"] == 3 and all(k.startswith("module.") for k in saved["state_dict"])
    assert saved["state_dict"]["module.embedding.weight"].dtype == torch.float16
    model = Tacotron2.from_state_dict(checkpoints.load_tacotron2_weights(out / "demo_tacotron2.pt"))
    ids = torch.tensor([[30, 31, 32, 11, 40]])
    mels, frames, _, _ = decode(model, ids, torch.tensor([5]), torch.tensor([7]),
                             DecodeSettings(max_decoder_steps=20, prenet_dropout=0.5))
    assert mels.shape[1] == 80 and 1 <= int(frames[0]) <= 20
    assert bool(torch.isfinite(mels).all())


# --------------------------------------------------------------------------
# WaveGlow


TINY_WG = "n_flows=4,n_early_every=2,wn_layers=2,wn_channels=8"


def _tiny_waveglow(seed=0) -> WaveGlow:
    dims = train_waveglow.DEMO_DIMS.__class__(**{
        **train_waveglow.DEMO_DIMS.__dict__, **common.parse_dims(TINY_WG)})
    model = train_waveglow.build(dims, seed)
    with torch.no_grad():   # non-trivial couplings (build() starts them as identities)
        for wn in model.WN:
            wn.end.weight.normal_(0, 0.05)
            wn.end.bias.normal_(0, 0.05)
    return model.eval()


def test_upsampler_interpolates_a_constant_mel_to_a_constant():
    d = train_waveglow.DEMO_DIMS
    model = WaveGlow(d)
    with torch.no_grad():
        model.upsample.weight.copy_(train_waveglow.interpolating_upsampler(d))
        model.upsample.bias.zero_()
        spect = model.upsample(torch.full((1, 80, 6), 2.0))[:, :, : 6 * 256]
    # Past the first frame (where only one triangle reaches) every sample is 2.
    torch.testing.assert_close(spect[:, :, 256:], torch.full_like(spect[:, :, 256:], 2.0))


def test_forward_flow_is_inverted_by_tts_cli_inference(monkeypatch):
    # z from the training direction, fed to tts_cli's WaveGlow.infer as its
    # noise, must give back the audio: the recipe trains exactly the flow
    # that synthesis runs backwards.
    torch.manual_seed(1)
    model = _tiny_waveglow()
    frames = 6
    audio = 0.3 * torch.randn(1, frames * 256)
    mel_in = torch.randn(1, 80, frames)
    with torch.no_grad():
        z, _, _ = train_waveglow.flow_forward(model, audio, mel_in, "fp32")
    early = model.dims.n_early_size
    pieces = iter([z[:, early:], z[:, :early]])   # infer draws the last flow's channels first
    monkeypatch.setattr(waveglow_module.randomness, "normal", lambda *a, **k: next(pieces))
    with torch.no_grad():
        back = model.infer(mel_in, torch.tensor([frames]), torch.tensor([0]), sigma=1.0)
    torch.testing.assert_close(back, audio, atol=1e-4, rtol=1e-4)


def test_the_spectral_objectives_inverse_pass_is_what_tts_cli_synthesizes(monkeypatch):
    # The spectral objective trains the inverse pass; with the same noise,
    # tts_cli's WaveGlow.infer must make the same audio, or the voice is
    # trained for a computation it never runs.
    torch.manual_seed(2)
    model = _tiny_waveglow()
    with torch.no_grad():   # 1x1 convolutions that are no longer rotations
        for inv in model.convinv:
            inv.conv.weight.add_(0.2 * torch.randn_like(inv.conv.weight))
    frames, early = 6, model.dims.n_early_size
    mel_in = torch.randn(1, 80, frames)
    noise = 0.666 * torch.randn(1, model.dims.n_group, frames * 256 // model.dims.n_group)
    w_inverse = train_waveglow.inverse_1x1([inv.conv.weight.squeeze(2) for inv in model.convinv])
    with torch.no_grad():
        ours = train_waveglow.flow_inverse(model, w_inverse, mel_in, noise, "fp32")
    n_final = model.dims.n_group - early
    pieces = iter([noise[:, :n_final] / 0.666, noise[:, n_final:] / 0.666])
    monkeypatch.setattr(waveglow_module.randomness, "normal", lambda *a, **k: next(pieces))
    with torch.no_grad():
        theirs = model.infer(mel_in, torch.tensor([frames]), torch.tensor([0]), sigma=0.666)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_graph_safe_inverse_of_the_1x1_convolutions_is_the_matrix_inverse_and_its_gradient():
    torch.manual_seed(4)
    # conditioned like the trained ones (1.2-40) and worse
    u, _ = torch.linalg.qr(torch.randn(8, 8))
    q, _ = torch.linalg.qr(torch.randn(8, 8))
    badly = u @ torch.diag(torch.logspace(0, 3, 8)) @ q      # condition number 1000
    weights = [torch.randn(8, 8), badly, torch.eye(6) + 0.3 * torch.randn(6, 6)]
    weights = [w.double().requires_grad_() for w in weights]
    ours = train_waveglow.inverse_1x1([w.float() for w in weights])
    for w, v in zip(weights, ours):
        torch.testing.assert_close(v.double(), torch.linalg.inv(w), atol=1e-3, rtol=1e-3)
    probe = [torch.randn(w.shape, dtype=torch.float64) for w in weights]
    grads = torch.autograd.grad(sum((v.double() * r).sum() for v, r in zip(ours, probe)), weights)
    exact = torch.autograd.grad(sum((torch.linalg.inv(w) * r).sum() for w, r in zip(weights, probe)), weights)
    for g, e in zip(grads, exact):
        torch.testing.assert_close(g, e, atol=1e-2 * float(e.abs().max()), rtol=1e-2)


def test_spectral_loss_is_zero_for_the_target_and_grows_with_the_difference():
    torch.manual_seed(3)
    t = torch.arange(8192) / SR
    target = (0.3 * torch.sin(2 * math.pi * 220 * t))[None].repeat(2, 1)
    windows = train_waveglow.spectral_windows("cpu")
    loss = lambda audio: float(train_waveglow.spectral_loss(audio, target, windows))  # noqa: E731
    assert loss(target) == pytest.approx(0.0, abs=1e-6)
    near = loss(target + 0.01 * torch.randn_like(target))
    far = loss(target + 0.1 * torch.randn_like(target))
    assert 0 < near < far
    # magnitudes only: the same tone half a period later is (almost) as good
    # as the target; the same tone at half the level is not
    shifted = (0.3 * torch.sin(2 * math.pi * 220 * t + math.pi))[None].repeat(2, 1)
    assert loss(shifted) < 0.1 * loss(0.5 * target)


def test_spectral_training_brings_copy_synthesis_closer_to_the_held_out_audio(tone_data, tmp_path):
    out = tmp_path / "wg"
    assert _train_wg(tone_data, out, 40, "--save-every-minutes", "0.001", "--lr", "3e-3",
                     "--objective", "spectral") == 0
    checks = [r["heldout_mel_l1"] for r in _log(out) if "heldout_mel_l1" in r]
    losses = [r["loss"] for r in _log(out) if "loss" in r]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert checks[-1] < 0.9 * checks[0]


def test_a_waveglow_run_starts_from_an_export_with_its_weights_and_step(tone_data, tmp_path):
    first = tmp_path / "first"
    assert _train_wg(tone_data, first, 3) == 0
    state, step, config = train_waveglow.weights_from_export(first / "demo_waveglow.pt")
    trained = torch.load(first / "checkpoint.pt", weights_only=False)["model"]
    assert step == 3 and config["demo_voice_objective"] == "mle"   # a new run's default
    assert state.keys() == trained.keys()
    for key, value in trained.items():
        torch.testing.assert_close(state[key], value, atol=2e-3, rtol=2e-3)
    again = tmp_path / "again"
    assert _train_wg(tone_data, again, 4, "--init-from", str(first / "demo_waveglow.pt")) == 0
    log = _log(again)
    started = [r for r in log if r.get("event") == "started from export"]
    assert len(started) == 1 and started[0]["step"] == 3
    assert [r["step"] for r in log if "loss" in r] == [4]


def test_a_tacotron2_run_starts_from_an_export_with_its_weights_and_step(tone_data, tmp_path):
    first = tmp_path / "first"
    _train_t2(tone_data, first, 2)
    state, step = train_tacotron2.weights_from_export(first / "demo_tacotron2.pt")
    trained = torch.load(first / "checkpoint.pt", weights_only=False)["model"]
    assert step == 2 and state.keys() == trained.keys()
    for key, value in trained.items():
        torch.testing.assert_close(state[key], value.float() if value.is_floating_point() else value,
                                   atol=2e-3, rtol=2e-3)
    again = tmp_path / "again"
    assert train_tacotron2.main(["--data", str(tone_data), "--out", str(again), "--max-steps", "3",
                                 "--batch-size", "2", "--log-every", "1", "--dims", TINY_T2,
                                 "--device", "cpu", "--init-from", str(first / "demo_tacotron2.pt")]) == 0
    log = _log(again)
    assert log[0]["event"] == "started from export" and log[0]["step"] == 2
    assert [r["step"] for r in log if "total" in r] == [3]


def test_log_determinant_without_cusolver_equals_torch_logdet_in_value_and_gradient():
    # The captured WaveGlow step cannot hold a cuSOLVER factorisation; its
    # Cholesky-based log|det| must be the reference's torch.logdet.
    torch.manual_seed(4)
    weights = []
    for n in (8, 8, 6, 6, 4):
        q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
        w = q + 0.3 * torch.randn(n, n, dtype=torch.float64)   # a rotation, moved as training moves it
        if torch.det(w) < 0:
            w[0] = -w[0]
        weights.append(w.requires_grad_())
    ours = train_waveglow.total_log_abs_det(weights)
    reference = sum(torch.logdet(w) for w in weights)
    torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(ours, weights)
    reference_grads = torch.autograd.grad(reference, weights)
    for a, b in zip(grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_loss_is_the_reference_negative_log_likelihood():
    z = torch.ones(2, 8, 10)
    loss = train_waveglow.waveglow_loss(z, torch.tensor(16.0), torch.tensor(4.0), sigma=1.0)
    assert float(loss) == pytest.approx((160 / 2 - 16 - 4) / 160)


def _train_wg(data, out, steps, *more):
    return train_waveglow.main(["--data", str(data), "--out", str(out), "--max-steps", str(steps),
                                "--batch-size", "2", "--segment", "2048", "--log-every", "1",
                                "--dims", TINY_WG, "--device", "cpu", *more])


@pytest.mark.parametrize("objective", ["spectral", "mle", "hybrid"])
def test_waveglow_trains_resumes_and_exports_a_loadable_vocoder(tone_data, tmp_path, objective):
    out = tmp_path / "wg"
    _train_wg(tone_data, out, 2, "--objective", objective)
    _train_wg(tone_data, out, 3)   # a resumed run keeps its objective
    log = _log(out)
    assert {"event": "resumed", "step": 2, "objective": objective} in log
    assert torch.load(out / "demo_waveglow.pt", weights_only=True)["config"]["demo_voice_objective"] == objective
    assert checkpoints.read_voice_info(out / "demo_waveglow.pt") == DEMO_VOICE
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in log if "loss" in r)
    # Each run ends with a copy-synthesis check of a held-out clip.
    checks = [r for r in log if "heldout_mel_l1" in r]
    assert [r["step"] for r in checks] == [2, 3] and all(r["heldout_mel_l1"] > 0 for r in checks)
    # The fixed upsampler alone is 13.1 MB of float16; deflated, the file is a fraction of that.
    assert (out / "demo_waveglow.pt").stat().st_size < 1_000_000
    saved = torch.load(out / "demo_waveglow.pt", map_location="cpu", weights_only=True)
    names = saved["state_dict"]
    # NGC layout: module. names, weight norm as g/v, one cond layer per WN layer, fp16.
    assert "module.WN.0.cond_layers.1.weight_g" in names and "module.WN.0.start.weight_v" in names
    assert names["module.upsample.weight"].dtype == torch.float16
    weights = checkpoints.load_waveglow_weights(out / "demo_waveglow.pt")
    model = WaveGlow.from_state_dict(weights)
    assert (model.dims.n_flows, model.dims.wn_channels, model.dims.hop_length) == (4, 8, 256)
    # What the loader folded is what was trained (up to fp16 rounding).
    trained = train_waveglow.build(model.dims, 1)
    train_waveglow.load_trained(trained, torch.load(out / "checkpoint.pt", weights_only=False)["model"])
    torch.testing.assert_close(weights["WN.1.cond_layer.weight"],
                               trained.WN[1].cond_layer.weight.detach(), atol=2e-3, rtol=2e-3)
    with torch.no_grad():
        audio = model.infer(torch.randn(1, 80, 5), torch.tensor([5]), torch.tensor([3]), 0.666)
    assert audio.shape == (1, 5 * 256) and bool(torch.isfinite(audio).all())


def test_a_resumed_run_keeps_its_model_size_and_refuses_another(tone_data, tmp_path):
    out = tmp_path / "wg"
    assert _train_wg(tone_data, out, 1) == 0
    # Without --dims the checkpoint's size is used (the default size would not fit it) ...
    assert train_waveglow.main(["--data", str(tone_data), "--out", str(out), "--max-steps", "2",
                                "--batch-size", "2", "--segment", "2048", "--log-every", "1",
                                "--device", "cpu"]) == 0
    assert [r["step"] for r in _log(out) if "loss" in r] == [1, 2]
    # ... and a --dims that contradicts it stops with a message saying so.
    with pytest.raises(SystemExit, match="differs from the checkpoint"):
        _train_wg(tone_data, out, 3, "--dims", TINY_WG + ",wn_layers=3")


def test_dithered_training_audio_is_the_clean_audio_within_the_noise_and_keeps_the_clean_mel(tone_data):
    """espeak-ng's silences are exact zeros, whose likelihood a flow can raise
    without bound; the dither takes them away, and nothing else."""
    data = train_waveglow.AudioSegments(tone_data, "cpu")
    # segments longer than any clip: each ends in zero padding, exact zeros as espeak-ng's silences
    segment = (max(len(c) for c in data.clips) // 256 + 8) * 256
    clean, clean_mel, same = data.batch(3, segment, torch.Generator().manual_seed(5), dither=0.0)
    noisy, noisy_mel, undithered = data.batch(3, segment, torch.Generator().manual_seed(5), dither=2.0)
    assert torch.equal(same, clean) and torch.equal(undithered, clean)
    difference = (noisy - clean).abs()
    assert bool((clean[:, -256:] == 0).all())             # the silences the dither is for
    assert float(difference.max()) <= 1.0 / 32768 and float(difference.min()) < float(difference.max())
    assert bool((noisy[clean == 0] != 0).all())           # no exact zero left
    assert torch.equal(noisy_mel, clean_mel)


def test_a_waveglow_step_without_a_finite_gradient_is_skipped_and_training_goes_on(tone_data, tmp_path,
                                                                                    monkeypatch):
    out = tmp_path / "wg"
    real_loss = train_waveglow.waveglow_loss
    calls = []

    def nan_at_step_2(*a, **k):   # the second training step's loss is NaN, the others are not
        calls.append(1)
        return real_loss(*a, **k) * (float("nan") if len(calls) == 2 else 1.0)
    monkeypatch.setattr(train_waveglow, "waveglow_loss", nan_at_step_2)
    assert _train_wg(tone_data, out, 4) == 0
    log = _log(out)
    steps = [r for r in log if "loss" in r]
    assert [r["skipped"] for r in steps] == [0, 1, 1, 1]
    assert math.isnan(steps[1]["loss"]) and math.isfinite(steps[3]["loss"])
    saved = torch.load(out / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 4 and all(bool(torch.isfinite(v).all()) for v in saved["model"].values())


def test_a_diverged_waveglow_run_keeps_the_last_good_checkpoint_and_resumes_at_a_new_lr(tone_data, tmp_path,
                                                                                      monkeypatch, capsys):
    out = tmp_path / "wg"
    assert _train_wg(tone_data, out, 2) == 0
    good = torch.load(out / "checkpoint.pt", weights_only=False)
    real_loss = train_waveglow.waveglow_loss
    monkeypatch.setattr(train_waveglow, "waveglow_loss", lambda *a, **k: real_loss(*a, **k) * float("nan"))
    assert _train_wg(tone_data, out, 9, "--max-skipped", "3") == 3
    assert "diverged by step 5: its last 3 steps had no finite gradient" in capsys.readouterr().err
    kept = torch.load(out / "checkpoint.pt", weights_only=False)
    assert kept["step"] == 2
    assert all(torch.equal(kept["model"][k], v) for k, v in good["model"].items())
    monkeypatch.setattr(train_waveglow, "waveglow_loss", real_loss)
    assert train_waveglow.main(["--data", str(tone_data), "--out", str(out), "--max-steps", "3",
                                "--batch-size", "2", "--segment", "2048", "--dims", TINY_WG,
                                "--device", "cpu", "--lr", "1e-5"]) == 0
    resumed = torch.load(out / "checkpoint.pt", weights_only=False)
    assert resumed["step"] == 3 and resumed["optimizer"]["param_groups"][0]["lr"] == 1e-5


def test_batch_order_covers_every_utterance_each_epoch_and_resumes_by_step():
    lengths = [5, 90, 7, 60, 33, 12, 80, 3, 41, 20]
    order = common.BatchOrder(lengths, 3, seed=4)
    epoch = [i for step in range(order.per_epoch) for i in order(step)]
    assert sorted(epoch) == list(range(10))
    # A run resumed at step 5 sees the batch an uninterrupted run would.
    assert common.BatchOrder(lengths, 3, seed=4)(5) == order(5)


def test_the_guided_attention_loss_is_the_share_of_attention_off_the_diagonal():
    """Per decoder step, whatever the text length: a diagonal alignment
    costs almost nothing, one stuck near the end of the text costs about the
    share of steps far from it, for 20 symbols as for 200 (averaged over
    text positions instead, the penalty would shrink tenfold between them)."""
    from train_tacotron2 import guided_attention_loss

    def alignment(n_text: int, frames: int, where) -> torch.Tensor:
        a = torch.zeros(1, frames, n_text)
        for t in range(frames):
            a[0, t, where(t, n_text, frames)] = 1.0
        return a

    diagonal = lambda t, n, f: round(t * (n - 1) / (f - 1))
    stuck = lambda t, n, f: round(0.9 * (n - 1))
    costs = {}
    for n_text, frames in [(20, 100), (200, 1000)]:
        lengths, mel_lengths = torch.tensor([n_text]), torch.tensor([frames])
        costs[n_text] = [float(guided_attention_loss(alignment(n_text, frames, w), lengths, mel_lengths))
                         for w in (diagonal, stuck)]
    for on_diagonal, at_end in costs.values():
        assert on_diagonal < 0.01 and 0.5 < at_end < 0.9
    assert costs[20][1] == pytest.approx(costs[200][1], rel=0.1)


def test_each_frames_character_follows_espeaks_word_starts():
    # "ab cd" spoken as: "ab" from sample 0, a pause, "cd" from sample 2560
    # (frame 10) to 3840 (frame 15): the guide looks at "a" first, reaches
    # "c" exactly when espeak-ng starts saying it and the end with the audio.
    starts = torch.tensor([[0, 0], [3, 2560], [5, 3840]])
    at = word_timings.character_at_frames(starts, 18)
    assert at[0] == 0 and at[10] == 3 and at[15] == 5 and at[17] == 5
    assert torch.all(at[1:] >= at[:-1])
    assert at[5] == pytest.approx(1.5)       # halfway through "ab " (and its pause)


def test_the_words_guide_follows_the_speech_where_the_diagonal_is_wrong():
    # A line whose first word is drawn out (half the frames on 2 of its 20
    # characters): attention on espeak-ng's path costs little under the words
    # guide and much under the diagonal; straight diagonal attention, the other
    # way round.
    from train_tacotron2 import WORD_GUIDE_WIDTH, guided_attention_loss
    frames, n_text = 100, 20
    starts = torch.tensor([[0, 0], [2, 50 * 256], [n_text, 100 * 256]])
    path = word_timings.character_at_frames(starts, frames)
    lengths, mel_lengths = torch.tensor([n_text]), torch.tensor([frames])

    def attending(where: torch.Tensor) -> torch.Tensor:
        return F.one_hot(where.round().long().clamp(max=n_text - 1), n_text).float()[None]

    words = (path[None], torch.tensor([WORD_GUIDE_WIDTH]))
    on_path, diagonal = attending(path), attending(torch.arange(frames) * n_text / frames)
    cost = {(a, g): float(guided_attention_loss(align, lengths, mel_lengths, *guide))
            for a, align in (("path", on_path), ("diagonal", diagonal))
            for g, guide in (("words", words), ("diagonal", (None, None)))}
    assert cost["path", "words"] < 0.02 and cost["diagonal", "diagonal"] < 0.02
    assert cost["diagonal", "words"] > 0.3 and cost["path", "diagonal"] > 0.3


def test_the_words_guide_never_fades_and_the_diagonal_fades_out():
    assert train_tacotron2.guide_weight_at(50_000, 1.0, None) == 1.0
    assert train_tacotron2.guide_weight_at(4000, 1.0, 8000) == 0.5
    assert train_tacotron2.guide_weight_at(9000, 1.0, 8000) == 0.0


def test_training_with_the_words_guide_says_how_to_make_the_word_starts(tone_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tone_data, data)
    (data / "word_starts.pt").unlink()
    with pytest.raises(SystemExit, match="run word_timings.py --data"):
        train_tacotron2.Dataset(data, guide="words")
    assert len(train_tacotron2.Dataset(data, guide="diagonal")) == 3   # the old guide needs none


def _espeak_library() -> str | None:
    try:
        return word_timings.find_library()
    except SystemExit:
        return None


@pytest.mark.skipif(_espeak_library() is None, reason="espeak-ng's library is not installed here")
def test_espeaks_library_speaks_each_line_as_the_command_line_does(tmp_path):
    # The word starts are only right if the library's audio is the WAV's,
    # line after line in one process (the library keeps state between lines).
    binary = os.environ.get("ESPEAK") or shutil.which("espeak-ng")
    if binary is None:
        pytest.skip("no espeak-ng command")
    speaker = word_timings.Espeak(make_data.VOICE, make_data.WORDS_PER_MINUTE)
    for n, line in enumerate(["a square enclosure, two furlongs each way.", "hi there; how are you?"]):
        wav = tmp_path / f"{n}.wav"
        make_data.speak(binary, make_data.VOICE, make_data.WORDS_PER_MINUTE, line, wav)
        starts = speaker.word_starts(line)
        assert int(starts[-1, 1]) == soundfile.info(str(wav)).frames
        assert starts[:-1, 0].tolist() == _word_firsts(line) and int(starts[-1, 0]) == len(line)
        assert torch.all(starts[1:, 1] >= starts[:-1, 1])


def test_max_frames_keeps_only_the_short_utterances(tone_data):
    """--max-frames (a start on short lines): the utterances longer than the
    limit are left out of training, the others kept whole."""
    everything = train_tacotron2.Dataset(tone_data)
    limit = sorted(everything.frames)[1]
    short = train_tacotron2.Dataset(tone_data, max_frames=limit)
    assert 0 < len(short) < len(everything)
    assert sorted(short.frames) == sorted(f for f in everything.frames if f <= limit)


# --------------------------------------------------------------------------
# Evaluation


def test_espeaks_transcripts_are_made_once_per_recognizer(tmp_path):
    # score transcribes espeak-ng's WAVs of a line once; another recognizer
    # starts again (its WER would not be comparable).
    heard = []

    def recognizer(name):
        def transcribe(path):
            heard.append((name, path.name))
            return f"{name} heard {path.stem}"
        transcribe.model = name
        return transcribe
    rows = [("a1", "one"), ("a2", "two")]
    first = evaluate.espeak_transcripts(tmp_path, rows, recognizer("tiny"))
    again = evaluate.espeak_transcripts(tmp_path, rows + [("a3", "three")], recognizer("tiny"))
    other = evaluate.espeak_transcripts(tmp_path, rows[:1], recognizer("base"))
    assert first == [("one", "tiny heard a1"), ("two", "tiny heard a2")] == again[:2]
    assert again[2] == ("three", "tiny heard a3") and other == [("one", "base heard a1")]
    assert heard == [("tiny", "a1.wav"), ("tiny", "a2.wav"), ("tiny", "a3.wav"), ("base", "a1.wav")]


def test_the_teacher_forced_evaluation_speaks_each_held_out_line_at_espeaks_length(tone_data, tmp_path):
    # evaluate.py forced: Tacotron2 fed espeak-ng's frames, then WaveGlow; each
    # clip as long as espeak-ng's mel and audible, in the layout `score` reads.
    _train_t2(tone_data, tmp_path / "t2", 1)
    _train_wg(tone_data, tmp_path / "wg", 1)
    out = tmp_path / "forced"
    assert evaluate.main(["forced", "--data", str(tone_data), "--out", str(out), "--device", "cpu",
                          "--tacotron2", str(tmp_path / "t2" / "demo_tacotron2.pt"),
                          "--waveglow", str(tmp_path / "wg" / "demo_waveglow.pt")]) == 0
    record = json.loads((out / "synth.json").read_text())
    mels = torch.load(tone_data / "mels.pt")
    held = [uid for uid, _ in mel.read_filelist(tone_data / "heldout.psv")]
    assert record["teacher_forced"] and sorted(record["lines"]) == sorted(held)
    for uid in held:
        clip, rate = soundfile.read(str(out / "wavs" / f"{uid}.wav"))
        frames = mels[uid].shape[1]
        assert rate == SR and len(clip) == frames * evaluate.HOP == record["lines"][uid]["frames"] * evaluate.HOP
        assert record["lines"][uid]["rms"] > 0


def test_the_forced_evaluation_with_another_lines_text_keeps_the_mels_and_changes_the_text(
        tone_data, tmp_path, monkeypatch):
    # --other-text: the same espeak-ng frames teacher-forced, each line given
    # the next line's text; the clips keep their own lines' lengths.
    _train_t2(tone_data, tmp_path / "t2", 1)
    _train_wg(tone_data, tmp_path / "wg", 1)
    data = tmp_path / "data"   # two held-out lines (the fixture holds out one)
    shutil.copytree(tone_data, data)
    make_data.write_filelist(data / "heldout.psv", [("a3", "on the mat."), ("a4", "hi.")])
    texts_given = []
    real = evaluate._teacher_forced
    monkeypatch.setattr(evaluate, "_teacher_forced",
                        lambda model, text, *rest: texts_given.append(text) or real(model, text, *rest))
    voice = ["--data", str(data), "--device", "cpu",
             "--tacotron2", str(tmp_path / "t2" / "demo_tacotron2.pt"),
             "--waveglow", str(tmp_path / "wg" / "demo_waveglow.pt")]
    mels = torch.load(data / "mels.pt")
    for name, extra, texts in (("own", [], ["on the mat.", "hi."]),
                               ("other", ["--other-text"], ["hi.", "on the mat."])):
        texts_given.clear()
        assert evaluate.main(["forced", "--out", str(tmp_path / name), *voice, *extra]) == 0
        record = json.loads((tmp_path / name / "synth.json").read_text())
        assert record["other_text"] == (name == "other") and texts_given == texts
        for uid in ("a3", "a4"):
            clip, _ = soundfile.read(str(tmp_path / name / "wavs" / f"{uid}.wav"))
            assert len(clip) == mels[uid].shape[1] * evaluate.HOP


def test_attention_path_measures_tell_a_clean_diagonal_from_a_loop_and_a_stall():
    # evaluate.py attention's measures: a path straight through the text has no
    # jumps and visits every symbol; one that loops back and stalls says so.
    eye = torch.eye(10).repeat_interleave(3, 0)                  # 30 steps, 3 per symbol
    clean = evaluate.path_measures(eye, 10)
    assert clean == {"reaches_end": True, "jumps_back": 0, "skips_ahead": 0, "longest_stall": 3,
                     "symbols_visited": 1.0, "peak_weight": 1.0}
    order = [0, 1, 2, 3, 4, 5, 1, 2, 3] + [9] * 12                # back to 1, on to 9, stays there
    looping = evaluate.path_measures(torch.eye(10)[order] * 0.5, 10)
    assert looping["jumps_back"] == 1 and looping["skips_ahead"] == 1 and looping["longest_stall"] == 12
    assert looping["symbols_visited"] == 0.7 and looping["peak_weight"] == 0.5
    stuck = evaluate.path_measures(torch.eye(10)[[0, 1, 2, 3] * 5], 10)
    assert not stuck["reaches_end"] and stuck["jumps_back"] == 4


def test_the_attention_evaluation_measures_both_paths_of_every_held_out_line(tone_data, tmp_path):
    _train_t2(tone_data, tmp_path / "t2", 1)
    out = tmp_path / "attention"
    assert evaluate.main(["attention", "--data", str(tone_data), "--out", str(out), "--device", "cpu",
                          "--tacotron2", str(tmp_path / "t2" / "demo_tacotron2.pt")]) == 0
    record = json.loads((out / "attention.json").read_text())
    held = [uid for uid, _ in mel.read_filelist(tone_data / "heldout.psv")]
    assert sorted(record["lines"]) == sorted(held)
    for line in record["lines"].values():
        for way in ("teacher_forced", "free_running"):
            assert 0 < line[way]["symbols_visited"] <= 1 and 0 < line[way]["peak_weight"] <= 1


def test_the_committed_snapshot_fits_the_recipes_models():
    # A fresh device machine starts from these files; a change of DEMO_DIMS
    # that they no longer fit would cost a device call to find out.
    snapshot = RECIPE / "snapshot"
    state, step, _ = train_waveglow.weights_from_export(snapshot / "demo_waveglow.pt")
    train_waveglow.load_trained(train_waveglow.build(train_waveglow.DEMO_DIMS, 1), state)
    assert step > 0
    state, step = train_tacotron2.weights_from_export(snapshot / "demo_tacotron2.pt")
    Tacotron2(train_tacotron2.DEMO_DIMS).load_state_dict(state)
    assert step > 0
    # and they load through tts_cli's own path, as NVIDIA's do
    WaveGlow.from_state_dict(checkpoints.load_waveglow_weights(snapshot / "demo_waveglow.pt"))
    Tacotron2.from_state_dict(checkpoints.load_tacotron2_weights(snapshot / "demo_tacotron2.pt"))


# --------------------------------------------------------------------------
# evaluate.py render: the mel alone, without a vocoder


def _speech_like(seconds: float = 0.6) -> torch.Tensor:
    """A 130 Hz pulse train through two resonances: harmonics with formants."""
    t = torch.arange(int(SR * seconds)) / SR
    source = sum(torch.cos(2 * math.pi * 130 * k * t) / k for k in range(1, 40))
    return 0.05 * source * (1 + 0.5 * torch.sin(2 * math.pi * 3 * t))


def _mel_errors(audio: torch.Tensor, voice) -> tuple[float, float]:
    """How far from `audio`'s log mel the mel of ``voice(log mel)`` is (level
    matched, over the loud bands), for the audio's own mel and for a flat mel
    of the same mean: a voice that renders the mel it is given does much
    better with the first."""
    log_mel = mel.MelExtractor()(audio)
    loud = log_mel > log_mel.max() - 6   # the bands that carry the sound
    frames = log_mel.shape[1]

    def error(source: torch.Tensor) -> float:
        clip = voice(source)
        clip = clip * audio.pow(2).mean().sqrt() / clip.pow(2).mean().sqrt()
        return float((mel.MelExtractor()(clip)[:, :frames] - log_mel)[loud].abs().mean())
    return error(log_mel), error(torch.full_like(log_mel, float(log_mel.mean())))


def _assert_periodic_in_the_hop(clip: torch.Tensor, tolerance: float) -> None:
    """Frames 4-8 of a steady mel's audio repeat every 256 samples (the
    harmonics of 22050/256 Hz, locked to the frame grid) and are not silent."""
    middle = clip[4 * 256: 8 * 256]
    assert float(middle.abs().max()) > 0.01
    torch.testing.assert_close(middle[:256], middle[256:512], atol=tolerance * float(middle.abs().max()),
                               rtol=0)


@pytest.mark.parametrize("rendering", evaluate.RENDERINGS)
def test_a_rendering_of_a_mel_has_that_mel(rendering):
    # What `render` scores stands for the mel: its own mel must be close to
    # the one it was made from (up to level, which `render` matches), much
    # closer than the same rendering of a flat mel of the same mean.
    audio = _speech_like()
    own, flat = _mel_errors(audio, lambda source: evaluate.render_mel(source, len(audio), rendering))
    # Measured: 0.24, 0.51, 0.72 (harmonic carriers miss the 130 Hz fine structure); flat about 1.35.
    assert own < {"griffin-lim": 0.35, "band-carriers": 0.65, "harmonic-carriers": 0.9}[rendering]
    assert own < 0.6 * flat


def test_harmonic_carriers_repeat_every_hop_as_a_waveglow_upsampler_could():
    # A steady mel rendered on the harmonics of 22050/256 Hz is periodic in
    # the hop: the carriers are locked to the frame grid.
    steady = torch.full((80, 12), -4.0)
    _assert_periodic_in_the_hop(evaluate.render_mel(steady, 12 * 256, "harmonic-carriers"), 1e-4)


# --------------------------------------------------------------------------
# construct_waveglow.py: the WaveGlow set, not trained


def _constructed(tmp_path, level=1.0) -> WaveGlow:
    path = tmp_path / "demo_waveglow.pt"
    construct_waveglow.export(construct_waveglow.build(level), path, level)
    return WaveGlow.from_state_dict(checkpoints.load_waveglow_weights(path))


def _monotone_vowel(seconds: float = 0.6) -> torch.Tensor:
    """Harmonics of 22050/256 Hz under two formants, as the constructed voice speaks."""
    t = torch.arange(int(SR * seconds)) / SR
    f0 = SR / 256
    envelope = lambda f: 1 / (1 + ((f - 700) / 150) ** 2) + 0.5 / (1 + ((f - 1800) / 200) ** 2) + 0.05
    voice = sum(envelope(f0 * k) * torch.cos(2 * math.pi * f0 * k * t + 0.7 * k * k) for k in range(1, 80))
    return 0.1 * voice * (1 + 0.5 * torch.sin(2 * math.pi * 3 * t))


def test_the_constructed_waveglow_loads_and_sings_the_mel_it_is_given(tmp_path):
    # Through tts_cli's own loader and WaveGlow (fp16 file), the mel of a
    # vowel it can voice comes back as audio whose mel is close to it (0.50
    # measured): much closer than the audio of a flat mel (1.38).
    model = _constructed(tmp_path)

    @torch.inference_mode()
    def sing(source: torch.Tensor) -> torch.Tensor:
        return model.infer(source[None], torch.tensor([source.shape[1]]), torch.tensor([3]), 0.666)[0]
    own, flat = _mel_errors(_monotone_vowel(), sing)
    assert own < 0.65
    assert own < 0.5 * flat


def test_the_constructed_waveglow_suppresses_its_noise_and_stays_silent_in_silence(tmp_path):
    model = _constructed(tmp_path)
    log_mel = mel.MelExtractor()(_monotone_vowel())
    frames = torch.tensor([log_mel.shape[1]])
    with torch.inference_mode():
        one, other = (model.infer(log_mel[None], frames, torch.tensor([seed]), 0.666)[0] for seed in (1, 2))
        silent = model.infer(torch.full_like(log_mel, -11.5)[None], frames, torch.tensor([1]), 0.666)[0]
    # Two noise draws differ by the noise alone, scaled by e^-6 (rms ~0.0023 for the
    # difference): -25 dB or more below the voice. A silent mel gives near silence.
    assert float((one - other).pow(2).mean().sqrt()) < 0.004
    assert float((one - other).pow(2).mean() / one.pow(2).mean()) < 3e-3
    assert float(silent.pow(2).mean().sqrt()) < 0.01 * float(one.pow(2).mean().sqrt())


def test_the_constructed_waveglow_carries_the_demo_voice_and_leaves_the_denoiser_nothing(tmp_path):
    # Its carriers scale with the mel: the denoiser's probe, an all-zero mel
    # at sigma 0, gives silence, so its bias spectrum is zero; the export
    # says to run it without the denoiser.
    model = _constructed(tmp_path)
    assert checkpoints.read_voice_info(tmp_path / "demo_waveglow.pt") == DEMO_VOICE
    assert not waveglow_module.Denoiser.for_model(model, torch.float32).bias_magnitude.any()


def test_the_constructed_waveglow_is_a_monotone_voice_locked_to_the_frames(tmp_path):
    # A steady mel comes out periodic in the hop: 86.13 Hz and its harmonics.
    model = _constructed(tmp_path)
    steady = torch.full((1, 80, 12), -4.0)
    with torch.inference_mode():
        audio = model.infer(steady, torch.tensor([12]), torch.tensor([1]), 0.0)[0]   # no noise
    _assert_periodic_in_the_hop(audio, 0.01)


def test_the_level_calibration_matches_the_training_audio(tone_data):
    level = construct_waveglow.calibrate(tone_data, clips=3)
    model = construct_waveglow.build(level)
    audio = mel.read_wav(tone_data / "wavs" / "a1.wav")
    log_mel = mel.MelExtractor()(audio)[None]
    with torch.inference_mode():
        out = model.infer(log_mel, torch.tensor([log_mel.shape[2]]), torch.tensor([0]), 0.666)[0]
    assert 0.5 < float(out.pow(2).mean().sqrt() / audio.pow(2).mean().sqrt()) < 2.0


def test_the_constructed_waveglow_runs_in_the_engines_half_precisions(tmp_path):
    # The GPU engine runs WaveGlow in fp16 by default, folding layers into
    # products that must stay under fp16's 65,504 (a first construction's
    # did not, and every sample came out NaN).
    from tts_cli.waveglow_fast import FastWaveGlow
    vowel = _monotone_vowel()
    log_mel = mel.MelExtractor()(vowel)[None]
    frames, seeds = torch.tensor([log_mel.shape[2]]), torch.tensor([3])
    with torch.inference_mode():   # the level that speaks this vowel at its own loudness, as calibrate() does
        unit = construct_waveglow.build(1.0).infer(log_mel, frames, seeds, 0.666)
    model = _constructed(tmp_path, float(vowel.pow(2).mean().sqrt() / unit.pow(2).mean().sqrt()))
    with torch.inference_mode():
        exact = model.infer(log_mel, frames, seeds, 0.666)
        for dtype, tolerance in ((torch.float16, 0.01), (torch.bfloat16, 0.03)):
            got = FastWaveGlow(model, dtype).infer(log_mel, frames, seeds, 0.666).float()
            assert bool(got.isfinite().all()), dtype
            assert float((got - exact).norm() / exact.norm()) < tolerance, dtype


# --------------------------------------------------------------------------
# intelligibility.py


def test_spliced_sentences_are_distinct_new_and_repeat_for_a_seed():
    import intelligibility
    transcripts = [line.split("|")[1] for line in intelligibility.TRANSCRIPTS.read_text().splitlines()]
    made = intelligibility.make_sentences(transcripts, 50, seed=3)
    assert made == intelligibility.make_sentences(transcripts, 50, seed=3)
    assert len(set(made)) == 50 and not set(made) & set(transcripts)
    low, high = intelligibility.WORDS_EACH_SIDE
    for sentence in made:
        assert 2 * low <= len(sentence.split()) <= 2 * high, sentence
        assert sentence[0].isupper() and sentence[-1] in ".?!" and not any(c.isdigit() for c in sentence)


def test_runs_are_grouped_by_setting_with_their_mean_and_spread():
    import intelligibility
    results = [{"run": "fp16-s1", "wer": 0.40}, {"run": "fp16-s2", "wer": 0.44}, {"run": "cpu-s1", "wer": 0.30}]
    summary = intelligibility.by_setting(results)
    assert summary["fp16"]["mean"] == pytest.approx(0.42) and summary["fp16"]["range"] == pytest.approx(0.04)
    assert summary["fp16"]["runs"] == ["fp16-s1", "fp16-s2"]
    assert summary["cpu"] == {"runs": ["cpu-s1"], "wer": [0.30], "mean": 0.30, "range": 0.0, "stdev": 0.0}


def test_a_line_without_audio_counts_every_reference_word_as_missed(tmp_path):
    import intelligibility
    run = tmp_path / "fp32-s1"
    run.mkdir()
    rows = [{"id": "a", "status": "ok"}, {"id": "b", "status": "error"}]
    (run / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "a.ogg").write_bytes(b"")
    texts = {"a": "the cat sat", "b": "on the mat today"}
    heard = {"a": "the cat sat"}
    result = intelligibility.score_run(run, texts, lambda path: heard[path.stem], cache={})
    assert result == {"run": "fp32-s1", "wer": 4 / 7, "words": 7}
