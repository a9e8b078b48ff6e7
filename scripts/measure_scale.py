"""What tts-batch's own work costs on corpora of 10,000 to 1,000,000 lines.

The models are left out: a stand-in engine makes each line's audio at once,
as silence of round(5.7 x symbols) decoder frames (LJSpeech's speaking
rate), so what is measured is everything else the command does: reading the
corpus, the text front end, planning and resume, batching, writing the
files, the manifest journal. The stand-in voice runs at 86 Hz, one sample
a frame (22,050 Hz / a hop of 256), so the files are 256 times smaller than
real ones while the lines' durations are real. It exists only here.

For each size, a corpus of LJSpeech transcripts drawn at random (each line
a new id) is run three times, each in a process of its own, into one
output folder:

- the first run, every line to make: seconds to the plan line, the whole
  run, peak memory (resident), and the seconds per line made;
- the same command again, nothing to do;
- again with 1 % of the lines changed: those are made again.

    python scripts/measure_scale.py                      # 10,000 and 100,000 lines
    python scripts/measure_scale.py --lines 1000000      # a million (a few GB of disk, an hour on 2 cores)

Prints one Markdown table (BENCHMARKS.md, Scale).
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

STARTED = time.perf_counter()

from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = ROOT / "recipes" / "demo-voice" / "data" / "ljspeech_12500.psv"
FRAMES_PER_SYMBOL = 5.7
STAND_IN_RATE = 86   # Hz: 22,050 / 256, one sample a decoder frame


def make_corpus(path: Path, lines: int, seed: int = 0) -> None:
    """``lines`` transcripts drawn at random, each with its own id."""
    texts = [line.split("|", 1)[1].rstrip("\n") for line in TRANSCRIPTS.read_text().splitlines() if "|" in line]
    draw = random.Random(seed)
    with open(path, "w") as f:
        for n in range(lines):
            f.write(f"S{n:07d}|{draw.choice(texts)}\n")


def change_one_in_a_hundred(path: Path) -> int:
    """Every hundredth line gets other words; returns how many changed."""
    lines = path.read_text().splitlines(keepends=True)
    for n in range(0, len(lines), 100):
        ident, text = lines[n].split("|", 1)
        lines[n] = f"{ident}|Changed, {text}"
    path.write_text("".join(lines))
    return len(range(0, len(lines), 100))


class StandInEngine:
    """Silence of the line's length, at once; the engine's interface as the
    pipeline uses it."""

    def __init__(self, settings):
        import torch
        from tts_cli.engine import engine_settings
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.settings = engine_settings(settings, self.device)
        self.notices: list[str] = []

    def synthesize_all(self, batches, **_):
        import numpy as np
        from tts_cli.vocoding import Result
        steps = self.settings.max_decoder_steps
        for jobs in batches:
            frames = [max(1, min(round(FRAMES_PER_SYMBOL * len(job.ids)), steps)) for job in jobs]
            yield jobs, [Result(audio=np.zeros(f, dtype=np.float32), mel=None, frames=f, truncated=False)
                         for f in frames]


def child(corpus: Path, out: Path) -> None:
    """One run of the pipeline with the stand-in engine; prints a JSON line.
    The command's own path: the voice resolved without torch, the engine
    loaded only when there is work (``loading.load_engine``, here the
    stand-in's), so a re-run with nothing to do never imports torch."""
    import dataclasses
    import types
    from tts_cli.config import load_settings
    from tts_cli.corpus import read_corpus
    from tts_cli.synthesizer import Synthesizer

    def load_engine(settings, voice):
        from tts_cli.checkpoints import VoiceInfo
        info = VoiceInfo(name="stand-in", sample_rate=STAND_IN_RATE, denoiser_strength=0.0)
        voiced = dataclasses.replace(settings, sample_rate=settings.sample_rate or STAND_IN_RATE,
                                     denoiser_strength=0.0)
        return StandInEngine(voiced), voiced, info
    # the stand-in in the place of the models' loader (which imports torch at once)
    sys.modules["tts_cli.loading"] = types.SimpleNamespace(load_engine=load_engine)

    settings = load_settings(overrides={"format": "ljspeech", "device": "cpu", "seed": 1, "quiet": True})
    planned = []

    def on_notice(line):
        if not planned and " lines: " in str(line):
            planned.append(time.perf_counter() - STARTED)
    utterances = read_corpus(corpus, settings.format)
    summary = Synthesizer(settings).synthesize_to_dir(utterances, out, on_notice=on_notice)
    print(json.dumps({"plan_seconds": planned[0] if planned else None,
                      "seconds": time.perf_counter() - STARTED,
                      "synthesis_seconds": summary.wall_seconds, "made": summary.made,
                      "reused": summary.reused, "lines": summary.lines,
                      "torch_imported": "torch" in sys.modules,
                      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}))


def run_child(corpus: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run on {corpus} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(lines: int, folder: Path) -> dict:
    corpus, out = folder / f"corpus-{lines}.psv", folder / f"out-{lines}"
    make_corpus(corpus, lines)
    first = run_child(corpus, out)
    again = run_child(corpus, out)
    changed = change_one_in_a_hundred(corpus)
    some = run_child(corpus, out)
    assert again["made"] == 0 and some["made"] == changed, (again, some)
    return {"lines": lines, "first": first, "again": again, "changed": changed, "some": some}


def table(results: list[dict]) -> str:
    rows = ["| lines | plan line | first run | per line made | peak resident | nothing to do | 1 % changed |",
            "|---|---|---|---|---|---|---|"]
    for r in results:
        first, again, some = r["first"], r["again"], r["some"]
        rows.append(f"| {r['lines']:,} | {first['plan_seconds']:.1f} s | {first['seconds']:.0f} s "
                    f"| {first['synthesis_seconds'] / first['made'] * 1e6:.0f} µs "
                    f"| {max(first['peak_rss_gb'], again['peak_rss_gb'], some['peak_rss_gb']):.2f} GB "
                    f"| {again['seconds']:.1f} s | {some['seconds']:.1f} s ({some['made']:,} made) |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--keep", type=Path, help="keep the corpora and outputs here")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tts-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        results = []
        for lines in args.lines:
            results.append(measure(lines, folder))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        print(table(results))
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
