"""The demo voice's training speech: espeak-ng reading LJSpeech transcripts.

Reads an ``id|text`` file (LJSpeech's ``metadata.csv`` layout; the default is
the 12,500 LJSpeech transcripts in ``data/``, of which the 2,000 shipped in
``tts_cli/data`` are the first), holds out a fixed 100 lines for evaluation
(the same 100 for either file), and has espeak-ng speak every line into
``OUT/wavs/<id>.wav`` (mono PCM16 at 22050 Hz, espeak-ng's own rate, so no
resampling). Writes ``OUT/train.psv`` and ``OUT/heldout.psv``.

The text given to espeak-ng is the line after the Tacotron2 front end's
cleaning (numbers, abbreviations spelled out), so the audio says exactly the
words the model will be given. Re-running skips every WAV that is already
complete (written under a temporary name and renamed, so a WAV under its real
name is always whole).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tts_cli import text as frontend

DEFAULT_TRANSCRIPTS = Path(__file__).parent / "data" / "ljspeech_12500.psv"
# The held-out lines are drawn from this sample's ids where a corpus has them.
SAMPLE_TRANSCRIPTS = Path(frontend.__file__).parent / "data" / "ljspeech_2000.psv"
HELD_OUT = 100
SAMPLE_RATE = 22050
VOICE = "en-us"
WORDS_PER_MINUTE = 175    # espeak-ng's default


def read_transcripts(path: Path) -> list[tuple[str, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and parts[0].strip() and parts[-1].strip():
            # LJSpeech's metadata.csv has raw|normalized columns; the last is spelled out.
            rows.append((parts[0].strip(), parts[-1].strip()))
    return rows


def spoken_text(line: str) -> str:
    """What espeak-ng reads: the line as the Tacotron2 front end cleans it."""
    ids = frontend.text_to_sequence(line)
    return frontend.sequence_to_text(ids).strip()


def split_held_out(rows: list[tuple[str, str]], count: int = HELD_OUT,
                   among: set[str] | None = None) -> tuple[list, list]:
    """(train, held_out): the held-out lines are the `count` ids with the
    smallest sha256, so the choice depends only on the ids, not on file order
    or on the rest of the corpus; drawn from the ids in ``among`` where the
    corpus has at least `count` of them (so a larger corpus holds out the same
    lines as the sample the earlier trainings used and were measured on)."""
    shared = [row for row in rows if among is not None and row[0] in among]
    ranked = sorted(shared if len(shared) >= count else rows,
                    key=lambda row: hashlib.sha256(row[0].encode()).hexdigest())
    held = {uid for uid, _ in ranked[:count]}
    return [r for r in rows if r[0] not in held], [r for r in rows if r[0] in held]


def wav_is_complete(path: Path) -> bool:
    """A WAV under its final name with a header and some samples."""
    try:
        import soundfile
        info = soundfile.info(str(path))
    except Exception:  # missing or unreadable: make it again
        return False
    return info.samplerate == SAMPLE_RATE and info.frames > 0 and info.channels == 1


def speak(espeak: str, voice: str, words_per_minute: int, text: str, out: Path) -> None:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    # "--" ends options, so a line starting with "-" is read, not parsed.
    subprocess.run([espeak, "-v", voice, "-s", str(words_per_minute), "-w", str(tmp), "--", text],
                   check=True, capture_output=True, timeout=120)
    tmp.replace(out)


def write_filelist(path: Path, rows: list[tuple[str, str]]) -> None:
    text = "".join(f"{uid}|{line}\n" for uid, line in rows)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return  # left untouched, so caches newer than it stay valid
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def make(transcripts: Path, out: Path, espeak: str, voice: str, words_per_minute: int,
         jobs: int) -> tuple[int, int]:
    """Returns (WAVs made, WAVs already there)."""
    rows = [(uid, spoken_text(line)) for uid, line in read_transcripts(transcripts)]
    rows = [(uid, line) for uid, line in rows if line]
    train, held_out = split_held_out(rows, among={uid for uid, _ in read_transcripts(SAMPLE_TRANSCRIPTS)})
    wavs = out / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    todo = [(uid, line) for uid, line in rows if not wav_is_complete(wavs / f"{uid}.wav")]
    # espeak-ng is single-threaded: one process per core; threads only wait.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda row: speak(espeak, voice, words_per_minute, row[1],
                                        wavs / f"{row[0]}.wav"), todo))
    write_filelist(out / "train.psv", train)
    write_filelist(out / "heldout.psv", held_out)
    return len(todo), len(rows) - len(todo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transcripts", type=Path, default=DEFAULT_TRANSCRIPTS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--espeak", default=shutil.which("espeak-ng") or "espeak-ng",
                        help="espeak-ng binary (default: the one on PATH)")
    parser.add_argument("--voice", default=VOICE)
    parser.add_argument("--words-per-minute", type=int, default=WORDS_PER_MINUTE, help="espeak-ng's default")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    start = time.time()
    made, kept = make(args.transcripts, args.out, args.espeak, args.voice,
                      args.words_per_minute, args.jobs)
    print(f"{made} WAVs made, {kept} kept, in {time.time() - start:.0f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
