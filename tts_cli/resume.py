"""Resume: what earlier runs left in the output directory, and whether a line
may keep it.

A line's key hashes everything that decides its audio (its symbol ids and
how they were cut, its id, the seed, both checkpoint files' contents, every
audio setting, the text normalization, device type and dtype). A re-run keeps a line's row and WAV
when the keys match and the WAV is whole, and its mel file with them when
that is whole too; anything else is made again.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import secrets
import stat
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import soundfile as sf

from tts_cli.alignment import thresholds_record
from tts_cli.config import ALIGNMENT_SETTINGS, NOT_IN_THE_RESUME_KEY, Settings
from tts_cli.devices import device_type
from tts_cli.corpus import Utterance
from tts_cli.errors import FatalError, option
from tts_cli.formats import names_a_place_for
from tts_cli.manifest import PARTIAL_MANIFESTS, ROW_FIELD_SET, WITH_AUDIO, ManifestRow, row_at, row_fields, row_ids_at
from tts_cli.tarshards import key_of, member_size

if TYPE_CHECKING:
    from tts_cli.voice import Voice

MANIFEST_NAME = "manifest.jsonl"


def audio_identity(settings: Settings, voice: "Voice") -> dict:
    """Everything besides a line's ids and seed that changes its audio:
    every setting but those config.NOT_IN_THE_RESUME_KEY lists. The
    files' fingerprint stands for all they decide, the sample rate and
    denoiser strength the WaveGlow file states included; the run's own
    settings are there as set (None: the voice's). So the keys are known
    before torch is imported or any model loads. The text normalization
    is there though the ids already hold what it changed: it also decides
    the row (the characters dropped, and so the status), so a run in the
    other mode makes every line again rather than keep rows it disowns."""
    identity = {name: value for name, value in dataclasses.asdict(settings).items()
                if name not in NOT_IN_THE_RESUME_KEY and name not in ALIGNMENT_SETTINGS}
    return {"models": voice.fingerprint, "device": device_type(voice.device), "precision": voice.precision,
            **identity, "alignment": _alignment_identity(settings)}


def _alignment_identity(settings: Settings) -> dict | None:
    """The checks and retries, which decide which attempt a line keeps."""
    if not settings.check_alignment:
        return None
    return {**thresholds_record(settings), "retries": settings.retries}


class EarlierRows:
    """The rows earlier runs left in the output folder, by id
    (``previous_rows``): the manifest's, then (newer) those of the partial
    manifests a torchrun job left when it stopped before merging them.
    A row is read from its file when it is taken (``take``): until then it
    is its id and where it is, a few hundred bytes a row however long."""

    def __init__(self):
        # id -> (first byte << 48) | (length << 16) | which file, in file order
        self._where: dict[str, int] = {}
        self._files: list[tuple[str, BinaryIO]] = []
        self.partial = False   # a torchrun job left partial manifests
        self._whole = -1       # which file is the manifest itself, if there is one

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def values(self) -> Iterator[ManifestRow | dict]:
        """Every row, read (and left to take)."""
        return (self._read(*_unpacked(where)) for where in self._where.values())

    def take(self, row_id: str) -> tuple[ManifestRow | dict | None, tuple[int, int] | None]:
        """The row of ``row_id`` (None if there is none), no longer held
        here, and where its line is in the manifest, (first byte, length),
        when it is the manifest's (so a kept row the same in every field is
        written back as it was read, not serialized again)."""
        where = self._where.pop(row_id, None)
        if where is None:
            return None, None
        start, length, file = _unpacked(where)
        return self._read(start, length, file), ((start, length) if file == self._whole else None)

    def _read(self, start: int, length: int, file: int) -> ManifestRow | dict:
        name, f = self._files[file]
        try:
            row = row_at(f, name, start, length)
        except (ValueError, OSError) as e:
            raise _damaged(e) from None
        # a row as this version writes it is kept as a ManifestRow, which
        # takes a fraction of a dict's memory (BENCHMARKS.md, Scale)
        return ManifestRow(**row) if row.keys() == ROW_FIELD_SET else row

    def index(self, path: Path) -> None:
        """Where each row of the manifest at ``path`` (or a partial one) is, by id."""
        whole = path.name == MANIFEST_NAME
        self.partial |= not whole
        file = len(self._files)
        if whole:
            self._whole = file
        f = open(path, "rb")
        self._files.append((os.fspath(path), f))
        for row_id, start, length in row_ids_at(f, os.fspath(path)):
            self._where.pop(row_id, None)   # a later row of an id stands in its place in file order
            self._where[row_id] = (start << 48) | (length << 16) | file

    def close(self) -> None:
        for _, f in self._files:
            f.close()
        self._files.clear()


def _unpacked(where: int) -> tuple[int, int, int]:
    """(first byte, length, which file) of an ``EarlierRows`` place."""
    return where >> 48, (where >> 16) & 0xFFFFFFFF, where & 0xFFFF


def _damaged(e: Exception) -> FatalError:
    """An earlier manifest that cannot be read, and what to do."""
    if isinstance(e, IsADirectoryError):   # no run wrote it: --force could not write one there either
        return FatalError(f"{e.filename}: a folder where the manifest goes; move it away, or choose another "
                          "output directory")
    return FatalError(f"{e}; pass {option('force', True)} to start over, or choose another output directory")


def previous_rows(out_dir: Path) -> EarlierRows:
    """The rows earlier runs left, by id: the manifest's, then (newer) those
    of the partial manifests a torchrun job left when it stopped before
    merging them; none when there is no manifest."""
    rows = EarlierRows()
    for path in [out_dir / MANIFEST_NAME, *partial_manifests(out_dir)]:
        if not path.exists():
            continue
        try:
            rows.index(path)
        except (ValueError, OSError) as e:
            rows.close()
            raise _damaged(e) from None
    return rows


def partial_manifests(out_dir: Path) -> list[Path]:
    return sorted(out_dir.glob(PARTIAL_MANIFESTS)) if out_dir.is_dir() else []


def run_seed(settings: Settings, previous: dict[str, dict]) -> tuple[int, str]:
    """The seed set; else the seed the existing manifest recorded, so that a plain
    re-run continues the same job; else a fresh random one."""
    if settings.seed is not None:
        return settings.seed, "given"
    recorded = next((seed for seed in (row_fields(row)("seed") for row in previous.values())
                     if isinstance(seed, int)), None)
    if recorded is not None:
        return recorded, "from the existing manifest"
    return secrets.randbelow(2 ** 31), "random"


def line_key(pieces: list[list[int]], line_id: str, run_seed: int, identity: dict,
             piece_pause: float) -> str:
    """Stable hash of everything that decides the line's audio. The pieces'
    ids cover the text and how it was cut; the pause matters only between pieces."""
    record = {"pieces": pieces, "seed": run_seed, "id": line_id, **identity}
    if len(pieces) > 1:
        record["piece_pause"] = piece_pause
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# A kept row is made from the earlier row's fields but these, which the line has now.
_ROW_FIELDS = {f.name for f in dataclasses.fields(ManifestRow)} - {"line", "text", "mel_filepath"}
# The code that turns a line's text into the pieces its key hashes.
_FRONT_END = ("text.py", "spoken_forms.py", "splitting.py", "planning.py", "formats.py")


@functools.cache
def front_end_digest() -> str:
    """sha256 of the text front end's code and of the libraries it reads
    with (a change to any may change a line's pieces, so no text key made
    before it matches after it)."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in _FRONT_END:
        digest.update((here / name).read_bytes())
    for library in ("inflect", "Unidecode"):
        digest.update(f"{library} {importlib.metadata.version(library)}\n".encode())
    return digest.hexdigest()


def text_context(run_seed: int, identity: dict, settings: Settings) -> str:
    """What, besides a line's id and text, its pieces and key follow from:
    the run's seed, the audio identity (models, settings, normalization,
    device, precision), where lines are cut and the pause between pieces
    (which the identity leaves to the pieces' ids) and the front end's
    code. The text as read stands for the corpus format."""
    record = {"seed": run_seed, "max_symbols_per_piece": settings.max_symbols_per_piece,
              "piece_pause": settings.piece_pause, "front_end": front_end_digest(), **identity}
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def text_key(context: str, u: Utterance) -> str:
    """A line's text key: its id and text as read under ``text_context``.
    Two runs that give a line the same text key give it the same pieces and
    resume key, so a re-run takes the key from the earlier row and leaves
    the line's text unread (a corpus of a million lines spends most of a
    re-run in the front end otherwise)."""
    return hashlib.blake2b(f"{context}\0{u.id}\0{u.text}".encode(), digest_size=16).hexdigest()


def kept_as_read(old: ManifestRow | dict | None, text_key_now: str, u: Utterance, out_dir: Path,
                 settings: Settings) -> ManifestRow | None:
    """The earlier row, to keep, when it was made from the same text under
    the same context (its text key is ``text_key_now``) and its files are
    whole (``reusable_row`` with the row's own key); else None."""
    if old is None:
        return None
    field = row_fields(old)
    if field("text_key") != text_key_now or not isinstance(field("key"), str):
        return None
    return reusable_row(old, field("key"), u, out_dir, settings)


def reusable_row(old: ManifestRow | dict | None, key: str, u: Utterance, out_dir: Path,
                 settings: Settings) -> ManifestRow | None:
    """The earlier run's row, to keep with its WAV, when the key matches and
    the WAV is whole (present, at the recorded length and rate); else None.

    The row keeps its mel file, with or without --save-mels, while that is
    whole (present, at the recorded frames): the key that vouches for the
    WAV vouches for the mel. With --save-mels, a line whose mel is missing or
    damaged is made again, WAV and all: a mel comes only from Tacotron2, and
    the pipeline has no pass that runs it without WaveGlow.

    The files stay where the earlier run put them: a row made under another
    layout (flat, or shards of another size; formats.Layout) keeps its
    paths, so a corpus that grows past one shard remakes nothing.
    """
    if old is None:
        return None
    field = row_fields(old)
    if field("key") != key or field("status") not in WITH_AUDIO:
        return None
    wav, mel = field("audio_filepath"), field("mel_filepath")
    if not isinstance(wav, str):
        return None
    if settings.layout == "webdataset":
        key = key_of(u.id)
        size = field("audio_bytes")
        if (wav.rpartition("/")[2] != f"{key}.{settings.audio_format}" or not isinstance(size, int)
                or member_size(out_dir, wav) != size):
            return None
        if not isinstance(mel, str) or mel.rpartition("/")[2] != f"{key}.npy" or member_size(out_dir, mel) is None:
            mel = None
    else:
        if (not names_a_place_for(wav, "wavs", f"{u.id}.{settings.audio_format}")
                or not _whole_audio(os.path.join(out_dir, wav), field("num_samples"), field("duration"),
                                    field("audio_bytes"))):
            return None
        if (not isinstance(mel, str) or not names_a_place_for(mel, "mels", f"{u.id}.npy")
                or _mel_frames(out_dir / mel) != field("mel_frames")):
            mel = None
    if settings.save_mels and mel is None:
        return None
    if isinstance(old, ManifestRow):
        if (old.line, old.text, old.mel_filepath) == (u.line, u.text, mel):
            return old
        return dataclasses.replace(old, line=u.line, text=u.text, mel_filepath=mel)
    return ManifestRow(**{k: v for k, v in old.items() if k in _ROW_FIELDS}, line=u.line, text=u.text, mel_filepath=mel)



def _whole_audio(path: str, samples: int, duration: float, size: int | None) -> bool:
    """The audio file is there as the row says: at the size it was written
    at, where the row records that (one stat); else, by its header, with
    the row's samples at the row's rate (samples over duration: the row
    was written at the rate the key vouches for)."""
    if isinstance(size, int):
        try:
            found = os.stat(path)
        except OSError:   # missing: make it again
            return False
        return stat.S_ISREG(found.st_mode) and found.st_size == size
    try:
        info = sf.info(path)
    except (RuntimeError, OSError):   # missing or unreadable: make it again
        return False
    return info.frames == samples and duration > 0 and info.samplerate == round(samples / duration)


def _mel_frames(path: Path) -> int | None:
    """The frames of a whole mel file (a 2-D float32 .npy), read from its
    header; None when it is missing or damaged."""
    try:
        mel = np.load(path, mmap_mode="r", allow_pickle=False)   # header only; data past its end fails
    except (OSError, ValueError, EOFError):
        return None
    return mel.shape[1] if mel.ndim == 2 and mel.dtype == np.float32 else None
