"""Where each word of a line starts in espeak-ng's audio of it.

Tacotron2's attention has to learn which symbol each mel frame is saying.
espeak-ng knows: while it synthesizes, its library reports a WORD event for
each word with the word's character offset in the text and the sample it
starts at. Those starts are a real alignment of every training line, which
``train_tacotron2.py --guide words`` trains the attention towards (instead of
the straight diagonal, which is off wherever the speech slows, pauses or
spells out a long word).

The command-line ``espeak-ng -w`` that ``make_data.py`` runs is a client of
the same library, so the same text, voice and rate synthesized here give the
same samples; each line's total is checked against its WAV, and a line whose
counts differ (another espeak-ng build) stops the run rather than teaching a
shifted alignment. Writes ``DATA/word_starts.pt``: {id: int64 tensor of
(character, sample) rows, one per word in order, then (text length, total
samples)}. Run it after ``make_data.py``, with the environment of
``espeak_env.sh`` (it finds ``libespeak-ng.so.1`` on ``LD_LIBRARY_PATH``).
"""
from __future__ import annotations

import argparse
import array
import ctypes
import ctypes.util
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

import make_data
from mel import read_filelist

# speak_lib.h (espeak-ng 1.51, API revision 12)
AUDIO_OUTPUT_SYNCHRONOUS = 2
EVENT_LIST_TERMINATED, EVENT_WORD = 0, 1
POS_CHARACTER = 1
CHARS_UTF8, ENDPAUSE = 0x1, 0x1000   # the command line's flags (it adds ENDPAUSE too)
PARAMETER_RATE = 1


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint),
                ("text_position", ctypes.c_int), ("length", ctypes.c_int),
                ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _EventId)]


_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.POINTER(_Event))


def find_library() -> str:
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if folder and (Path(folder) / "libespeak-ng.so.1").exists():
            return str(Path(folder) / "libespeak-ng.so.1")
    found = ctypes.util.find_library("espeak-ng")
    if found is None:
        raise SystemExit("word_timings.py: libespeak-ng.so.1 not found; source "
                         "recipes/demo-voice/espeak_env.sh first (it sets LD_LIBRARY_PATH)")
    return found


class Espeak:
    """One process's espeak-ng library, set to a voice and rate (the library
    keeps global state, so each worker process has its own)."""

    def __init__(self, voice: str, words_per_minute: int, library: str | None = None):
        self.lib = ctypes.CDLL(library or find_library())
        if self.lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0) <= 0:
            raise RuntimeError("espeak_Initialize failed (is ESPEAK_DATA_PATH set?)")
        self._samples = 0
        self._starts: list[tuple[int, int]] = []
        self._callback = _Callback(self._on_audio)    # kept alive as long as self
        self.lib.espeak_SetSynthCallback(self._callback)
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise RuntimeError(f"espeak-ng has no voice {voice!r}")
        self.lib.espeak_SetParameter(PARAMETER_RATE, words_per_minute, 0)

    def _on_audio(self, wav, samples: int, events) -> int:
        i = 0
        while events[i].type != EVENT_LIST_TERMINATED:
            if events[i].type == EVENT_WORD:
                # text_position counts from 1
                self._starts.append((events[i].text_position - 1, events[i].sample))
            i += 1
        self._samples += samples
        return 0

    def word_starts(self, text: str) -> Tensor:
        """(character, sample) of each word's start, then (len(text), total
        samples). Synthesized in a forked copy of this process, so that each
        line starts from the library's state just after initialisation, as
        each ``espeak-ng`` command does: the library carries state from one
        synthesis to the next (lines spoken one after another in one process
        came out up to 1,300 samples longer than their WAVs)."""
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:                              # the child: synthesize, report, exit
            os.close(read_end)
            try:
                with os.fdopen(write_end, "wb") as pipe:
                    pipe.write(array.array("q", self._synthesize(text)).tobytes())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            values = array.array("q", pipe.read())
        os.waitpid(pid, 0)
        if not values:
            raise RuntimeError(f"espeak-ng failed on {text!r}")
        return torch.tensor(values.tolist(), dtype=torch.long).view(-1, 2)

    def _synthesize(self, text: str) -> list[int]:
        self._samples, self._starts = 0, []
        encoded = text.encode("utf-8")
        error = self.lib.espeak_Synth(encoded, len(encoded) + 1, 0, POS_CHARACTER, 0,
                                      CHARS_UTF8 | ENDPAUSE, None, None)
        if error != 0 or self.lib.espeak_Synchronize() != 0:
            return []
        return [v for start in self._starts for v in start] + [len(text), self._samples]


_worker: Espeak | None = None


def _start_worker(voice: str, words_per_minute: int) -> None:
    global _worker
    _worker = Espeak(voice, words_per_minute)


def _line_starts(row: tuple[str, str]) -> tuple[str, Tensor]:
    return row[0], _worker.word_starts(row[1])


def character_at_frames(starts: Tensor, frames: int, hop: int = 256) -> Tensor:
    """The character being spoken at each mel frame (fractional, from 0 at
    the first word's start to the text length at the last sample): linear in
    time between word starts, so within a word (and the spaces and
    punctuation after it, and any pause they bring) each character takes an
    equal share. Frame t is centred on sample t * hop (mel.py pads the STFT
    by half a window)."""
    chars, samples = starts[:, 0].double(), starts[:, 1].double()
    at = torch.arange(frames, dtype=torch.float64) * hop
    right = torch.searchsorted(samples, at, right=True).clamp(1, len(samples) - 1)
    left = right - 1
    span = (samples[right] - samples[left]).clamp(min=1)
    share = ((at - samples[left]) / span).clamp(0, 1)
    return (chars[left] + share * (chars[right] - chars[left])).float()


def measure(data: Path, voice: str, words_per_minute: int, jobs: int) -> tuple[int, int]:
    """Writes DATA/word_starts.pt for every line of train.psv and heldout.psv;
    returns (lines, words)."""
    import soundfile
    rows = read_filelist(data / "train.psv") + read_filelist(data / "heldout.psv")
    with ProcessPoolExecutor(jobs, initializer=_start_worker, initargs=(voice, words_per_minute)) as pool:
        starts = dict(pool.map(_line_starts, rows, chunksize=64))
    for number, (uid, text) in enumerate(rows, 1):
        wav = data / "wavs" / f"{uid}.wav"
        total, in_wav = int(starts[uid][-1, 1]), soundfile.info(str(wav)).frames
        if in_wav != total:
            raise SystemExit(f"word_timings.py: {wav}: espeak-ng's library made {total} samples of "
                             f"line {number} ({uid}) but the WAV has {in_wav}; "
                             f"remake the WAVs with this espeak-ng (make_data.py) or pass the voice "
                             f"and rate they were made with")
    tmp = data / "word_starts.pt.tmp"
    torch.save(starts, tmp)
    tmp.replace(data / "word_starts.pt")
    return len(rows), sum(len(s) - 1 for s in starts.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder made by make_data.py")
    parser.add_argument("--voice", default=make_data.VOICE, help="as make_data.py was given")
    parser.add_argument("--words-per-minute", type=int, default=make_data.WORDS_PER_MINUTE,
                        help="as make_data.py was given")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    start = time.time()
    lines, words = measure(args.data, args.voice, args.words_per_minute, args.jobs)
    print(f"{words} word starts of {lines} lines in {time.time() - start:.0f} s "
          f"-> {args.data / 'word_starts.pt'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
