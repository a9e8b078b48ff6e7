"""A long corpus read a window at a time (planning.READ_WINDOW): the first
batch starts once the first window is read, and the output is the one a
corpus read at once gives, resumed, interrupted or shared by torchrun. The
tests shrink the window to two lines."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import soundfile as sf

from outputs import assert_same_output, manifest
from test_distributed import CUT, LINES, arguments, finished, free_port, synth, write
from tts_cli import planning

WINDOW = 2
# Runs tts-batch with two-line windows: what the tests run under torchrun.
WINDOWED = f"""import sys
from tts_cli import planning
planning.READ_WINDOW = {WINDOW}
from tts_cli.cli import run
sys.argv[0] = "tts-batch"
run()
"""


def windowed_process(script, args, processes=None):
    """``WINDOWED`` in a process of its own, one CPU thread (as torchrun's
    processes have), or under torchrun with ``processes``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "OMP_NUM_THREADS": "1"}
    launcher = ([] if processes is None else
                ["-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--master_addr=127.0.0.1",
                 f"--master_port={free_port()}"])
    return subprocess.Popen([sys.executable, *launcher, str(script), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_corpus_read_a_window_at_a_time_gives_what_one_read_at_once_gives(tmp_path, tiny_checkpoints,
                                                                            monkeypatch):
    corpus = write(tmp_path / "corpus.txt", LINES + CUT)
    at_once = synth(arguments(corpus, tmp_path / "at-once", tiny_checkpoints))
    assert at_once.exit_code == 0, at_once.output
    read = []
    original = planning.read_window

    def reading(window, *args):
        read.append([u.line for u, _ in window])
        return original(window, *args)
    monkeypatch.setattr(planning, "READ_WINDOW", WINDOW)
    monkeypatch.setattr(planning, "read_window", reading)
    windowed = synth(arguments(corpus, tmp_path / "windowed", tiny_checkpoints))
    assert windowed.exit_code == 0, windowed.output
    # more lines to read than a window holds: all of them read two at a time, after the plan
    assert read == [[1, 2], [3, 4], [5, 6], [7, 8], [9]]
    # "...!?" (line 5) is found to say nothing only when its window is read
    assert "9 lines: 9 to do" in windowed.output and "9 lines: 8 to do" in at_once.output
    assert "1 skipped" in windowed.output and "8 ok" in windowed.output.replace("suspect", "ok")
    assert_same_output(tmp_path / "windowed", tmp_path / "at-once")
    again = synth(arguments(corpus, tmp_path / "windowed", tiny_checkpoints))
    assert again.exit_code == 0 and "8 reused" in again.output, again.output
    assert len(read) == 5, "a re-run reads no window: every line has its row"


def test_a_run_stopped_between_windows_leaves_every_line_a_row_and_a_rerun_finishes_it(
        tmp_path, tiny_checkpoints, monkeypatch):
    corpus = write(tmp_path / "corpus.txt", LINES + CUT)
    reference = synth(arguments(corpus, tmp_path / "reference", tiny_checkpoints))
    assert reference.exit_code == 0, reference.output
    original, calls = planning.read_window, []

    def interrupted(window, *args):
        calls.append(window)
        if len(calls) == 3:   # Ctrl-C while the third window is read, the first made
            os.kill(os.getpid(), signal.SIGINT)
        return original(window, *args)
    monkeypatch.setattr(planning, "READ_WINDOW", WINDOW)
    monkeypatch.setattr(planning, "read_window", interrupted)
    out = tmp_path / "out"
    stopped = synth(arguments(corpus, out, tiny_checkpoints))
    assert stopped.exit_code == 130, stopped.output
    rows = manifest(out)
    assert [r["line"] for r in rows] == list(range(1, 10)), "every corpus line has its row"
    # the first window made; lines of windows not read or not made wait, marked pending
    assert "pending" not in {r["status"] for r in rows[:2]} and rows[-1]["status"] == "pending"
    monkeypatch.setattr(planning, "read_window", original)
    finished_run = synth(arguments(corpus, out, tiny_checkpoints))
    assert finished_run.exit_code == 0, finished_run.output
    assert_same_output(out, tmp_path / "reference")


def test_two_processes_share_each_window_and_write_bitwise_what_one_process_writes(tmp_path, tiny_checkpoints):
    script = tmp_path / "windowed.py"
    script.write_text(WINDOWED)
    corpus = write(tmp_path / "corpus.txt", LINES + CUT)
    reference, out = tmp_path / "reference", tmp_path / "out"
    code, output = finished(windowed_process(script, arguments(corpus, reference, tiny_checkpoints)))
    assert code == 0, output
    code, output = finished(windowed_process(script, arguments(corpus, out, tiny_checkpoints), processes=2))
    assert code == 0, output
    assert "on 2 processes" in output and "9 lines: 9 to do" in output
    rows = manifest(out)
    assert rows == manifest(reference) and sum(r["pieces"] > 1 for r in rows) >= 3
    for row in rows:
        if row["audio_filepath"]:
            mine, theirs = (sf.read(folder / row["audio_filepath"], dtype="float32")[0] for folder in (out, reference))
            assert mine.tobytes() == theirs.tobytes(), row["id"]
    assert not list(out.glob("manifest.rank-*.jsonl")) and not (out / ".pieces").exists()
