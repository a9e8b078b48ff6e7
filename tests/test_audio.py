"""Tests for tts_cli.audio: WAV/mel files that read back as written, never half-written."""

from __future__ import annotations

import errno
import os
import warnings

import numpy as np
import pytest
import soundfile as sf

from tts_cli import audio
from tts_cli.audio import SAMPLE_FORMATS, atomic_write, resample, write_audio, write_mel


def files_in(directory) -> list[str]:
    return sorted(os.listdir(directory))


# --- WAV round trip ---------------------------------------------------------------------------

def test_pcm16_round_trip_keeps_length_rate_and_values(tmp_path):
    path = tmp_path / "utt.wav"
    samples = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 0.25], dtype=np.float32)
    clipped = write_audio(path, samples, 22050)
    info = sf.info(path)
    assert (info.samplerate, info.channels, info.frames, info.subtype, info.format) == (22050, 1, 6, "PCM_16", "WAV")
    read_back, rate = sf.read(path, dtype="int16")
    assert rate == 22050
    assert read_back.tolist() == [0, 16384, -16384, 32767, -32767, 8192]
    assert clipped == 0


def test_pcm16_is_the_default_and_float32_keeps_exact_values(tmp_path):
    samples = np.linspace(-0.9, 0.9, 1000).astype(np.float32)
    write_audio(tmp_path / "default.wav", samples, 16000)
    assert sf.info(tmp_path / "default.wav").subtype == "PCM_16"

    path = tmp_path / "float.wav"
    assert write_audio(path, samples, 16000, "float32") == 0
    read_back, rate = sf.read(path, dtype="float32")
    assert sf.info(path).subtype == "FLOAT" and rate == 16000
    np.testing.assert_array_equal(read_back, samples)


def test_float32_never_renormalizes_or_clips_loud_or_quiet_audio(tmp_path):
    samples = np.array([1.5, -2.0, 0.001, -0.001], dtype=np.float32)
    path = tmp_path / "loud.wav"
    assert write_audio(path, samples, 22050, "float32") == 0
    read_back, _ = sf.read(path, dtype="float32")
    np.testing.assert_array_equal(read_back, samples)


def test_pcm16_clamps_out_of_range_samples_instead_of_wrapping_and_counts_them(tmp_path):
    path = tmp_path / "clipped.wav"
    samples = np.array([1.5, -1.5, 0.5, 1.0, -1.0, 1.0000001, 40.0], dtype=np.float64)
    clipped = write_audio(path, samples, 22050)
    as_int, _ = sf.read(path, dtype="int16")
    # A wrapped 1.5 would come back negative: an audible click.
    assert as_int.tolist() == [32767, -32768, 16384, 32767, -32767, 32767, 32767]
    as_float, _ = sf.read(path, dtype="float64")
    assert as_float[0] == 32767 / 32768
    assert as_float[1] == -1.0
    assert clipped == 4  # every sample with |x| > 1.0: 1.5, -1.5, 1.0000001 and 40.0


def test_pcm16_in_range_audio_reports_no_clipping(tmp_path):
    samples = np.sin(np.linspace(0, 100, 22050)).astype(np.float32)  # peaks at exactly +-1.0 or below
    assert write_audio(tmp_path / "sine.wav", samples, 22050) == 0


def test_empty_audio_writes_a_valid_empty_wav(tmp_path):
    path = tmp_path / "empty.wav"
    assert write_audio(path, np.zeros(0, dtype=np.float32), 22050) == 0
    assert sf.info(path).frames == 0


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("sample_format", SAMPLE_FORMATS)
def test_non_finite_audio_is_rejected_and_nothing_is_written(tmp_path, bad_value, sample_format):
    path = tmp_path / "bad.wav"
    samples = np.array([0.1, bad_value, 0.2], dtype=np.float32)
    with pytest.raises(ValueError, match="NaN or infinite") as error:
        write_audio(path, samples, 22050, sample_format)
    assert str(path) in str(error.value)
    assert files_in(tmp_path) == []


def test_float64_too_large_for_float32_is_rejected_not_written_as_inf(tmp_path):
    with pytest.raises(ValueError, match="NaN or infinite"):
        write_audio(tmp_path / "big.wav", np.array([1e300]), 22050, "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the one clear error, no numpy overflow warning before it
        with pytest.raises(ValueError, match="NaN or infinite"):
            write_audio(tmp_path / "big.wav", np.array([1e300]), 22050, "float32")


def test_the_lowest_sample_rate_accepted_is_1_hz(tmp_path):
    write_audio(tmp_path / "slow.wav", np.zeros(3), 1)
    assert sf.info(str(tmp_path / "slow.wav")).samplerate == 1


@pytest.mark.parametrize("shape", [(2, 100), (1, 100), ()])
def test_non_mono_shapes_are_rejected(tmp_path, shape):
    with pytest.raises(ValueError, match="1-D"):
        write_audio(tmp_path / "x.wav", np.zeros(shape, dtype=np.float32), 22050)


def test_integer_audio_is_rejected_because_its_scale_is_unknown(tmp_path):
    with pytest.raises(ValueError, match="floating point"):
        write_audio(tmp_path / "x.wav", np.array([100, -100], dtype=np.int16), 22050)


@pytest.mark.parametrize("rate", [0, -22050, 22050.0, True])
def test_bad_sample_rate_is_rejected(tmp_path, rate):
    with pytest.raises(ValueError, match="sample rate"):
        write_audio(tmp_path / "x.wav", np.zeros(10, dtype=np.float32), rate)


def test_unknown_sample_format_lists_the_choices(tmp_path):
    with pytest.raises(ValueError) as error:
        write_audio(tmp_path / "x.wav", np.zeros(10, dtype=np.float32), 22050, "pcm12")
    assert all(choice in str(error.value) for choice in SAMPLE_FORMATS)
    assert str(error.value) == "unknown sample format 'pcm12'; use one of: pcm16, pcm24, float32"


def test_unknown_audio_format_lists_the_choices(tmp_path):
    with pytest.raises(ValueError) as error:
        write_audio(tmp_path / "x.mp3", np.zeros(10, dtype=np.float32), 22050, "pcm16", "mp3")
    assert str(error.value) == "unknown audio format 'mp3'; use one of: wav, flac"
    assert files_in(tmp_path) == []


def test_parent_directories_are_created(tmp_path):
    path = tmp_path / "out" / "wavs" / "utt.wav"
    write_audio(path, np.zeros(10, dtype=np.float32), 22050)
    assert sf.info(path).frames == 10


# --- atomic writes ------------------------------------------------------------------------------

def test_successful_write_leaves_only_the_final_file(tmp_path):
    write_audio(tmp_path / "utt.wav", np.zeros(10, dtype=np.float32), 22050)
    write_mel(tmp_path / "utt.npy", np.zeros((80, 5)))
    assert files_in(tmp_path) == ["utt.npy", "utt.wav"]


def test_failed_wav_write_leaves_no_temp_file_and_no_final_file(tmp_path, monkeypatch):
    real_open = open

    class HalfWritten:
        def __init__(self, path, mode):
            self.file = real_open(path, mode)

        def write(self, data):
            self.file.write(bytes(data)[:6])   # a truncated header, as when the disk fills up
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr(audio, "open", HalfWritten, raising=False)
    with pytest.raises(audio.WriteError, match="No space left on device") as error:
        write_audio(tmp_path / "utt.wav", np.zeros(10, dtype=np.float32), 22050)
    # named by the file the user asked for, not the temporary one
    assert error.value.filename == str(tmp_path / "utt.wav") and error.value.errno == errno.ENOSPC
    assert files_in(tmp_path) == []


def test_a_libsndfile_failure_is_a_write_error_naming_the_file(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise sf.LibsndfileError(2, prefix="Error writing: ")

    monkeypatch.setattr(audio.sf, "write", fail)
    with pytest.raises(audio.WriteError) as error:
        write_audio(tmp_path / "utt.wav", np.zeros(10, dtype=np.float32), 22050)
    assert error.value.filename == str(tmp_path / "utt.wav")
    assert error.value.strerror == "libsndfile: Error writing: System error."
    assert files_in(tmp_path) == []


def test_failed_rewrite_keeps_the_previous_complete_file(tmp_path, monkeypatch):
    path = tmp_path / "utt.wav"
    write_audio(path, np.full(10, 0.5, dtype=np.float32), 22050)

    def fail(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(audio.sf, "write", fail)
    with pytest.raises(RuntimeError):
        write_audio(path, np.zeros(99, dtype=np.float32), 22050)
    assert files_in(tmp_path) == ["utt.wav"]
    assert sf.info(path).frames == 10


def test_atomic_write_uses_a_hidden_temp_file_in_the_target_directory(tmp_path):
    target = tmp_path / "sub" / "file.txt"
    with atomic_write(target) as temp_path:
        assert temp_path.parent == target.parent
        assert temp_path.name.startswith(".") and temp_path.name != target.name
        temp_path.write_text("complete")
        assert not target.exists()  # nothing under the final name until the block ends
    assert target.read_text() == "complete"
    assert files_in(target.parent) == ["file.txt"]


def test_atomic_write_replaces_an_existing_file(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("old")
    with atomic_write(target) as temp_path:
        temp_path.write_text("new")
    assert target.read_text() == "new"


def test_atomic_write_cleans_up_on_keyboard_interrupt(tmp_path):
    target = tmp_path / "file.txt"
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(target) as temp_path:
            temp_path.write_text("partial")
            raise KeyboardInterrupt
    assert files_in(tmp_path) == []


def test_a_file_is_flushed_to_disk_before_its_rename_and_the_rename_after(tmp_path, monkeypatch):
    # so a power cut leaves the old file or the whole new one, never a renamed empty one
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.fstat(fd).st_ino)) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda src, dst: events.append(("rename", os.stat(src).st_ino)) or replace(src, dst))
    target = tmp_path / "a.wav"
    write_audio(target, np.zeros(10), 1000)
    written = target.stat().st_ino
    assert events == [("fsync", written), ("rename", written), ("fsync", tmp_path.stat().st_ino)]


# --- mel -------------------------------------------------------------------------------------

def test_mel_round_trip_is_float32_with_shape_n_mel_by_frames(tmp_path):
    path = tmp_path / "mels" / "utt.npy"
    mel = np.random.default_rng(0).standard_normal((80, 123))
    write_mel(path, mel)
    loaded = np.load(path)
    assert loaded.dtype == np.float32 and loaded.shape == (80, 123)
    np.testing.assert_array_equal(loaded, mel.astype(np.float32))
    assert files_in(path.parent) == ["utt.npy"]  # no 'utt.npy.<pid>.tmp.npy' left by np.save


def test_mel_must_be_two_dimensional(tmp_path):
    with pytest.raises(ValueError, match=r"\[n_mel, frames\]") as error:
        write_mel(tmp_path / "utt.npy", np.zeros((1, 80, 10)))
    assert str(error.value).startswith(f"{tmp_path / 'utt.npy'}: ")   # the file it was to be
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("to_rate", [16000, 8000, 44100])
def test_resampling_keeps_what_fits_the_new_rate_and_removes_what_does_not(to_rate):
    """A tone below the lower rate's Nyquist frequency keeps its level within
    0.1 dB; one above it (on the way down) is attenuated by at least 150 dB,
    as libsoxr's very high quality does (its high quality leaves about
    140 dB); the length scales with the rate."""
    from_rate = 22050
    t = np.arange(2 * from_rate) / from_rate
    low = 0.5 * np.sin(2 * np.pi * 1000 * t).astype(np.float32)
    out = resample(low, from_rate, to_rate)
    assert out.dtype == np.float32 and abs(len(out) - 2 * to_rate) <= 1
    middle = out[len(out) // 4: 3 * len(out) // 4]          # away from the edges' transients
    level_db = 20 * np.log10(np.sqrt(np.mean(middle ** 2)) / (0.5 / np.sqrt(2)))
    assert abs(level_db) < 0.1
    if to_rate < from_rate:
        high = 0.5 * np.sin(2 * np.pi * (to_rate / 2 + 1500) * t).astype(np.float32)
        gone = resample(high, from_rate, to_rate)[to_rate // 2: -to_rate // 2]
        assert 20 * np.log10(np.sqrt(np.mean(gone.astype(np.float64) ** 2)) / (0.5 / np.sqrt(2))) < -150


def test_the_same_rate_is_left_alone():
    audio = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert resample(audio, 22050, 22050) is audio


@pytest.mark.parametrize("audio_format", ["wav", "flac"])
@pytest.mark.parametrize("sample_format, bits", [("pcm16", 16), ("pcm24", 24)])
def test_integer_samples_are_the_audio_rounded_to_their_bits_in_either_file(tmp_path, audio_format,
                                                                            sample_format, bits):
    """WAV or FLAC, 16 or 24 bits: each stored sample is the audio times full
    scale (2^(bits-1) - 1), rounded; beyond it, clamped to the format's range
    and counted, never wrapped."""
    audio = np.sin(np.linspace(0, 200, 5000)).astype(np.float32) * 0.9
    audio[10], audio[20] = 1.5, -1.5
    path = tmp_path / f"x.{audio_format}"
    clipped = write_audio(path, audio, 16000, sample_format, audio_format)
    stored, rate = sf.read(path, dtype="int32")          # the samples in the top bits of an int32
    info = sf.info(path)
    assert clipped == 2 and rate == 16000 and info.format == audio_format.upper()
    assert info.subtype == f"PCM_{bits}"
    full = 2 ** (bits - 1) - 1
    expected = np.clip(np.rint(audio.astype(np.float64) * full), -full - 1, full).astype(np.int64) << (32 - bits)
    assert np.array_equal(stored, expected)


def test_flac_refuses_float_samples(tmp_path):
    with pytest.raises(ValueError) as error:
        write_audio(tmp_path / "x.flac", np.zeros(10, np.float32), 22050, "float32", "flac")
    assert str(error.value) == "FLAC stores integer samples: use sample format pcm16 or pcm24"
    assert not (tmp_path / "x.flac").exists()
