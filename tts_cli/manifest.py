"""The run manifest: one JSON line per corpus line, saying what became of it.

The manifest is JSON Lines (``audio_filepath``, ``duration`` and ``text`` named
as NeMo names them; export.py writes what NeMo reads) with exactly one row
per corpus line, in corpus order,
including lines that produced no audio (status ``skipped`` or ``error``, with
a ``reason``). ``audio_filepath`` is relative to the manifest's directory so
the output folder can be moved or shared as a whole.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from tts_cli.audio import atomic_write
from tts_cli.corpus import Utterance

STATUSES = ("ok", "suspect", "truncated", "skipped", "error", "pending")
# Statuses of a line with audio, which a re-run may keep (resume.py).
WITH_AUDIO = ("ok", "suspect", "truncated")
# The partial manifests of a torchrun job's processes: distributed.py writes
# them, resume.py reads those that a job stopped before merging left behind.
PARTIAL_MANIFESTS = "manifest.rank-*-of-*.jsonl"


def partial_manifest_name(rank: int, world: int) -> str:
    """The partial manifest of process ``rank`` of ``world``."""
    return PARTIAL_MANIFESTS.replace("*", str(rank), 1).replace("*", str(world), 1)

# With ensure_ascii=False these characters are written raw, and
# str.splitlines() (used by many jsonl readers) treats them as line breaks,
# which would split one row in two. json.dumps already escapes C0 controls.
_LINE_BREAKING_CHARACTERS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


@dataclass(slots=True)   # no dict per row: a re-run reads every earlier row before it plans
class ManifestRow:
    """What happened to one corpus line."""

    # Output file stem from the corpus (or its ``line-<N>`` placeholder).
    id: str
    # 1-based physical line number in the corpus.
    line: int
    # The text as read from the corpus.
    text: str
    # The text actually fed to the model, after normalization.
    normalized_text: str
    # WAV path relative to the manifest's directory, e.g. "wavs/LJ001-0001.wav"; None without audio.
    audio_filepath: str | None
    # Length of the audio in seconds (0.0 without audio).
    duration: float
    # Length of the audio in samples (0 without audio).
    num_samples: int
    # Decoder frames of the mel spectrogram (0 when not synthesized).
    mel_frames: int
    # One of STATUSES.
    status: str
    # Why the status is not "ok" (e.g. the corpus problem or the exception), else None.
    reason: str | None
    # PCM16 samples whose magnitude exceeded full scale and were clamped.
    clipped_samples: int = 0
    # Random seed used for this utterance, when sampling was seeded.
    seed: int | None = None
    # Mel spectrogram path relative to the manifest's directory, when this run or an
    # earlier one with the same key saved the line's mel; else None.
    mel_filepath: str | None = None
    # Pieces the line was cut into and synthesized as (1: not cut; 0: not synthesized).
    pieces: int = 1
    # Resume key: hash of everything that decides this line's audio (ids, models,
    # settings, seed). A re-run reuses the WAV when the key matches.
    key: str | None = None
    # The attention's health (alignment.py): the kept attempt's measures and
    # the attempts made; a cut line's worst, with each piece's under "pieces".
    # None when the line was not synthesized or the run checked none.
    alignment: dict | None = None
    # The characters of the line (outside ARPAbet braces) the front end could
    # not say and left out, once each, in order: "%" under the reference
    # normalization, quotes, an emoji (text.Reading.dropped). None when none
    # were, or the line was not read.
    dropped: str | None = None
    # Size of the audio file in bytes as written: a re-run checks the file
    # against it with one stat (rows without it: by reading the header).
    audio_bytes: int | None = None
    # Hash of the line's id and text as read and of all else its pieces and
    # key follow from (resume.text_key): a re-run whose line hashes the same
    # takes the row's key without running the text front end again.
    text_key: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(
                f"manifest row for id {self.id!r} (line {self.line}): unknown status {self.status!r}; "
                f"use one of: {', '.join(STATUSES)}"
            )

    def to_json(self) -> str:
        """Serialize as one JSON line (no newline), keys in field order."""
        record = {name: getattr(self, name) for name in _FIELD_NAMES}   # shallow: asdict deep-copies
        record["duration"] = round(float(self.duration), 6)
        # allow_nan=False: NaN is not JSON and would break strict readers.
        text = json.dumps(record, ensure_ascii=False, allow_nan=False, default=_numpy_scalar_to_python)
        for character, escape in _LINE_BREAKING_CHARACTERS.items():
            text = text.replace(character, escape)
        return text


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(ManifestRow))
ROW_FIELD_SET = frozenset(_FIELD_NAMES)


def row_fields(row: ManifestRow | Mapping[str, Any]) -> Callable[[str], Any]:
    """``field(name)``: a field of ``row``, a ManifestRow or a row as read
    from a manifest (a mapping; None for a key it does not have)."""
    return functools.partial(getattr, row) if isinstance(row, ManifestRow) else row.get


def row_without_audio(u: Utterance, normalized: str, status: str, reason: str | None,
         seed: int | None, dropped: str | None = None) -> ManifestRow:
    """The row of a line that made no audio (skipped, or failed)."""
    return ManifestRow(id=u.id, line=u.line, text=u.text, normalized_text=normalized,
                       audio_filepath=None, duration=0.0, num_samples=0, mel_frames=0,
                       status=status, reason=reason, seed=seed, pieces=0, dropped=dropped)


# Keys every manifest row must have; the fields with defaults are optional
# diagnostics, so a reader tolerates their absence.
_REQUIRED_KEYS = tuple(
    field.name for field in dataclasses.fields(ManifestRow)
    if field.default is dataclasses.MISSING
)


def write_manifest(path: str | os.PathLike, rows: Iterable[ManifestRow]) -> None:
    """Write ``rows`` as JSON Lines to ``path``, in the order given, atomically.

    Readers (and a resumed run) see either the previous manifest or the new
    one in full, never a half-written file.
    """
    write_manifest_lines(path, (row.to_json().encode("utf-8") for row in rows))


def write_manifest_lines(path: str | os.PathLike, lines: Iterable[bytes]) -> None:
    """``write_manifest`` for rows already serialized by ``ManifestRow.to_json``,
    as UTF-8 (the journal keeps them in files). Written a few thousand rows
    at a time: a million rows joined at once would hold the manifest in
    memory."""
    with atomic_write(path) as temp_path:
        # binary: the same bytes on every OS, one row per '\n'.
        with open(temp_path, "wb") as manifest_file:
            rows = iter(lines)
            while chunk := list(itertools.islice(rows, 4096)):
                manifest_file.write(b"\n".join(chunk) + b"\n")


def read_manifest(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a manifest back as a list of dicts, in file order.

    Blank lines are skipped. A row that is not a JSON object with the manifest
    keys and a known status raises ValueError naming ``path:line``.
    """
    return [row for row, _ in manifest_rows_at(path)]


def manifest_rows_at(path: str | os.PathLike) -> Iterator[tuple[dict[str, Any], tuple[int, int]]]:
    """``read_manifest``'s rows, each with where its line is in the file:
    (first byte, length), the line ending left out. One at a time, so that
    a long manifest is never held whole, as bytes or as dicts."""
    name = os.fspath(path)
    with open(path, "rb") as manifest_file:
        for number, line, start in _lines_at(manifest_file):
            yield _parse_row(line, name, number), (start, len(line))


def _lines_at(f: BinaryIO) -> Iterator[tuple[int, bytes, int]]:
    """The rows' lines of the manifest open as ``f``, from its start: (line
    number, the line without its ending, its first byte); blank lines
    skipped. A binary file's lines end at '\n' only, as write_manifest ends
    rows."""
    start = 0
    f.seek(0)
    for number, raw in enumerate(f, start=1):
        if raw.strip():
            yield number, raw.removesuffix(b"\n").removesuffix(b"\r"), start
        start += len(raw)


# The start of a row as ``ManifestRow.to_json`` writes it: its id, as JSON.
_ID_FIRST = re.compile(rb'\{"id": ("(?:[^"\\]|\\.)*"), ')


def row_ids_at(f: BinaryIO, name: str) -> Iterator[tuple[str, int, int]]:
    """Each row's id in the manifest open as ``f`` (named ``name``), with
    where its line is, (first byte, length), the line ending left out;
    blank lines skipped. A row's id is read from the start of its line
    where the row is as ``ManifestRow.to_json`` writes it (the row itself
    is checked when it is read, ``row_at``), else from the whole row, which
    must be one (ValueError names ``name:line``)."""
    for number, line, start in _lines_at(f):
        first = _ID_FIRST.match(line)
        if first is not None and b"\\" not in first[1]:
            row_id = first[1][1:-1].decode("utf-8", errors="surrogateescape")
        else:
            row_id = _parse_row(line, name, number)["id"]
        yield row_id, start, len(line)


def row_at(f: BinaryIO, name: str, start: int, length: int) -> dict[str, Any]:
    """The row whose line is at ``start`` in the manifest open as ``f``,
    checked as ``read_manifest`` checks it (ValueError names ``name:line``)."""
    raw = os.pread(f.fileno(), length, start)
    try:
        return _parse_row(raw, name, 0)
    except ValueError:
        number = os.pread(f.fileno(), start, 0).count(b"\n") + 1
        return _parse_row(raw, name, number)


def as_written(row: ManifestRow, record: ManifestRow | dict[str, Any]) -> bool:
    """Whether ``row`` is the row ``record`` was read from (every field, and
    nothing else, the same): its line as written serializes it."""
    if isinstance(record, ManifestRow):
        return row is record or row == record
    return record.keys() == ROW_FIELD_SET and row == ManifestRow(**record)


def plural(n: int, noun: str) -> str:
    """``1 line``, ``2 lines``, ``1,000 lines``: how reports count."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _parse_row(raw: bytes, name: str, number: int) -> dict[str, Any]:
    """Parse and check one manifest line (no line ending); ValueError names
    ``name:number``."""
    where = f"{name}:{number}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{where}: not valid UTF-8 (byte 0x{raw[error.start]:02x}); the manifest is damaged") from None
    try:
        record = _DECODER.decode(text)
    except ValueError as error:
        raise ValueError(f"{where}: not valid JSON ({error}); the manifest is damaged or truncated") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}; the manifest is damaged")
    missing = [key for key in _REQUIRED_KEYS if key not in record]
    if missing:
        raise ValueError(f"{where}: missing keys {', '.join(missing)}; this is not a tts-batch manifest row")
    if record["status"] not in STATUSES:
        raise ValueError(f"{where}: unknown status {record['status']!r}; expected one of: {', '.join(STATUSES)}")
    get = record.get
    for key, kinds in _KINDS:
        if type(get(key)) not in kinds:
            raise ValueError(f"{where}: {key} is {get(key)!r}, not {' or '.join(k.__name__ for k in kinds)}; "
                             f"the manifest is damaged")
    return record


def _kinds(field: dataclasses.Field) -> tuple[type, ...]:
    """The types a row's field may hold as read: its annotation's; None
    too where it is optional or has a default (an absent key reads None)."""
    kinds = {"str": (str,), "int": (int,), "float": (float, int), "dict": (dict,)}[field.type.split(" |")[0]]
    optional = "None" in field.type or field.default is not dataclasses.MISSING
    return (*kinds, type(None)) if optional else kinds


# Each field and the types it may hold: a row that holds another is damaged,
# and would fail later, far from where it was read.
_KINDS = tuple((field.name, _kinds(field)) for field in dataclasses.fields(ManifestRow))


def _reject_constant(constant: str) -> Any:
    """json.loads accepts NaN/Infinity by default; a manifest never contains them."""
    raise ValueError(f"{constant} is not valid JSON")


# one decoder for every row (json.loads with an argument makes one a call)
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _numpy_scalar_to_python(value: Any) -> Any:
    """Let callers pass numpy scalars (e.g. np.int64 sample counts) without casting."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
