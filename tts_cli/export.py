"""The manifests training tools read, made from a run's own manifest.jsonl
(which stays the source of truth): Hugging Face audiofolder, Lhotse, Kaldi,
NeMo.

Only lines whose audio says their text go in: ``ok``, and ``suspect`` where
asked, less those whose text holds ARPAbet in braces (``{HH AW1 S}``: a
transcript of phones, which a recognizer must not learn as words). The
transcript is the normalized text, what the voice was asked to say.
audiofolder's file names are relative to its metadata.jsonl, as it
requires; Lhotse, Kaldi and NeMo resolve paths against the working
directory, so theirs are absolute.

RECORD, in the output folder, lists the exports written there, each with
whether it took the suspect lines and the manifest it was made from: a
synthesis run into that folder writes again those made from another
manifest (``refresh``), so that none keeps a line's old text or duration,
and one that a kill or a second signal cut short is made by the next run.
audiofolder reads only metadata.* files, and Lhotse, Kaldi and NeMo only
the files they are given, so none takes it for data.
"""
from __future__ import annotations

import collections
import functools
import gzip
import json
import os
import shlex
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import soundfile

from tts_cli.audio import atomic_write
from tts_cli.errors import OutputNotice, first_line, option, the_run_again
from tts_cli.formats import EXPORTS
from tts_cli.manifest import STATUSES, manifest_rows_at, plural
from tts_cli.tarshards import shard_of

# Kaldi and Lhotse want a speaker per utterance: all lines share the voice.
SPEAKER = "tts"
# Why a line of a status that goes in is left out: its text holds phones.
ARPABET = "with ARPAbet"
# {"exports": {export name: {"include_suspect": bool, "made_from": the
# manifest's _stamp}}}: the exports in the folder, and what each was made from.
RECORD = "exports.json"
# Each export's files, as its writer below writes them.
FILES = {"hf": ["metadata.jsonl"], "lhotse": ["recordings.jsonl.gz", "supervisions.jsonl.gz"],
         "kaldi": ["kaldi/wav.scp", "kaldi/text", "kaldi/utt2spk", "kaldi/spk2utt"],
         "nemo": ["nemo_manifest.jsonl"]}


@dataclass(frozen=True)
class Exported:
    """What ``export`` wrote, and what it left out."""
    files: dict[str, list[Path]]   # each export's files (removed, where ``emptied``)
    lines: int                     # the lines each holds
    left_out: dict[str, int]       # the manifest's other lines, by why: their status, or ARPABET
    emptied: str | None = None     # why a refresh removed them: no line to export
    failed: str | None = None      # why a refresh could not write them again (they are as they were)

    @property
    def summary(self) -> str:
        """``exported 10 lines; left out: 2 pending, 3 with ARPAbet``."""
        left_out = f"; left out: {_reasons(self.left_out)}" if self.left_out else ""
        return f"exported {plural(self.lines, 'line')}{left_out}"


def finish_first() -> str:
    """What to do about lines still pending: they have no audio yet."""
    return f"finish the run first: {the_run_again()}"


def _remake() -> str:
    """What to do about an audio file a row names that is not there."""
    return f"run {the_run_again()}: it makes missing files again"


class NothingToExport(ValueError):
    """A manifest with no line to export; nothing was written."""


class Stopped(Exception):
    """The export was asked to stop: what it wrote last is not recorded."""


class Made(NamedTuple):
    """An export as RECORD lists it."""
    include_suspect: bool
    made_from: list[int] | None   # the manifest's _stamp when it was written


T = TypeVar("T")


def export(out_dir: Path, formats: list[str], include_suspect: bool = False,
           stop: threading.Event | None = None) -> Exported:
    """Write each of ``formats`` (EXPORTS) into ``out_dir``. A manifest
    with no line to export (NothingToExport), or a line's audio file
    missing (for Kaldi, unreadable), raises ValueError, and nothing is
    written. Once ``stop`` is set it raises Stopped, and RECORD keeps what
    it had of those not written yet."""
    if not formats:
        raise ValueError(f"no export named; use any of: {', '.join(EXPORTS)}")
    unknown = sorted(set(formats) - set(EXPORTS))
    if unknown:
        raise ValueError(f"unknown export {', '.join(unknown)}; use any of: {', '.join(EXPORTS)}")
    wanted = ("ok", "suspect") if include_suspect else ("ok",)
    out_dir = out_dir.resolve()
    recorded(out_dir)   # a damaged record is said before anything is written
    made_from = _stamp(out_dir)
    rows, left_out = _chosen((row for row, _ in manifest_rows_at(out_dir / "manifest.jsonl")), wanted)
    if not rows:
        raise NothingToExport(_nothing_to_export(out_dir / "manifest.jsonl", left_out))
    in_shards = [row["id"] for row in rows if shard_of(row["audio_filepath"] or "")]
    if in_shards:
        raise ValueError(f"{out_dir}: {len(in_shards)} lines (e.g. {in_shards[0]}) are in tar shards "
                         f"({option('layout', 'webdataset')}), which WebDataset reads as they are; these exports "
                         "name files")
    subtypes = _checked_audio(out_dir, _until(stop, rows), headers="kaldi" in formats)
    writers: dict[str, Callable[[Path, Iterable[dict]], list[Path]]] = {
        "hf": _huggingface, "lhotse": _lhotse, "kaldi": functools.partial(_kaldi, subtypes=subtypes), "nemo": _nemo}
    files = {}
    for name in formats:   # each recorded once written, so that one cut short is known as such
        files[name] = writers[name](out_dir, _Passes(rows, stop))
        _record(out_dir, {name: Made(include_suspect, made_from)})
    return Exported(files, len(rows), left_out)


def recorded(out_dir: Path) -> dict[str, Made]:
    """The exports RECORD lists in ``out_dir``; none without it."""
    path = out_dir / RECORD
    try:
        record = json.loads(path.read_bytes())
        exports = {name: Made(how["include_suspect"], how["made_from"]) for name, how in record["exports"].items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{path}: not a record of exports ({first_line(e)}); remove it and export again") from None
    if set(exports) - set(EXPORTS) or not all(isinstance(made.include_suspect, bool) for made in exports.values()):
        raise ValueError(f"{path}: not a record of exports (names of {', '.join(EXPORTS)}, each with "
                         "include_suspect true or false); remove it and export again")
    return exports


def refresh(out_dir: Path, stop: threading.Event | None = None) -> list[Exported]:
    """The exports RECORD lists in ``out_dir`` that were made from another
    manifest than its own (a run changed it; or a refresh was cut short),
    made again, each with or without the suspect lines as before: one
    ``Exported`` for those with, one for those without. Where no line is
    left to export, their files are removed (none may name a line's old
    audio or text) and they stay listed, to come back with the lines; those
    that cannot be written again are said so (``failed``), and are the next
    run's, as are those not made yet once ``stop`` is set (Stopped)."""
    out_dir = out_dir.resolve()
    manifest = _stamp(out_dir)
    by_choice: dict[bool, list[str]] = {}
    for name, made in recorded(out_dir).items():
        if made.made_from != manifest:
            by_choice.setdefault(made.include_suspect, []).append(name)
    done = []
    for include_suspect, names in by_choice.items():
        try:
            done.append(export(out_dir, names, include_suspect, stop))
        except NothingToExport as e:
            done.append(Exported({name: _remove(out_dir, name) for name in names}, 0, {}, emptied=first_line(e)))
            _record(out_dir, dict.fromkeys(names, Made(include_suspect, manifest)))
        except OSError:   # a file of one export that cannot be written: each on its own, those not made yet
            left = [name for name, made in recorded(out_dir).items() if name in names and made.made_from != manifest]
            done += [_alone(out_dir, name, include_suspect, stop) for name in left]
        except ValueError as e:   # the manifest or its audio: the same for every export
            done.append(Exported(dict.fromkeys(names, []), 0, {}, failed=first_line(e)))
    return done


def _alone(out_dir: Path, name: str, include_suspect: bool, stop: threading.Event | None) -> Exported:
    """Export ``name`` again on its own, or why it cannot be (``failed``)."""
    try:
        return export(out_dir, [name], include_suspect, stop)
    except (ValueError, OSError) as e:
        return Exported({name: []}, 0, {}, failed=first_line(e))


def refresh_saying(out_dir: Path, on_notice: Callable[[str], None], stop: threading.Event | None = None) -> None:
    """``refresh``, said in one notice; exports emptied, or one that cannot
    be written again or was stopped, in one notice --quiet keeps; the run's
    outcome stands."""
    try:
        refreshed = refresh(out_dir, stop)
    except (ValueError, OSError) as e:
        on_notice(OutputNotice(f"exports not refreshed, and they may hold lines as an earlier run made them: "
                               f"{first_line(e)}"))
        return
    except Stopped:
        on_notice(OutputNotice("exports not all refreshed (stopped by a signal), and they may hold lines as an "
                               f"earlier run made them; the next run into {out_dir} writes them again"))
        return
    for done in (d for d in refreshed if d.failed):
        on_notice(OutputNotice(f"exports not refreshed ({', '.join(done.files)}), and they may hold lines as an "
                               f"earlier run made them: {done.failed}"))
    for done in (d for d in refreshed if d.emptied):
        on_notice(OutputNotice(f"exports removed: {', '.join(map(str, _files(done)))} ({done.emptied}); "
                               "the next run with lines to export makes them again"))
    written = [d for d in refreshed if not d.emptied and not d.failed]
    if written:
        on_notice("exports refreshed: " + ", ".join(f"{', '.join(done.files)} ({plural(done.lines, 'line')})"
                                                    for done in written))
    pending = max((d.left_out.get("pending", 0) for d in written), default=0)
    if pending:   # a run stopped early: its lines still to make are not in them, as the manifest says
        on_notice(OutputNotice(f"exports hold no line of the {plural(pending, 'line')} still pending; "
                               f"{finish_first()}, which writes them again"))


def _stamp(out_dir: Path) -> list[int] | None:
    """Which manifest.jsonl ``out_dir`` holds: its size, modification time
    and inode (each write is a new file, renamed into place)."""
    try:
        found = (out_dir / "manifest.jsonl").stat()
    except FileNotFoundError:
        return None
    return [found.st_size, found.st_mtime_ns, found.st_ino]


def _record(out_dir: Path, written: dict[str, Made]) -> None:
    """RECORD with ``written`` in place of what it said of those exports."""
    exports = {**recorded(out_dir), **written}
    record = {"exports": {name: made._asdict() for name, made in exports.items()}}
    _write(out_dir / RECORD, [json.dumps(record, indent=1)])


# How many rows an export goes through between two looks at its ``stop``.
_ROWS_PER_LOOK = 1024


def _until(stop: threading.Event | None, items: Iterable[T]) -> Iterator[T]:
    """``items``, raising Stopped once ``stop`` is set."""
    for n, item in enumerate(items):
        if stop is not None and n % _ROWS_PER_LOOK == 0 and stop.is_set():
            raise Stopped
        yield item


class _Passes:
    """The rows an export writes, each pass over them stopping (Stopped)
    once ``stop`` is set."""

    def __init__(self, rows: list[dict], stop: threading.Event | None):
        self.rows, self.stop = rows, stop

    def __iter__(self) -> Iterator[dict]:
        return _until(self.stop, self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _remove(out_dir: Path, name: str) -> list[Path]:
    """The files of export ``name`` (FILES) in ``out_dir``, removed."""
    paths = [out_dir / file for file in FILES[name]]
    for path in paths:
        path.unlink(missing_ok=True)
    return paths


def _files(done: Exported) -> list[Path]:
    return [path for paths in done.files.values() for path in paths]


def _transcript(row: dict) -> str:
    """The words a line's audio says, single-spaced (the normalized text
    keeps a space where it left out a character, as the model read it)."""
    return " ".join(row["normalized_text"].split())


# The fields of a row the exports read.
_READ = ("id", "line", "normalized_text", "audio_filepath", "duration", "num_samples")


def _chosen(manifest: Iterable[dict], wanted: tuple[str, ...]) -> tuple[list[dict], dict[str, int]]:
    """The rows that go in, by id, each with the fields the exports read
    (a million whole rows would take gigabytes), and how many others there
    are by why they stay out, in the order of STATUSES, then ARPABET. A
    brace in the normalized text is a phone's: the symbol table has no other."""
    rows, left_out = [], collections.Counter()
    for row in manifest:
        if row["status"] not in wanted:
            left_out[row["status"]] += 1
        elif "{" in row["normalized_text"]:
            left_out[ARPABET] += 1
        else:
            rows.append({field: row[field] for field in _READ})
    by_why = {why: left_out[why] for why in (*STATUSES, ARPABET) if left_out[why]}
    return sorted(rows, key=lambda row: row["id"]), by_why


def _checked_audio(out_dir: Path, rows: Iterable[dict], headers: bool) -> dict[str, str]:
    """Each row's audio file, by its path, with its samples' subtype where
    ``headers`` (wav.scp needs it), else ""; a file that is not there, or
    whose header cannot be read, raises ValueError naming it."""
    subtypes = {}
    for row in rows:
        path = str(out_dir / row["audio_filepath"])
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such file, which the manifest names for line {row['line']}; {_remake()}")
        try:
            subtypes[path] = soundfile.info(path).subtype if headers else ""
        except soundfile.SoundFileError as e:
            raise ValueError(f"{path}: cannot read its header ({first_line(e)}); remove it and {_remake()}") from None
    return subtypes


def _nothing_to_export(manifest: Path, left_out: dict[str, int]) -> str:
    why = f"left out: {_reasons(left_out)}" if left_out else "it has no rows"
    finish = f"; {finish_first()}" if "pending" in left_out else ""
    return f"{manifest}: no line to export ({why}); nothing written{finish}"


def _reasons(left_out: dict[str, int]) -> str:
    """``2 pending, 1 suspect (--include-suspect adds them), 3 with ARPAbet``."""
    return ", ".join(f"{n:,} {why}" + (" (--include-suspect adds them)" if why == "suspect" else "")
                     for why, n in left_out.items())


def _huggingface(out_dir: Path, rows: Iterable[dict]) -> list[Path]:
    """audiofolder's metadata.jsonl beside wavs/: file_name relative to it."""
    return [_write(out_dir / "metadata.jsonl", (_json({"file_name": row["audio_filepath"],
                                                      "transcription": _transcript(row), "id": row["id"],
                                                      "duration": row["duration"]}) for row in rows))]


def _lhotse(out_dir: Path, rows: Iterable[dict]) -> list[Path]:
    """Lhotse's recordings and supervisions, one whole-file segment a line."""
    def recording(row: dict) -> dict:
        return {"id": row["id"], "sources": [{"type": "file", "channels": [0],
                                              "source": str(out_dir / row["audio_filepath"])}],
                "sampling_rate": round(row["num_samples"] / row["duration"]), "num_samples": row["num_samples"],
                "duration": row["duration"], "channel_ids": [0]}

    def supervision(row: dict) -> dict:
        return {"id": row["id"], "recording_id": row["id"], "start": 0.0, "duration": row["duration"],
                "channel": 0, "text": _transcript(row), "language": "English", "speaker": SPEAKER}

    return [_write(out_dir / name, (_json(item(row)) for row in rows), compressed=True)
            for name, item in (("recordings.jsonl.gz", recording), ("supervisions.jsonl.gz", supervision))]


def _kaldi(out_dir: Path, rows: Iterable[dict], subtypes: dict[str, str]) -> list[Path]:
    """Kaldi's data directory (wav.scp, text, utt2spk, spk2utt) in kaldi/,
    sorted by utterance id as Kaldi requires; audio Kaldi cannot read
    (FLAC, other than 16-bit samples) is decoded through a pipe."""
    def scp(row: dict) -> str:
        path = str(out_dir / row["audio_filepath"])
        return f"{row['id']} {_rxfilename(path, subtypes[path])}"

    files = {"wav.scp": map(scp, rows),
             "text": (f"{row['id']} {_transcript(row)}" for row in rows),
             "utt2spk": (f"{row['id']} {SPEAKER}" for row in rows),
             "spk2utt": [f"{SPEAKER} {' '.join(row['id'] for row in rows)}"] if rows else []}
    return [_write(out_dir / "kaldi" / name, lines) for name, lines in files.items()]


def _nemo(out_dir: Path, rows: Iterable[dict]) -> list[Path]:
    """NeMo's ASR manifest: one JSON object a line, the audio's path, its
    seconds and the transcript (NeMo reads ``text`` as the transcript)."""
    def item(row: dict) -> str:
        return _json({"audio_filepath": str(out_dir / row["audio_filepath"]), "duration": row["duration"],
                      "text": _transcript(row)})

    return [_write(out_dir / "nemo_manifest.jsonl", map(item, rows))]


def _json(item: dict) -> str:
    return json.dumps(item, ensure_ascii=False)


def _rxfilename(path: str, subtype: str) -> str:
    """How wav.scp names an audio file. Kaldi reads 16-bit PCM WAV alone: a
    16-bit WAV by its path (through ``cat`` where the path holds white space,
    which Kaldi would split it at), a 16-bit FLAC through ``flac -d``, and
    24-bit or float samples through ``sox`` to 16 bits; a piped path quoted."""
    wav, pcm16 = path.endswith(".wav"), subtype == "PCM_16"
    if wav and pcm16 and not any(c.isspace() for c in path):
        return path
    if not pcm16:
        return f"sox {shlex.quote(path)} -t wav -b 16 - |"
    return f"{'cat' if wav else 'flac -c -d -s'} {shlex.quote(path)} |"


def _write(path: Path, lines: Iterable[str], compressed: bool = False) -> Path:
    """``lines`` into ``path``, each ended by a newline, as they come (a
    million lines are never held as one file's text); gzip-compressed with
    no name or time in its header where ``compressed``."""
    with atomic_write(path) as temp_path, open(temp_path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if compressed else raw as f:
            for line in lines:
                f.write(line.encode() + b"\n")
    return path
