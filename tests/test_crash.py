"""Killing a real run: SIGKILL at several points, SIGINT and SIGTERM. The
output directory must stay valid and a re-run must end where one
uninterrupted run ends."""
import os
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


def start(setup, out):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen([sys.executable, "-m", "tts_cli", *arguments(setup, out)], env=env,
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


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigint_and_sigterm_finish_in_flight_files_save_and_say_how_to_resume(
        slow_checkpoints, reference, tmp_path, signum, status):
    out = tmp_path / "out"
    process = start(slow_checkpoints, out)
    wait_for_wavs(process, out, 2)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == status, stderr
    assert "run the same command again" in stderr and signal.Signals(signum).name in stderr
    assert_valid(out)
    rows = read_manifest(out / "manifest.jsonl")
    done = [r for r in rows if r["status"] == "truncated"]
    assert 2 <= len(done) < LINES, "the run neither kept its finished lines nor stopped early"
    # Every WAV on disk has its row: in-flight files were written and recorded.
    assert sorted(p.stem for p in (out / "wavs").glob("*.wav")) == sorted(r["id"] for r in done)
    result = CliRunner().invoke(main, arguments(slow_checkpoints, out)[:-1])
    assert result.exit_code == 0 and f"{len(done)} reused" in result.output
    assert_same_output(out, reference)


def one_clean_line(stderr):
    """What a cron log gets: one line, no traceback, no abort message."""
    assert "Traceback" not in stderr and "terminate called" not in stderr, stderr
    assert stderr.count("\n") == 1, stderr
    return stderr


@pytest.mark.parametrize("first, then", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM),
                                         (signal.SIGINT, signal.SIGTERM)])
def test_any_number_of_signals_end_the_run_cleanly_with_the_first_signals_status(
        slow_checkpoints, reference, tmp_path, first, then):
    # A second Ctrl-C (or torchrun's SIGTERM after one) used to abort the
    # process: exit status 134 and "terminate called without an active
    # exception", the engine's threads still running.
    out = tmp_path / "out"
    process = start(slow_checkpoints, out)
    wait_for_wavs(process, out, 2)
    process.send_signal(first)
    time.sleep(0.05)
    while process.poll() is None:   # and more, as fast as a user can hit Ctrl-C
        process.send_signal(then)
        time.sleep(0.02)
    stderr = process.stderr.read()
    assert process.returncode == 128 + first, stderr
    assert signal.Signals(first).name in one_clean_line(stderr) and "run the same command again" in stderr
    assert_valid(out)
    rows = read_manifest(out / "manifest.jsonl")
    done = [r for r in rows if r["status"] == "truncated"]
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
