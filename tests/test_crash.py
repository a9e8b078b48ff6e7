"""Killing a real run: SIGKILL at several points, SIGINT and SIGTERM. The
output directory must stay valid and a re-run must end where one
uninterrupted run ends."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner

from tiny_models import HOP
from outputs import assert_same_output
from tts_cli.cli import main
from tts_cli.manifest import read_manifest

STEPS = 30
LINES = 24


@pytest.fixture(scope="module")
def slow_checkpoints(never_stopping_checkpoints, tmp_path_factory):
    """Corpus and checkpoints for a run that lasts long enough to be killed
    in the middle: every line decodes STEPS frames."""
    corpus = tmp_path_factory.mktemp("slow") / "corpus.txt"
    corpus.write_text("".join(f"Sentence number {i} of the corpus, spoken slowly.\n" for i in range(LINES)))
    return (corpus, *never_stopping_checkpoints)


def arguments(setup, out):
    corpus, tacotron2, waveglow = setup
    return [str(corpus), "-o", str(out), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow),
            "--device", "cpu", "--max-decoder-steps", str(STEPS), "--batch-size", "2", "--seed", "7",
            "--sample-format", "float32", "--quiet"]


def start(setup, out, *extra):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen([sys.executable, "-m", "tts_cli", *arguments(setup, out), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_wavs(process, out, count, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        wavs = out / "wavs"
        if (out / "manifest.jsonl").exists() and sum(1 for p in wavs.glob("*.wav")) >= count:
            return
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before {count} WAVs: {process.stderr.read()}"


def assert_valid(out, killed=None):
    """What a user finds after the kill: no temp file (but the killed run's
    own, which the next run removes), every WAV whole, and a manifest (if
    any yet) that parses, one row per corpus line."""
    assert [p.name for p in out.rglob("*.tmp") if f".{killed}.tmp" not in p.name] == []
    for wav in (out / "wavs").glob("*.wav") if (out / "wavs").is_dir() else []:
        assert sf.info(str(wav)).frames == STEPS * HOP, f"{wav.name} is truncated"
    if (out / "manifest.jsonl").exists():
        assert len(read_manifest(out / "manifest.jsonl")) == LINES



@pytest.fixture(scope="module")
def reference(slow_checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "out"
    result = CliRunner().invoke(main, arguments(slow_checkpoints, out))
    assert result.exit_code == 0, result.output
    return out


# Kill points: the first manifest just written (models loaded, no WAV yet),
# after the first WAVs, past the middle.
@pytest.mark.parametrize("wavs_before_kill", [0, 2, LINES * 2 // 3])
def test_sigkill_at_any_point_leaves_a_valid_directory_that_a_rerun_completes(
        slow_checkpoints, reference, tmp_path, wavs_before_kill):
    out = tmp_path / "out"
    process = start(slow_checkpoints, out)
    wait_for_wavs(process, out, wavs_before_kill)
    process.kill()
    process.wait()
    assert_valid(out, killed=process.pid)
    result = CliRunner().invoke(main, arguments(slow_checkpoints, out))
    assert result.exit_code == 0, result.output
    assert_valid(out)
    assert_same_output(out, reference)


def one_clean_line(stderr):
    """What a cron log gets: one line, no traceback, no abort message."""
    assert "Traceback" not in stderr and "terminate called" not in stderr, stderr
    assert stderr.count("\n") == 1, stderr
    return stderr


@pytest.mark.parametrize("first, then", [(signal.SIGINT, None), (signal.SIGTERM, None),
                                         (signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM),
                                         (signal.SIGINT, signal.SIGTERM)])
def test_any_number_of_signals_end_the_run_cleanly_with_the_first_signals_status(
        slow_checkpoints, reference, tmp_path, first, then):
    # The first signal writes what is decoded, saves and says how to resume. A
    # second one (or torchrun's SIGTERM after a Ctrl-C) used to abort the
    # process: exit status 134 and "terminate called without an active
    # exception", the engine's threads still running.
    out = tmp_path / "out"
    process = start(slow_checkpoints, out)
    wait_for_wavs(process, out, 2)
    process.send_signal(first)
    time.sleep(0.05)
    while then is not None and process.poll() is None:   # as fast as a user can hit Ctrl-C
        process.send_signal(then)
        time.sleep(0.02)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + first, stderr
    assert signal.Signals(first).name in one_clean_line(stderr) and "run the same command again" in stderr
    assert_valid(out)
    rows = read_manifest(out / "manifest.jsonl")
    done = [r for r in rows if r["status"] == "truncated"]
    assert 2 <= len(done) < LINES, "the run neither kept its finished lines nor stopped early"
    # what it did not reach is unfinished, not failed
    assert {r["status"] for r in rows if r not in done} == {"pending"}
    # Every WAV on disk has its row: the files in flight were written and recorded.
    assert sorted(p.stem for p in (out / "wavs").glob("*.wav")) == sorted(r["id"] for r in done)
    result = CliRunner().invoke(main, arguments(slow_checkpoints, out)[:-1])
    assert result.exit_code == 0 and f"{len(done)} reused" in result.output
    assert_same_output(out, reference)


def test_signals_before_the_models_are_loaded_end_the_run_the_same_way(slow_checkpoints, tmp_path):
    out = tmp_path / "out"
    process = start(slow_checkpoints, out)
    deadline = time.monotonic() + 60
    while not (out / ".tts-batch.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "SIGTERM received" in one_clean_line(stderr)
    assert_valid(out)


@pytest.fixture
def small_filesystem(tmp_path):
    """A mount point for a 2 MB tmpfs (``mount(options)``), where this
    machine lets the tests mount one (as root); skipped elsewhere."""
    point = tmp_path / "small"
    point.mkdir()
    mounted = []

    def mount(options="size=2m"):
        if shutil.which("mount") is None:
            pytest.skip("no mount command here")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_real_full_disk_ends_in_one_line_and_a_rerun_with_space_finishes(
        slow_checkpoints, reference, small_filesystem):
    # On a 2 MB tmpfs the write used to fail inside libsndfile ("System
    # error.", not an OSError): a traceback, then an abort.
    disk = small_filesystem()
    filler = disk / "filler"
    with open(filler, "wb") as f:   # leave room for the manifest and a few WAVs
        f.write(bytes(os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - 120_000))
    out = disk / "out"
    process = start(slow_checkpoints, out)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr
    assert re.search(rf"cannot write {re.escape(str(out))}/\S+: No space left on device; free disk space",
                     one_clean_line(stderr))
    assert_valid(out)
    for row in read_manifest(out / "manifest.jsonl"):   # no row vouches for a missing file
        assert row["status"] in ("error", "pending") or sf.info(str(out / row["audio_filepath"])).frames == row["num_samples"]
    filler.unlink()
    result = CliRunner().invoke(main, arguments(slow_checkpoints, out))
    assert result.exit_code == 0, result.output
    assert_same_output(out, reference)


def test_a_run_whose_first_file_cannot_be_written_leaves_the_folder_as_it_found_it(
        slow_checkpoints, small_filesystem):
    """Room for the manifest, none for a WAV: no manifest of pending rows is
    left behind (in a new folder, the folder is gone again)."""
    disk = small_filesystem()
    with open(disk / "filler", "wb") as f:
        f.write(bytes(os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - 16_000))
    out = disk / "out"
    process = start(slow_checkpoints, out)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr
    assert "No space left on device" in one_clean_line(stderr)
    assert not out.exists()


def test_a_read_only_file_system_ends_in_one_line_before_any_work(slow_checkpoints, small_filesystem):
    disk = small_filesystem("ro,size=1m")
    process = start(slow_checkpoints, disk / "out")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr
    assert f"cannot write {disk / 'out'}: Read-only file system" in one_clean_line(stderr)
    assert "remount it writable or choose another -o" in stderr


@pytest.mark.parametrize("forced_by", ["option", "recipe"])
def test_the_advice_after_a_stopped_force_run_keeps_what_it_made(slow_checkpoints, tmp_path, forced_by):
    """Ctrl-C during a --force run (or one whose recipe sets force): the
    command it gives to finish is the same one without --force (with
    --no-force), and running it reuses the lines already made."""
    out = tmp_path / "out"
    (tmp_path / "forced.yaml").write_text("force: true\n")
    process = start(slow_checkpoints, out, *{"option": ["--force"],
                                             "recipe": ["--recipe", str(tmp_path / "forced.yaml")]}[forced_by])
    wait_for_wavs(process, out, 2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    said = {"option": "without --force", "recipe": "with --no-force (the recipe sets force)"}[forced_by]
    advice = one_clean_line(stderr).split(f"run the same command again {said}: tts-batch ", 1)[1].strip()
    assert "--force" not in shlex.split(advice)
    kept = {path.name: path.stat().st_mtime_ns for path in (out / "wavs").glob("*.wav")}
    assert len(kept) >= 2
    again = subprocess.run([sys.executable, "-m", "tts_cli", *shlex.split(advice)], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert again.returncode == 0, again.stderr
    made = [r for r in read_manifest(out / "manifest.jsonl") if r["status"] == "truncated"]
    assert len(made) == LINES
    assert all((out / "wavs" / name).stat().st_mtime_ns == made_at for name, made_at in kept.items())
