"""The names of the formats a run reads and writes, as ``--format`` and
``--sample-format`` and ``--audio-format`` and the recipes accept them, and
where a line's audio file goes.

A leaf: the settings (config.py) check these names, and the corpus reader
(corpus.py) and the WAV writer (audio.py) act on them, so the settings load
neither soundfile nor the reader to know them.
"""
from __future__ import annotations

from dataclasses import dataclass

CORPUS_FORMATS = ("plain", "ljspeech", "tsv")
SAMPLE_FORMATS = ("pcm16", "pcm24", "float32")
AUDIO_FORMATS = ("wav", "flac")
# How a run reads its text: "reference" is NVIDIA's english_cleaners exactly
# (parity with the published voice); "extended" first writes out, in words,
# what those cleaners drop or mangle (spoken_forms.py), then cleans alike.
NORMALIZATIONS = ("reference", "extended")
# FLAC stores integer samples only.
FLAC_SAMPLE_FORMATS = ("pcm16", "pcm24")
# The rates, in Hz, the files may be written at and a voice may state:
# telephone speech to studio audio, each one WAV takes. A rate below it is
# a slip (16 for 16000) that would make files of a few silent samples.
SAMPLE_RATES = (8000, 192000)
# FLAC, as libsndfile writes it (libFLAC's streamable subset), stores a
# rate above this only in whole tens of Hz (96000, not 96001).
FLAC_ANY_RATE_UP_TO = 65535


def flac_stores(rate: int) -> bool:
    """Whether a FLAC file can be written at ``rate`` Hz."""
    return rate <= FLAC_ANY_RATE_UP_TO or rate % 10 == 0


# Where a line's files go: "files", one file each in wavs/ (and mels/); or
# "webdataset", the line's members in tar shards in shards/ (tarshards.py).
LAYOUTS = ("files", "webdataset")
# What ``tts-batch export --to`` writes (export.py), all by default.
EXPORTS = ("hf", "lhotse", "kaldi", "nemo")
# The webdataset layout's folder in the output directory.
SHARDS = "shards"
# A webdataset shard is finished once it holds this many bytes or more.
TAR_SHARD_BYTES = 10 ** 9

# Lines in one folder of wavs/ and of mels/ at most, by default: the Hugging
# Face Hub's advice, and what file systems and `ls` handle without pain.
SHARD_SIZE = 10_000
_SHARD_DIGITS = 5   # at least; more where a corpus has more shards than that names


@dataclass(frozen=True)
class Layout:
    """Where a line's files go, relative to the output directory.

    A corpus of at most ``shard_size`` lines (or ``shard_size`` 0) is flat:
    ``wavs/<id>.<format>`` and ``mels/<id>.npy``. A longer one is sharded by
    the line's number in the corpus file: lines 1 to 10,000 in
    ``wavs/00000/``, 10,001 to 20,000 in ``wavs/00001/`` and so on, so that
    the folders sort in corpus order and none holds more than ``shard_size``
    lines' files."""

    audio_format: str
    shard_size: int = 0     # 0: flat
    digits: int = _SHARD_DIGITS

    @classmethod
    def for_corpus(cls, audio_format: str, shard_size: int, last_line: int) -> "Layout":
        if not shard_size or last_line <= shard_size:
            return cls(audio_format)
        return cls(audio_format, shard_size, max(_SHARD_DIGITS, len(str((last_line - 1) // shard_size))))

    def audio(self, line_id: str, line: int) -> str:
        return f"{self._folder('wavs', line)}/{line_id}.{self.audio_format}"

    def mel(self, line_id: str, line: int) -> str:
        return f"{self._folder('mels', line)}/{line_id}.npy"

    def _folder(self, kind: str, line: int) -> str:
        return f"{kind}/{(line - 1) // self.shard_size:0{self.digits}d}" if self.shard_size else kind


def is_shard_folder(name: str) -> bool:
    """A folder name ``Layout`` makes inside wavs/ and mels/."""
    return len(name) >= _SHARD_DIGITS and name.isdigit()


def names_a_place_for(path: str, kind: str, file_name: str) -> bool:
    """Whether ``path`` is where a layout puts ``file_name``: ``<kind>/<file_name>``
    or ``<kind>/<shard>/<file_name>`` (nothing outside ``kind``)."""
    folder, _, name = path.rpartition("/")
    shard = folder[len(kind) + 1:]
    return name == file_name and (folder == kind or (folder.startswith(f"{kind}/") and is_shard_folder(shard)))
