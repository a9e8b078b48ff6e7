"""One line's files and manifest row: its pieces joined (and resampled to
the run's rate), the audio and mel files written where the layout puts
them, the status and reason it earns (``verdict``); and, under torchrun,
the pieces one process makes for a line another process writes."""
from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tts_cli.alignment import Checked, line_record, suspicion
from tts_cli import formats
from tts_cli.audio import atomic_write, encode_audio, encode_mel, resample, write_audio, write_mel
from tts_cli.config import Settings
from tts_cli.coordination import PIECES_DIR
from tts_cli.decode_rules import MIN_SPEECH_FRAMES
from tts_cli.errors import first_line
from tts_cli.formats import Layout
from tts_cli.manifest import ManifestRow, plural
from tts_cli.planning import PendingLine, row_without_audio
from tts_cli.tarshards import TarShards, key_of

if TYPE_CHECKING:   # torch: imported with the models
    from tts_cli.engine import Result


class LineWriter:
    """Joins one line's pieces, writes its files and makes its manifest row."""

    def __init__(self, settings: Settings, layout: Layout, out_dir: Path, run_seed: int, model_rate: int | None):
        """``model_rate``: the rate the voice's WaveGlow makes (None: no
        audio will be made); the files are at ``settings.sample_rate``, in
        the folders ``layout`` names."""
        self.settings, self.layout, self.out_dir = settings, layout, out_dir
        self.run_seed, self.model_rate = run_seed, model_rate
        self.shards = TarShards(out_dir, formats.TAR_SHARD_BYTES) if settings.layout == "webdataset" else None

    def whole(self, rows: list[ManifestRow]) -> list[ManifestRow]:
        """Of the rows ``write`` gave (and any it held back before), those
        whose files are whole now, for the manifest: all of them in the
        files layout; in the webdataset layout those of the shards finished
        since, a shard's rows held until it has its final name."""
        return rows if self.shards is None else self.shards.take_whole()

    def close(self) -> list[ManifestRow]:
        """Finish what is open (the webdataset layout's last shard): the
        rows held back for it, or a WriteError, and its lines stay pending."""
        if self.shards is None:
            return []
        self.shards.close()
        return self.shards.take_whole()

    def write(self, p: PendingLine) -> ManifestRow:
        u, s = p.utterance, self.settings
        failed = [r for r in p.results if isinstance(r, Exception)]
        if failed:
            return row_without_audio(u, p.normalized, "error", failure_reason(failed[0]), self.run_seed, p.dropped)
        audio = joined_audio([r.audio for r in p.results], s, self.model_rate)
        if not np.isfinite(audio).all():
            return row_without_audio(u, p.normalized, "error", "the model produced non-finite audio", self.run_seed,
                                     p.dropped)
        status, reason = verdict(p.results, s.max_decoder_steps, p.caution)
        row = ManifestRow(id=u.id, line=u.line, text=u.text, normalized_text=p.normalized,
                          audio_filepath=None, duration=audio.shape[0] / s.sample_rate,
                          num_samples=int(audio.shape[0]),
                          mel_frames=sum(r.frames for r in p.results), status=status,
                          reason=reason, seed=self.run_seed, pieces=len(p.results), key=p.key,
                          alignment=_alignment_record(p.results, s), dropped=p.dropped, text_key=p.text_key)
        mel = np.concatenate([r.mel for r in p.results], axis=1) if s.save_mels else None
        if self.shards is not None:
            return self._into_shard(row, audio, mel)
        return self._into_files(row, audio, mel)

    def _into_shard(self, row: ManifestRow, audio: np.ndarray, mel: np.ndarray | None) -> ManifestRow:
        """The line's audio, row and mel as members of the open tar shard."""
        s, key = self.settings, key_of(row.id)
        data, clipped = encode_audio(audio, s.sample_rate, s.sample_format, s.audio_format, row.id)
        mel_data = encode_mel(mel, row.id) if mel is not None else None

        def members(shard: str):
            kept = dataclasses.replace(row, audio_filepath=f"{shard}/{key}.{s.audio_format}", clipped_samples=clipped,
                                       audio_bytes=len(data),
                                       mel_filepath=f"{shard}/{key}.npy" if mel_data is not None else None)
            found = [(s.audio_format, data), ("json", kept.to_json().encode())]
            return found + ([("npy", mel_data)] if mel_data is not None else []), kept
        return self.shards.add(key, members)

    def _into_files(self, row: ManifestRow, audio: np.ndarray, mel_array: np.ndarray | None) -> ManifestRow:
        s = self.settings
        wav = self.layout.audio(row.id, row.line)
        mel = self.layout.mel(row.id, row.line) if mel_array is not None else None
        try:
            if mel is None:
                # No row will point at an earlier run's mel of this line
                # (nor may one: it can be of other audio), so it goes.
                (self.out_dir / self.layout.mel(row.id, row.line)).unlink(missing_ok=True)
            # write_audio and write_mel make the shard folders (atomic_write)
            clipped = write_audio(self.out_dir / wav, audio, s.sample_rate, s.sample_format, s.audio_format)
            audio_bytes = (self.out_dir / wav).stat().st_size
            if mel is not None:
                write_mel(self.out_dir / mel, mel_array)
        except OSError:
            # No row will vouch for a WAV whose mel failed: nothing of the
            # line stays (a file left from an earlier run was stale anyway).
            for name in filter(None, (wav, mel)):
                with contextlib.suppress(OSError):
                    (self.out_dir / name).unlink(missing_ok=True)
            raise
        return dataclasses.replace(row, audio_filepath=wav, clipped_samples=clipped, mel_filepath=mel,
                                   audio_bytes=audio_bytes)

    def _piece_path(self, p: PendingLine, i: int) -> Path:
        return self.out_dir / PIECES_DIR / f"{p.utterance.id}.{i}.npz"

    def write_piece(self, p: PendingLine, i: int) -> None:
        """A shared line's piece, for the process that writes the line."""
        r = p.results[i]
        if isinstance(r, Exception):
            arrays = {"failure": np.array(failure_reason(r))}
        else:
            arrays = {"audio": r.audio, "frames": np.array(r.frames), "truncated": np.array(r.truncated)}
            if r.mel is not None:
                arrays["mel"] = r.mel
            if r.checked is not None:
                arrays["checked"] = np.array(json.dumps(r.checked.plain()))
        with atomic_write(self._piece_path(p, i)) as temp_path:
            with open(temp_path, "wb") as piece_file:
                np.savez(piece_file, **arrays)

    def read_piece(self, p: PendingLine, i: int) -> Result | Exception:
        from tts_cli.engine import Result   # loaded with the models
        try:
            with np.load(self._piece_path(p, i), allow_pickle=False) as arrays:
                if "failure" in arrays:
                    return _MadeElsewhere(str(arrays["failure"]))
                checked = Checked.from_plain(json.loads(str(arrays["checked"]))) if "checked" in arrays else None
                return Result(audio=arrays["audio"], mel=arrays["mel"] if "mel" in arrays else None,
                              frames=int(arrays["frames"]), truncated=bool(arrays["truncated"]), checked=checked)
        except (OSError, ValueError, KeyError) as e:
            return _MadeElsewhere(f"piece {i + 1} made by another process could not be read "
                                  f"({first_line(e)}); run the same command again")

    def pieces_made(self, p: PendingLine) -> bool:
        """Whether every piece of a shared line has its file (each is written
        whole or not at all)."""
        return all(self._piece_path(p, i).is_file() for i in range(len(p.pieces)))

    def remove_pieces(self, p: PendingLine) -> None:
        for i in range(len(p.pieces)):
            with contextlib.suppress(OSError):
                self._piece_path(p, i).unlink()


def joined_audio(pieces: list[np.ndarray], settings: Settings, model_rate: int) -> np.ndarray:
    """A line's audio at ``settings.sample_rate``: its pieces (made at
    ``model_rate``) with ``piece_pause`` seconds of silence between them,
    resampled where the rates differ."""
    if len(pieces) > 1:
        pause = np.zeros(round(settings.piece_pause * model_rate), np.float32)
        joined = [pieces[0]]
        for piece in pieces[1:]:
            joined += [pause, piece]
        pieces = [np.concatenate(joined)]
    return resample(pieces[0], model_rate, settings.sample_rate)


class _MadeElsewhere(Exception):
    """A shared line's piece that failed on another process (its reason)."""


def failure_reason(e: Exception) -> str:
    """The engine's SynthesisError and _MadeElsewhere say it in one line already."""
    from tts_cli.engine import SynthesisError   # loaded: a result came from it
    if isinstance(e, (SynthesisError, _MadeElsewhere)):
        return str(e)
    return f"synthesis failed: {first_line(e)}"


def verdict(results: list[Result], max_steps: int, caution: str | None = None) -> tuple[str, str | None]:
    """A made line's status and reason: ``truncated`` when a piece reached
    max_decoder_steps, ``suspect`` when the text holds what the voice cannot
    say (``caution``), or, where the run checks what the decoder made, a
    piece stopped too soon to be heard (MIN_SPEECH_FRAMES) or its kept
    attempt fails the alignment checks; else ``ok``."""
    def where(pieces: list[int]) -> str:
        return f" (piece {', '.join(map(str, pieces))} of {len(results)})" if len(results) > 1 else ""
    cut = [n for n, r in enumerate(results, start=1) if r.truncated]
    if cut:
        return "truncated", f"reached max_decoder_steps ({max_steps}) without the stop gate firing{where(cut)}"
    short = [n for n, r in enumerate(results, start=1) if r.checked is not None and r.frames < MIN_SPEECH_FRAMES]
    fewest = min((results[n - 1].frames for n in short), default=0)
    unheard = (f"no audible speech: the stop gate fired after {plural(fewest, 'frame')} "
               f"(fewer than {MIN_SPEECH_FRAMES}){where(short)}" if short else None)
    reason = None if any(r.checked is None for r in results) else suspicion([r.checked for r in results])
    reason = "; ".join(filter(None, (caution, unheard, reason)))
    return ("suspect", reason) if reason else ("ok", None)


def _alignment_record(results: list[Result], settings: Settings) -> dict | None:
    """The row's ``alignment``, when the run checks it."""
    if not settings.check_alignment or any(r.checked is None for r in results):
        return None
    return line_record([r.checked for r in results], settings)
