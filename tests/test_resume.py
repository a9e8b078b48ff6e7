"""Never lose a line, in process: resume, out-of-memory retries, full disks,
long lines. (Killing a real process: test_crash.py.)"""
import dataclasses
import errno
import io
import os
import re
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner

from outputs import manifest, assert_same_output, mtimes
from tts_cli import audio
from tts_cli.cli import main
from tts_cli.config import Settings
from tts_cli.engine import Engine
from tiny_models import HOP

LINES = [
    "Printing, in the only sense with which we are at present concerned.",
    "It cost $3.50 in 1963.",
    "A much longer line, which goes on and on, so that it lands in another batch.",
    "Hi.",
    "...!?",
    "The last line of the first corpus.",
]


def synth(corpus, out, checkpoints, *extra, seed=("--seed", "1")):
    tacotron2, waveglow = checkpoints
    args = [str(corpus), "-o", str(out), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow),
            "--device", "cpu", "--max-decoder-steps", "12", "--batch-size", "2",
            "--sample-format", "float32", "--no-check-alignment", *seed, *extra]
    return CliRunner().invoke(main, args)



def write(tmp_path, lines, name="corpus.txt"):
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return path




def leftovers(out):
    return [p for p in out.rglob("*") if p.name.endswith(".tmp")]


# --- resume ------------------------------------------------------------------------------------

def test_a_rerun_synthesizes_only_added_lines_and_ends_as_one_run_would(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    assert synth(write(tmp_path, LINES[:4]), out, tiny_checkpoints).exit_code == 0
    before = mtimes(out)
    result = synth(write(tmp_path, LINES), out, tiny_checkpoints)
    assert result.exit_code == 0, result.output
    assert "4 reused" in result.output
    after = mtimes(out)
    assert all(after[name] == stamp for name, stamp in before.items()), "a finished WAV was redone"
    assert set(after) - set(before) == {"000006.wav"}
    reference = tmp_path / "reference"
    assert synth(tmp_path / "corpus.txt", reference, tiny_checkpoints).exit_code == 0
    assert_same_output(out, reference)


def test_nothing_left_to_do_loads_no_model(tmp_path, tiny_checkpoints, monkeypatch):
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES)
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    monkeypatch.setattr("tts_cli.loading.load_engine", lambda *a: pytest.fail("models loaded"))
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 0 and "nothing to do: 6 lines: 5 ok, 1 skipped; 5 reused" in result.output


def test_changed_settings_force_and_damaged_wavs_are_redone(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES)
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    assert "0 reused" in synth(corpus, out, tiny_checkpoints, "--sigma", "0.5").output
    assert "5 reused" in synth(corpus, out, tiny_checkpoints, "--sigma", "0.5").output
    assert "0 reused" in synth(corpus, out, tiny_checkpoints, "--sigma", "0.5", "--force").output
    wav = out / "wavs" / "000002.wav"
    wav.write_bytes(wav.read_bytes()[:100])          # cut short by hand
    (out / "wavs" / "000003.wav").unlink()
    result = synth(corpus, out, tiny_checkpoints, "--sigma", "0.5")
    assert "3 reused" in result.output
    assert sf.info(str(wav)).frames == manifest(out)[1]["num_samples"] > 0


def test_a_rerun_removes_the_temporary_files_of_a_killed_run(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES[:2])
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    dead = 2 ** 22 + 12345      # above Linux's pid_max: no such process
    stale = [out / "wavs" / f".000001.wav.{dead}.tmp", out / f".manifest.jsonl.{dead}.tmp"]
    for path in stale:
        path.write_bytes(b"RIFF")
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    assert leftovers(out) == []


def test_a_plain_rerun_keeps_the_recorded_random_seed(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES)
    assert synth(corpus, out, tiny_checkpoints, seed=()).exit_code == 0
    seed = manifest(out)[0]["seed"]
    result = synth(corpus, out, tiny_checkpoints, seed=())
    assert "5 reused" in result.output and f"seed {seed} (from the existing manifest)" in result.output
    assert "0 reused" in synth(corpus, out, tiny_checkpoints, seed=("--seed", str(seed + 1))).output


def test_a_damaged_manifest_is_one_line_naming_it(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES[:2])
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    (out / "manifest.jsonl").write_text('{"id": "000001", "li')
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "manifest.jsonl:1" in result.output and "--force" in result.output


def test_a_row_damaged_past_its_id_is_named_by_its_line_when_its_line_is_planned(tmp_path, tiny_checkpoints):
    # earlier rows are indexed by the id their line starts with and read
    # when planned: a damage further on still names the manifest's line
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES)
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    lines = (out / "manifest.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3] = lines[3][:40] + "\n"
    (out / "manifest.jsonl").write_text("".join(lines), encoding="utf-8")
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "manifest.jsonl:4: not valid JSON" in result.output


# --- mels --------------------------------------------------------------------------------------

def mel_files_and_rows(out):
    """(the mel files on disk, the ones the manifest's rows point at), by name."""
    pointed = [r["mel_filepath"] for r in manifest(out) if r["mel_filepath"]]
    return sorted(p.name for p in (out / "mels").iterdir()), sorted(Path(m).name for m in pointed)


def test_a_rerun_without_save_mels_keeps_the_mels_and_one_with_it_again_redoes_nothing(
        tmp_path, tiny_checkpoints):
    # The re-run without --save-mels wrote mel_filepath null into every kept
    # row, so the mels were pointed at by nothing and the next run with
    # --save-mels made every line again.
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES)
    assert synth(corpus, out, tiny_checkpoints, "--save-mels").exit_code == 0
    wavs, mels = mtimes(out), mtimes(out, "mels")
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 0 and "nothing to do: 6 lines: 5 ok, 1 skipped; 5 reused" in result.output, result.output
    on_disk, pointed = mel_files_and_rows(out)
    assert len(pointed) == 5 and on_disk == pointed
    again = synth(corpus, out, tiny_checkpoints, "--save-mels")
    assert again.exit_code == 0 and "5 reused" in again.output, again.output
    assert mtimes(out) == wavs and mtimes(out, "mels") == mels


def test_a_line_made_again_without_save_mels_leaves_no_mel_of_its_old_audio(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    assert synth(write(tmp_path, LINES), out, tiny_checkpoints, "--save-mels").exit_code == 0
    changed = [*LINES[:3], "A new fourth line.", *LINES[4:]]
    result = synth(write(tmp_path, changed), out, tiny_checkpoints)
    assert result.exit_code == 0 and "4 reused" in result.output, result.output
    assert manifest(out)[3]["mel_filepath"] is None
    on_disk, pointed = mel_files_and_rows(out)
    assert "000004.npy" not in on_disk and on_disk == pointed


def test_a_missing_or_damaged_mel_is_not_vouched_for_and_save_mels_makes_its_line_again(
        tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES)
    assert synth(corpus, out, tiny_checkpoints, "--save-mels").exit_code == 0
    (out / "mels" / "000001.npy").unlink()
    damaged = out / "mels" / "000002.npy"
    damaged.write_bytes(damaged.read_bytes()[:-8])       # cut short by hand
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 0 and "nothing to do: 6 lines: 5 ok, 1 skipped; 5 reused" in result.output, result.output
    assert [r["mel_filepath"] for r in manifest(out)[:3]] == [None, None, "mels/000003.npy"]
    result = synth(corpus, out, tiny_checkpoints, "--save-mels")
    assert result.exit_code == 0 and "3 reused" in result.output, result.output
    for row in manifest(out)[:2]:
        assert np.load(out / row["mel_filepath"]).shape[1] == row["mel_frames"] > 0


# --- out of GPU memory -------------------------------------------------------------------------

def fail_when(monkeypatch, method, too_big):
    """Make an engine stage raise CUDA's out-of-memory error for some batches."""
    original = getattr(Engine, method)

    def patched(self, jobs, *args):
        if too_big(jobs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, jobs, *args)
    monkeypatch.setattr(Engine, method, patched)


@pytest.mark.parametrize("method", ["decode_only", "_vocode_launch"])   # the decoder, WaveGlow
def test_out_of_memory_splits_the_batch_and_the_audio_is_unchanged(tmp_path, tiny_checkpoints,
                                                                    monkeypatch, method):
    corpus = write(tmp_path, LINES)
    assert synth(corpus, tmp_path / "reference", tiny_checkpoints, "--batch-size", "4").exit_code == 0
    fail_when(monkeypatch, method, lambda jobs: len(jobs) > 1)
    result = synth(corpus, tmp_path / "out", tiny_checkpoints, "--batch-size", "4")
    assert result.exit_code == 0, result.output
    assert_same_output(tmp_path / "out", tmp_path / "reference")


def test_a_small_waveglow_memory_budget_slices_batches_without_changing_audio_or_keys(
        tmp_path, tiny_checkpoints, monkeypatch):
    corpus = write(tmp_path, LINES)
    assert synth(corpus, tmp_path / "reference", tiny_checkpoints, "--batch-size", "4").exit_code == 0
    sliced = []
    real_vocode = Engine._vocode
    monkeypatch.setattr(Engine, "_vocode", lambda self, mel, *rest: sliced.append(mel.shape[0])
                        or real_vocode(self, mel, *rest))
    # A budget below one line's rows: WaveGlow runs one line at a time.
    result = synth(corpus, tmp_path / "out", tiny_checkpoints, "--batch-size", "4",
                   "--waveglow-memory", "0.000001")
    assert result.exit_code == 0, result.output
    assert set(sliced) == {1}
    assert_same_output(tmp_path / "out", tmp_path / "reference")
    # The budget decides memory, not audio: a re-run under another one keeps every line.
    again = synth(corpus, tmp_path / "out", tiny_checkpoints, "--batch-size", "4")
    assert again.exit_code == 0 and "5 reused" in again.output, again.output


def test_only_a_line_that_fails_alone_is_an_error(tmp_path, tiny_checkpoints, monkeypatch):
    corpus = write(tmp_path, LINES)
    from tts_cli.text import normalize
    doomed = normalize(LINES[2])[0]
    # WaveGlow fails on any group holding the line: queued early, then down the halving path
    fail_when(monkeypatch, "_vocode_launch", lambda jobs: any(j.ids == doomed for j in jobs))
    result = synth(corpus, tmp_path / "out", tiny_checkpoints, "--batch-size", "4")
    assert result.exit_code == 1
    rows = manifest(tmp_path / "out")
    assert rows[2]["status"] == "error" and "out of GPU memory" in rows[2]["reason"]
    assert [r["status"] for i, r in enumerate(rows) if i not in (2, 4)] == ["ok"] * 4
    monkeypatch.undo()
    again = synth(corpus, tmp_path / "out", tiny_checkpoints, "--batch-size", "4")
    assert again.exit_code == 0 and "4 reused" in again.output


# --- disk and permissions ----------------------------------------------------------------------

class FailingDisk:
    """The third file of a kind (``.wav`` or ``.npy``) fails to be written, as
    ``how`` says: at the temporary file's open (EACCES, EROFS), half-way
    through its data (ENOSPC), at its fsync (EIO), or in libsndfile."""

    def __init__(self, monkeypatch, how, suffix):
        self.how, self.suffix, self.seen, self.lock = how, suffix, 0, threading.Lock()
        real_open, real_fsync, real_encode = open, audio._fsync_file, sf.write
        self.real_open = real_open

        def failing_open(file, mode="r", *args, **kwargs):
            if "w" in mode and self._fails(file, ("EACCES", "EROFS", "ENOSPC")):
                if how != "ENOSPC":
                    raise OSError(getattr(errno, how), os.strerror(getattr(errno, how)), str(file))
                return _FillsUp(real_open(file, mode, *args, **kwargs))
            return real_open(file, mode, *args, **kwargs)

        def failing_fsync(path):
            if self._fails(path, ("EIO",)):
                raise OSError(errno.EIO, os.strerror(errno.EIO))   # as os.fsync: no file name
            real_fsync(path)

        def failing_encode(file, *args, **kwargs):
            if how == "libsndfile" and self._count():
                raise sf.LibsndfileError(2, prefix="Error writing: ")
            real_encode(file, *args, **kwargs)

        monkeypatch.setattr(audio, "open", failing_open, raising=False)
        monkeypatch.setattr(audio, "_fsync_file", failing_fsync)
        monkeypatch.setattr(audio.sf, "write", failing_encode)

    def _fails(self, path, kinds) -> bool:
        return self.how in kinds and f"{self.suffix}." in Path(path).name and self._count()

    def _count(self) -> bool:
        with self.lock:
            self.seen += 1
            return self.seen == 3


class _FillsUp:
    """A file that takes half of what is written, then the disk is full."""

    def __init__(self, file):
        self.file = file

    def write(self, data):
        self.file.write(bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


@pytest.mark.parametrize("how, suffix, advice", [
    ("ENOSPC", ".wav", "free disk space"), ("EACCES", ".wav", "fix the permissions"),
    ("EIO", ".wav", "I/O error"), ("EROFS", ".wav", "read-only"),
    ("libsndfile", ".wav", "free disk space or fix the permissions"),
    ("ENOSPC", ".npy", "free disk space")])
def test_a_failed_write_ends_in_one_line_keeps_every_written_row_and_no_partial_file(
        tmp_path, tiny_checkpoints, monkeypatch, how, suffix, advice):
    corpus = write(tmp_path, LINES)
    out = tmp_path / "out"
    FailingDisk(monkeypatch, how, suffix)
    result = synth(corpus, out, tiny_checkpoints, "--batch-size", "1", "--quiet", "--save-mels")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    # the file that failed under its final name, the cause, and what to do
    assert re.search(rf"cannot write {re.escape(str(out))}/(wavs|mels)/\d{{6}}\{suffix}: ", result.output)
    cause = "libsndfile: Error writing: System error." if how == "libsndfile" else os.strerror(getattr(errno, how))
    assert cause in result.output and advice in result.output
    assert "run the same command again" in result.output
    assert leftovers(out) == []
    rows = manifest(out)
    done = [r for r in rows if r["status"] == "ok"]
    assert len(done) == 2 and all(sf.info(str(out / r["audio_filepath"])).frames == r["num_samples"]
                                  for r in done)
    # every file on disk has its row: none is left that no row vouches for
    assert sorted(p.name for p in (out / "wavs").iterdir()) == sorted(r["id"] + ".wav" for r in done)
    assert sorted(p.name for p in (out / "mels").iterdir()) == sorted(r["id"] + ".npy" for r in done)
    monkeypatch.undo()
    again = synth(corpus, out, tiny_checkpoints, "--batch-size", "1", "--save-mels")
    assert again.exit_code == 0 and "2 reused" in again.output


def manifest_fills_the_disk(monkeypatch):
    """Every save of the manifest after the first fails: no space left."""
    from tts_cli import journal
    saves, real_write_manifest_lines = [], journal.write_manifest_lines

    def full_after_first(path, lines):
        if saves:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        saves.append(path)
        real_write_manifest_lines(path, lines)
    monkeypatch.setattr(journal, "write_manifest_lines", full_after_first)


def test_a_disk_full_while_the_journal_keeps_rows_ends_the_run_in_one_line_and_a_rerun_finishes(
        tmp_path, tiny_checkpoints, monkeypatch):
    # the rows' JSON lines wait in a spool in the output folder; a full disk
    # there is the output's, said as any failed write is
    from tts_cli import journal
    corpus, out = write(tmp_path, LINES), tmp_path / "out"
    real = journal.tempfile.TemporaryFile

    class Full:
        def __init__(self, *args, **kwargs):
            self.file = real(*args, **kwargs)

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.file, name)
    monkeypatch.setattr(journal.tempfile, "TemporaryFile", Full)
    result = synth(corpus, out, tiny_checkpoints, "--quiet")
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "No space left on device" in result.output
    monkeypatch.undo()
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    assert synth(corpus, tmp_path / "fresh", tiny_checkpoints).exit_code == 0
    assert [row["status"] for row in manifest(out)] == [row["status"] for row in manifest(tmp_path / "fresh")]


def test_a_failed_write_leaves_no_engine_thread_running(tmp_path, tiny_checkpoints, monkeypatch):
    # The run-ending error used to leave the engine's threads running when the
    # manifest could not be saved, and the process aborted after the line.
    from tts_cli import journal
    manifest_fills_the_disk(monkeypatch)
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    result = synth(write(tmp_path, LINES * 3), tmp_path / "out", tiny_checkpoints, "--quiet")
    assert result.exit_code == 2 and "No space left on device" in result.output
    assert not [t for t in threading.enumerate() if t.name.startswith("tts-") and t.is_alive()]


def test_a_manifest_that_cannot_be_saved_keeps_the_last_one_and_says_so(tmp_path, tiny_checkpoints,
                                                                          monkeypatch):
    corpus = write(tmp_path, LINES)
    out = tmp_path / "out"
    manifest_fills_the_disk(monkeypatch)
    result = synth(corpus, out, tiny_checkpoints, "--quiet")
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "manifest.jsonl" in result.output and "No space left on device" in result.output
    assert len(manifest(out)) == len(LINES) and leftovers(out) == []
    monkeypatch.undo()
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0


def test_an_output_directory_that_cannot_be_made_is_one_line(tmp_path, tiny_checkpoints):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = synth(write(tmp_path, LINES[:2]), blocker / "out", tiny_checkpoints, "--quiet")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "cannot write" in result.output and "a-file" in result.output


# --- long lines --------------------------------------------------------------------------------

LONG = ("The first sentence is here, and it is not short at all. The second one follows it; "
        "it has clauses too. Then a third sentence closes the line.")


def test_a_long_line_is_cut_and_joined_with_pauses_into_one_wav(tmp_path, tiny_checkpoints):
    corpus = write(tmp_path, [LONG, "Short."])
    result = synth(corpus, tmp_path / "cut", tiny_checkpoints, "--max-symbols-per-piece", "60",
                   "--piece-pause", "0.1")
    assert result.exit_code == 0, result.output
    long_row, short_row = manifest(tmp_path / "cut")
    assert long_row["pieces"] == 3 and short_row["pieces"] == 1
    pause = round(0.1 * 22050)
    assert long_row["num_samples"] == long_row["mel_frames"] * HOP + 2 * pause
    audio = sf.read(tmp_path / "cut" / long_row["audio_filepath"], dtype="float32")[0]
    assert len(audio) == long_row["num_samples"]
    whole = synth(corpus, tmp_path / "whole", tiny_checkpoints, "--max-symbols-per-piece", "0")
    assert whole.exit_code == 0 and manifest(tmp_path / "whole")[0]["pieces"] == 1
    # Changing the limit changes the long line's key only.
    again = synth(corpus, tmp_path / "cut", tiny_checkpoints, "--max-symbols-per-piece", "110",
                  "--piece-pause", "0.1")
    assert "1 reused" in again.output and manifest(tmp_path / "cut")[0]["pieces"] == 2


def test_a_cut_line_that_hits_the_step_limit_is_kept_as_truncated_naming_the_pieces(
        tmp_path, never_stopping_checkpoints):
    result = synth(write(tmp_path, [LONG]), tmp_path / "out", never_stopping_checkpoints,
                   "--max-symbols-per-piece", "60")
    assert result.exit_code == 0, result.output
    (row,) = manifest(tmp_path / "out")
    assert row["status"] == "truncated" and row["pieces"] == 3
    assert "max_decoder_steps (12)" in row["reason"] and "piece 1, 2, 3 of 3" in row["reason"]
    assert sf.info(str(tmp_path / "out" / row["audio_filepath"])).frames == row["num_samples"]


def test_resume_keys_need_neither_the_engine_nor_the_voice_loader():
    # The voice is resolved once per run and handed to resume; resume
    # importing the engine and the voice loader resolved it again and again.
    import subprocess
    import sys
    code = "import sys, tts_cli.resume; print(sorted(m for m in ('tts_cli.engine', 'tts_cli.voice') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- what the key covers -----------------------------------------------------------------------

# config.NOT_IN_THE_RESUME_KEY names the settings that cannot change a
# line's audio or which attempt it keeps, and why. Every other setting must
# change the key (the test below), so a new option fails it until it is
# given a value here or listed there.
# Another valid value for each setting the key must cover.
OTHER_VALUES = {
    "sample_rate": 16000, "sigma": 0.5, "denoiser_strength": 0.02, "max_decoder_steps": 999,
    "gate_threshold": 0.6, "prenet_dropout": 0.4, "sample_format": "float32", "audio_format": "flac",
    "check_alignment": False,
    "retries": 3, "min_coverage": 0.7, "min_focus": 0.45, "max_forward_jump": 9, "max_backward_jump": 7,
    "end_margin": 4, "max_frames_per_symbol": 14.0,
    "text_normalization": "reference",   # the same ids in both modes here: the rows still differ
}


def a_voice(**changes):
    from tts_cli.voice import Voice
    voice = Voice(tacotron2=None, waveglow=None, fingerprint={"tacotron2": "a" * 64, "waveglow": "b" * 64},
                  device="cpu", precision="fp32", label="test")
    return dataclasses.replace(voice, **changes)


def test_every_setting_changes_the_resume_key_unless_listed_as_not_changing_audio():
    from tts_cli.config import NOT_IN_THE_RESUME_KEY as NOT_IN_THE_KEY, Settings
    from tts_cli.resume import audio_identity, line_key
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert set(NOT_IN_THE_KEY) | set(OTHER_VALUES) == fields, "classify every setting: in the key or not"
    assert not set(NOT_IN_THE_KEY) & set(OTHER_VALUES)
    key = lambda settings: line_key([[5, 6, 7]], "line1", 1, audio_identity(settings, a_voice()), 0.15)
    base = Settings()
    unchanged = [name for name, value in OTHER_VALUES.items()
                 if key(dataclasses.replace(base, **{name: value})) == key(base)]
    assert unchanged == [], f"these settings change audio but not the resume key: {unchanged}"


def test_the_keys_of_finished_lines_do_not_change_when_the_code_does():
    """Keys are compared with keys an earlier version wrote: a change to how
    the key is made (a setting's name in the record, the record's layout,
    the hash) makes every user's next run remake every line it finds. These
    are the keys of two lines as this version writes them; when a change to
    what decides a line's audio must change them, write the new ones here and
    say so in the release notes."""
    from tts_cli.config import Settings
    from tts_cli.resume import audio_identity, line_key
    assert line_key([[5, 6, 7]], "line1", 1, audio_identity(Settings(), a_voice()), 0.15) == \
        "d8b3c36e2cee99734507d14f3e4261b47eff7ad2897488baca6d6f1e9773827c"
    unchecked = audio_identity(Settings(check_alignment=False, sample_rate=16000), a_voice())
    assert line_key([[5, 6], [7]], "line1", 1, unchecked, 0.15) == \
        "736dbeeed49e314bc5c04b673187185786b25197ce0b437f706b07ef36f9d964"


@pytest.mark.parametrize("change", [{"fingerprint": {"tacotron2": "c" * 64, "waveglow": "b" * 64}},
                                    {"fingerprint": {"tacotron2": "a" * 64, "waveglow": "c" * 64}},
                                    {"device": "cuda"}, {"precision": "fp16"}])
def test_the_models_device_and_precision_change_the_key(change):
    from tts_cli.config import Settings
    from tts_cli.resume import audio_identity, line_key
    key = lambda voice: line_key([[5, 6]], "x", 1, audio_identity(Settings(), voice), 0.15)
    assert key(a_voice(**change)) != key(a_voice())


def test_the_seed_ids_and_cut_change_the_key_and_the_pause_only_that_of_a_cut_line():
    from tts_cli.config import Settings
    from tts_cli.resume import audio_identity, line_key
    identity = audio_identity(Settings(), a_voice())
    key = lambda pieces=([5, 6, 7],), line_id="x", seed=1, pause=0.15: line_key(
        [list(p) for p in pieces], line_id, seed, identity, pause)
    assert len({key(), key(seed=2), key(line_id="y"), key(pieces=([5, 6, 8],)),
                key(pieces=([5, 6], [7]))}) == 5
    assert key(pause=0.3) == key(), "one piece: no pause to change"
    assert key(pieces=([5, 6], [7]), pause=0.3) != key(pieces=([5, 6], [7]))


# --- what a re-run vouches for ------------------------------------------------------------------

def verdict(tmp_path, mel=np.zeros((80, 7), dtype=np.float32), **changes):
    """reusable_row's verdict on a finished line whose WAV (100 samples at
    1,000 Hz) is whole, with ``mel`` saved as its mel and ``changes`` made to
    its manifest row."""
    from tts_cli.corpus import Utterance
    from tts_cli.manifest import ManifestRow
    from tts_cli.resume import reusable_row
    audio.write_audio(tmp_path / "wavs" / "a.wav", np.zeros(100), 1000)
    (tmp_path / "mels").mkdir(exist_ok=True)
    np.save(tmp_path / "mels" / "a.npy", mel)
    row = ManifestRow(id="a", line=1, text="Hi.", normalized_text="hi.", audio_filepath="wavs/a.wav",
                      duration=0.1, num_samples=100, mel_frames=7, status="ok", reason=None,
                      mel_filepath="mels/a.npy", key="k")
    return reusable_row({**dataclasses.asdict(row), **changes}, "k", Utterance(1, "a", "Hi."), tmp_path, Settings())


def test_a_kept_row_takes_the_line_number_and_text_the_corpus_has_now(tmp_path):
    from tts_cli.corpus import Utterance
    from tts_cli.resume import reusable_row
    old = dataclasses.asdict(verdict(tmp_path))
    kept = reusable_row(old, "k", Utterance(3, "a", "HI."), tmp_path, Settings())   # two lines added above
    assert (kept.line, kept.text, kept.normalized_text) == (3, "HI.", "hi.")


def test_a_row_that_says_its_audio_lasts_no_time_is_made_again(tmp_path):
    assert verdict(tmp_path).audio_filepath == "wavs/a.wav"
    assert verdict(tmp_path, duration=0.0) is None


def test_a_row_that_records_its_files_size_is_checked_by_it_and_one_without_by_the_header(tmp_path):
    assert verdict(tmp_path).audio_filepath == "wavs/a.wav"        # an older row: no size, the header read
    size = (tmp_path / "wavs" / "a.wav").stat().st_size
    assert verdict(tmp_path, audio_bytes=size).audio_filepath == "wavs/a.wav"
    assert verdict(tmp_path, audio_bytes=size + 1) is None
    from tts_cli.corpus import Utterance
    from tts_cli.resume import reusable_row
    kept = dataclasses.asdict(verdict(tmp_path, audio_bytes=size))
    (tmp_path / "wavs" / "a.wav").unlink()
    assert reusable_row(kept, "k", Utterance(1, "a", "Hi."), tmp_path, Settings()) is None, "a missing file"
    (tmp_path / "wavs" / "a.wav").mkdir()
    row = {"id": "a", "line": 1, "text": "Hi.", "normalized_text": "hi.", "audio_filepath": "wavs/a.wav",
           "duration": 0.1, "num_samples": 100, "mel_frames": 7, "status": "ok", "reason": None, "key": "k",
           "audio_bytes": (tmp_path / "wavs" / "a.wav").stat().st_size}
    assert reusable_row(row, "k", Utterance(1, "a", "Hi."), tmp_path, Settings()) is None, "a folder is no WAV"


def test_an_older_row_whose_audio_is_missing_or_unreadable_is_made_again(tmp_path):
    # rows without audio_bytes are checked by the header, which must be there to read
    assert verdict(tmp_path).audio_filepath == "wavs/a.wav"
    from tts_cli.corpus import Utterance
    from tts_cli.resume import reusable_row
    kept = dataclasses.asdict(verdict(tmp_path))
    assert kept["audio_bytes"] is None
    (tmp_path / "wavs" / "a.wav").write_bytes(b"RIFF")   # a WAV cut short after 4 bytes
    assert reusable_row(kept, "k", Utterance(1, "a", "Hi."), tmp_path, Settings()) is None, "an unreadable file"
    (tmp_path / "wavs" / "a.wav").unlink()
    assert reusable_row(kept, "k", Utterance(1, "a", "Hi."), tmp_path, Settings()) is None, "a missing file"


def test_rows_record_the_size_their_files_were_written_at(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    assert synth(write(tmp_path, LINES), out, tiny_checkpoints).exit_code == 0
    made = [row for row in manifest(out) if row["audio_filepath"]]
    assert made and all(row["audio_bytes"] == (out / row["audio_filepath"]).stat().st_size for row in made)


@pytest.mark.parametrize("mel", [np.zeros((80, 7), dtype=np.float64), np.zeros(7, dtype=np.float32)])
def test_a_mel_file_that_is_not_a_2d_float32_array_is_not_vouched_for(tmp_path, mel):
    assert verdict(tmp_path).mel_filepath == "mels/a.npy"
    kept = verdict(tmp_path, mel)
    assert kept.audio_filepath == "wavs/a.wav" and kept.mel_filepath is None


# --- ... and in the webdataset layout, where the files are members of tar shards

SHARD = "shards/shard-000001.tar"
WAV = audio.encode_audio(np.zeros(100), 1000, "pcm16", "wav", "a")[0]
MEL = audio.encode_mel(np.zeros((80, 7), dtype=np.float32), "a")


def write_shard(out_dir, members):
    """shards/shard-000001.tar in ``out_dir``, holding ``members`` (name: bytes)."""
    (out_dir / "shards").mkdir(parents=True)
    with tarfile.open(out_dir / SHARD, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def shard_verdict(out_dir, line_id="a", save_mels=False, **changes):
    """reusable_row's verdict, in the webdataset layout, on a finished line
    whose row names ``<key>.wav`` (of WAV's size) and ``<key>.npy`` in SHARD,
    with ``changes`` made to the row."""
    from tts_cli.corpus import Utterance
    from tts_cli.manifest import ManifestRow
    from tts_cli.resume import reusable_row
    key = line_id.replace(".", "_")
    row = ManifestRow(id=line_id, line=1, text="Hi.", normalized_text="hi.", audio_filepath=f"{SHARD}/{key}.wav",
                      duration=0.1, num_samples=100, mel_frames=7, status="ok", reason=None,
                      mel_filepath=f"{SHARD}/{key}.npy", key="k", audio_bytes=len(WAV))
    settings = Settings(layout="webdataset", save_mels=save_mels)
    return reusable_row({**dataclasses.asdict(row), **changes}, "k", Utterance(1, line_id, "Hi."), out_dir, settings)


def test_a_line_whose_members_are_whole_in_their_shard_is_kept_with_its_mel(tmp_path):
    write_shard(tmp_path, {"a.wav": WAV, "a.json": b"{}", "a.npy": MEL, "a_1.wav": WAV, "a_1.npy": MEL})
    kept = shard_verdict(tmp_path, save_mels=True)
    assert (kept.audio_filepath, kept.mel_filepath) == (f"{SHARD}/a.wav", f"{SHARD}/a.npy")
    kept = shard_verdict(tmp_path, "a.1")                        # a member's key has no "."
    assert (kept.audio_filepath, kept.mel_filepath) == (f"{SHARD}/a_1.wav", f"{SHARD}/a_1.npy")


@pytest.mark.parametrize("members, changes", [
    ({"a.wav": WAV}, {"audio_bytes": len(WAV) + 1}),                      # not the size it was written at
    ({"a.wav": WAV}, {"audio_bytes": None}),                              # a size to check it by is needed
    ({"a.wav": WAV, "b.wav": WAV}, {"audio_filepath": f"{SHARD}/b.wav"}),  # another line's audio
    ({"a.flac": WAV}, {"audio_filepath": f"{SHARD}/a.flac"}),              # not the run's --audio-format
    ({"b.wav": WAV}, {}),                                                 # not in the shard
    (None, {}),                                                           # the shard is gone
    ({"a.wav": WAV}, {"audio_filepath": "shards/a.wav"}),                 # no shard named
])
def test_a_line_whose_audio_is_not_the_whole_member_its_row_names_is_made_again(tmp_path, members, changes):
    if members is not None:
        write_shard(tmp_path, members)
    assert shard_verdict(tmp_path, **changes) is None


@pytest.mark.parametrize("members, changes", [
    ({}, {}),                                                    # the mel is not in the shard
    ({"b.npy": MEL}, {"mel_filepath": f"{SHARD}/b.npy"}),          # another line's mel
    ({"a.npy": MEL}, {"mel_filepath": None}),                     # the row names none
])
def test_a_line_whose_mel_is_not_in_its_shard_keeps_its_audio_unless_mels_are_asked_for(tmp_path, members,
                                                                                         changes):
    write_shard(tmp_path, {"a.wav": WAV, **members})
    kept = shard_verdict(tmp_path, **changes)
    assert (kept.audio_filepath, kept.mel_filepath) == (f"{SHARD}/a.wav", None)
    assert shard_verdict(tmp_path, save_mels=True, **changes) is None


def test_the_seed_is_the_given_one_else_the_manifests_else_a_random_31_bit_one():
    from tts_cli.resume import run_seed
    assert run_seed(Settings(seed=5), {"a": {"seed": 9}}) == (5, "given")
    assert run_seed(Settings(), {"a": {"seed": None}, "b": {"seed": 9}}) == (9, "from the existing manifest")
    drawn = [run_seed(Settings(), {"a": {"seed": None}}) for _ in range(64)]
    assert {source for _, source in drawn} == {"random"}
    assert all(0 <= seed < 2 ** 31 for seed, _ in drawn) and max(seed for seed, _ in drawn) >= 2 ** 30


def test_a_stopped_torchrun_jobs_partial_manifests_are_read_without_a_manifest(tmp_path):
    from tts_cli.manifest import ManifestRow, write_manifest
    from tts_cli.resume import previous_rows
    row = dict(id="a", line=1, text="Hi.", normalized_text="hi.", audio_filepath="wavs/a.wav", duration=0.1,
               num_samples=100, mel_frames=7, status="ok", reason=None)
    write_manifest(tmp_path / "manifest.rank-0-of-2.jsonl", [ManifestRow(**row)])
    write_manifest(tmp_path / "manifest.rank-1-of-2.jsonl", [ManifestRow(**{**row, "id": "b", "line": 2})])
    assert sorted(previous_rows(tmp_path)) == ["a", "b"]


def test_an_empty_corpus_over_a_manifest_with_rows_is_refused_and_the_manifest_kept(tmp_path, tiny_checkpoints):
    """A cron job whose fetch failed pipes nothing in: the run says so,
    exit 2, and the manifest (and every line it vouches for) stays."""
    out = tmp_path / "out"
    assert synth(write(tmp_path, LINES[:2]), out, tiny_checkpoints).exit_code == 0
    before = (out / "manifest.jsonl").read_bytes()
    tacotron2, waveglow = tiny_checkpoints
    args = ["-", "-o", str(out), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow), "--device", "cpu"]
    empty = CliRunner().invoke(main, [*args, "-q"], input="")
    assert empty.exit_code == 2 and empty.output.count("\n") == 1, empty.output
    assert "the corpus has no lines" in empty.output and "holds 2 rows" in empty.output
    assert (out / "manifest.jsonl").read_bytes() == before
    forced = CliRunner().invoke(main, [*args, "-q", "--force"], input="")
    assert forced.exit_code == 0 and (out / "manifest.jsonl").read_bytes() == b""


def test_an_empty_corpus_into_a_new_folder_writes_nothing_and_names_no_manifest(tmp_path, tiny_checkpoints):
    tacotron2, waveglow = tiny_checkpoints
    out = tmp_path / "out"
    empty = CliRunner().invoke(main, ["-", "-o", str(out), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow),
                                      "--device", "cpu"], input="")
    assert empty.exit_code == 0 and not out.exists()
    assert "the corpus has no lines" in empty.output and "nothing written" in empty.output
    assert "manifest.jsonl" not in empty.output


def test_a_row_whose_field_has_the_wrong_type_is_one_line_naming_it(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    corpus = write(tmp_path, LINES[:2])
    assert synth(corpus, out, tiny_checkpoints).exit_code == 0
    lines = (out / "manifest.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[1] = re.sub(r'"duration": [0-9.]+', '"duration": "2.5"', lines[1])
    (out / "manifest.jsonl").write_text("".join(lines), encoding="utf-8")
    result = synth(corpus, out, tiny_checkpoints)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "manifest.jsonl:2: duration is '2.5', not float or int" in result.output
