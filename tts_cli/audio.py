"""Write synthesized audio and mel spectrograms to disk, atomically.

Every file goes through ``atomic_write``: the data is written to a hidden
temporary file next to the target, flushed to disk, and only then renamed
onto the final name. A run that is killed (Ctrl-C, OOM killer, pre-emption)
therefore never leaves a truncated WAV under a name that looks finished,
which matters because a resumed run skips files that already exist.

A write that fails (no space, permissions, a read-only or failing disk)
raises ``WriteError``, an OSError naming the final file and the cause, and
leaves no temporary file. libsndfile only encodes, into memory: writing
through it, a full disk came back as ``LibsndfileError: System error.``,
neither an OSError nor saying which error it was.
"""

from __future__ import annotations

import io
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import soundfile as sf

from tts_cli.formats import AUDIO_FORMATS, FLAC_SAMPLE_FORMATS, SAMPLE_FORMATS

# libsndfile's subtype and the bits of each integer sample format.
_PCM = {"pcm16": ("PCM_16", 16), "pcm24": ("PCM_24", 24)}


class WriteError(OSError):
    """A file could not be written: ``filename`` is its final name (not the
    temporary one), ``errno`` and ``strerror`` the cause (``errno`` None
    when libsndfile failed)."""


def write_audio(path: str | os.PathLike, audio: np.ndarray, sample_rate: int,
                sample_format: str = "pcm16", audio_format: str = "wav") -> int:
    """Write mono ``audio`` (floats, nominally in [-1, 1]) at ``path`` as a
    WAV or FLAC file (``audio_format``), atomically (``encode_audio`` says
    how). Returns the number of samples clipped."""
    data, clipped = encode_audio(audio, sample_rate, sample_format, audio_format, path)
    with atomic_write(path) as temp_path:
        with open(temp_path, "wb") as audio_file:
            audio_file.write(data)
    return clipped


def encode_audio(audio: np.ndarray, sample_rate: int, sample_format: str, audio_format: str,
                 name: str | os.PathLike) -> tuple[bytes, int]:
    """Mono ``audio`` (floats, nominally in [-1, 1]) as the bytes of a WAV or
    FLAC file (``audio_format``), and the number of samples that were
    clipped: for ``pcm16`` and ``pcm24`` the samples with magnitude above
    1.0, which are clamped to full scale; for ``float32`` (WAV only) always
    0, because float WAV stores the values unchanged. ``name`` names the
    file in errors.
    """
    if sample_format not in SAMPLE_FORMATS:
        raise ValueError(f"unknown sample format {sample_format!r}; use one of: {', '.join(SAMPLE_FORMATS)}")
    if audio_format not in AUDIO_FORMATS:
        raise ValueError(f"unknown audio format {audio_format!r}; use one of: {', '.join(AUDIO_FORMATS)}")
    if audio_format == "flac" and sample_format not in FLAC_SAMPLE_FORMATS:
        raise ValueError(f"FLAC stores integer samples: use sample format {' or '.join(FLAC_SAMPLE_FORMATS)}")
    _check_sample_rate(sample_rate, name)
    samples = _as_mono_float(audio, name)
    if sample_format in _PCM:
        _check_finite(samples, name)
        data, clipped = _to_pcm(samples, sample_format)
        subtype = _PCM[sample_format][0]
    else:
        # Never renormalize: a quiet or loud utterance must stay as the model made it.
        # Checked after the cast: a huge float64 value becomes inf in float32,
        # so the overflow warning is silenced here and reported as an error below.
        with np.errstate(over="ignore"):
            data, clipped = samples.astype(np.float32), 0
        _check_finite(data, name)
        subtype = "FLOAT"
    encoded = io.BytesIO()
    try:
        sf.write(encoded, data, sample_rate, subtype=subtype, format=audio_format.upper())
    except sf.SoundFileError as e:
        raise WriteError(None, f"libsndfile: {e}", os.fspath(name)) from e
    return encoded.getvalue(), clipped


def _to_pcm(samples: np.ndarray, sample_format: str) -> tuple[np.ndarray, int]:
    """Convert float samples to integers with clamping; return (pcm, clipped count).

    Done here rather than by libsndfile because libsndfile, unless clipping is
    switched on, wraps out-of-range floats around, turning a sample at 1.5 into
    a full-scale negative click instead of a clipped peak. 24-bit samples go
    to libsndfile as int32 with the low byte zero, which it stores exactly.
    """
    _, bits = _PCM[sample_format]
    full_scale = 2 ** (bits - 1) - 1   # +1.0 and -1.0 symmetric; the most negative only by clamping
    samples = np.asarray(samples, dtype=np.float64)
    clipped = int(np.count_nonzero(np.abs(samples) > 1.0))
    pcm = np.clip(np.rint(samples * full_scale), -full_scale - 1, full_scale)
    if bits == 16:
        return pcm.astype(np.int16), clipped
    return pcm.astype(np.int32) << (32 - bits), clipped


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``audio`` (float32, mono) at ``to_rate``: the same sound, band-limited
    to the lower rate's Nyquist frequency, by libsoxr at its very high
    quality (python-soxr); unchanged where the rates agree."""
    if from_rate == to_rate:
        return audio
    import soxr   # only for a run that asks for another rate
    return soxr.resample(np.ascontiguousarray(audio, dtype=np.float32), from_rate, to_rate,
                         quality="VHQ").astype(np.float32, copy=False)


def write_mel(path: str | os.PathLike, mel: np.ndarray) -> None:
    """Write a mel spectrogram ``[n_mel, frames]`` as a float32 ``.npy`` file."""
    data = encode_mel(mel, path)
    with atomic_write(path) as temp_path:
        with open(temp_path, "wb") as mel_file:
            mel_file.write(data)


def encode_mel(mel: np.ndarray, name: str | os.PathLike) -> bytes:
    """A mel spectrogram ``[n_mel, frames]`` as the bytes of a float32
    ``.npy`` file; ``name`` names the file in errors."""
    array = np.asarray(mel, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"{os.fspath(name)}: mel must be 2-D [n_mel, frames], got shape {array.shape}")
    encoded = io.BytesIO()
    np.save(encoded, array, allow_pickle=False)
    return encoded.getvalue()


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``.

    The caller writes the complete file to the yielded path. When the block
    finishes, the file is fsynced and renamed onto ``path`` with
    ``os.replace`` (atomic on POSIX and Windows within one directory). If the
    block raises, including KeyboardInterrupt, the temporary file is removed
    and ``path`` is left as it was; an OSError comes out as ``WriteError``
    naming ``path``. Parent directories are created as needed.
    """
    final_path = Path(path)
    # Same directory, so the rename never crosses a file system; hidden, so an
    # abandoned one (after SIGKILL) is not mistaken for output; the pid keeps
    # concurrent processes writing the same name from sharing a temp file.
    temp_path = final_path.with_name(f".{final_path.name}.{os.getpid()}.tmp")
    try:
        final_path.parent.mkdir(parents=True, exist_ok=True)
        yield temp_path
        _fsync_file(temp_path)
        os.replace(temp_path, final_path)
    except BaseException as e:
        _remove_if_present(temp_path)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(e.errno, e.strerror or str(e), os.fspath(final_path)) from e
        raise
    _fsync_directory(final_path.parent)


def _check_sample_rate(sample_rate: int, path: str | os.PathLike) -> None:
    """Reject a sample rate that would produce an unplayable or mislabeled file."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise ValueError(f"{os.fspath(path)}: sample rate must be a positive integer, got {sample_rate!r}")


def _as_mono_float(audio: np.ndarray, path: str | os.PathLike) -> np.ndarray:
    """Return ``audio`` as a 1-D float64 array, or raise if it is not mono float audio."""
    array = np.asarray(audio)
    if array.ndim != 1:
        raise ValueError(f"{os.fspath(path)}: audio must be 1-D (mono), got shape {array.shape}")
    # Integer audio has no agreed full scale (int16? int32?), so guessing would
    # risk writing noise; the synthesizer always produces floats.
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{os.fspath(path)}: audio must be floating point in [-1, 1], got dtype {array.dtype}")
    return array.astype(np.float64, copy=False)


def _check_finite(samples: np.ndarray, path: str | os.PathLike) -> None:
    """Last guard: NaN or inf would become silence or full-scale noise in the file."""
    bad = int(np.count_nonzero(~np.isfinite(samples)))
    if bad:
        raise ValueError(f"{os.fspath(path)}: audio has {bad} NaN or infinite samples; refusing to write it")


def _fsync_file(path: Path) -> None:
    """Force the file's data to disk so the rename never exposes unwritten blocks."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_directory(directory: Path) -> None:
    """Best effort: persist the rename itself; not possible on every OS/file system."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _remove_if_present(path: Path) -> None:
    """Delete a temporary file, ignoring that it may never have been created
    (or cannot be removed either: the write's own error is the one to tell)."""
    try:
        os.unlink(path)
    except OSError:
        pass
