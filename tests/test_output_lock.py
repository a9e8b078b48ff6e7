"""One run at a time per output directory: a second run (an overlapping cron
job, say) ends at once in one line and touches nothing; the lock goes with
its holder, however that ends."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from test_distributed import finished, torchrun
from tts_cli import output_lock
from tts_cli.cli import main

LINES = ["The first line.", "A second line, a little longer."]


def arguments(tmp_path, out, checkpoints):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{line}\n" for line in LINES))
    tacotron2, waveglow = checkpoints
    return [str(corpus), "-o", str(out), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow),
            "--device", "cpu", "--seed", "1", "--quiet"]


def test_a_second_run_on_a_busy_directory_ends_in_one_line_and_touches_nothing(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    with output_lock.held(out):
        result = CliRunner().invoke(main, arguments(tmp_path, out, tiny_checkpoints))
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert "being written by another tts-batch run" in result.output
        assert f"pid {os.getpid()}" in result.output and "use another -o" in result.output
        assert sorted(p.name for p in out.iterdir()) == [output_lock.LOCK_NAME]
    # Once the holder is done, the same command runs.
    result = CliRunner().invoke(main, arguments(tmp_path, out, tiny_checkpoints))
    assert result.exit_code == 0, result.output
    assert len(list((out / "wavs").glob("*.wav"))) == len(LINES)


def test_a_killed_holder_leaves_the_directory_free(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from tts_cli import output_lock\n"
         "with output_lock.held(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)", str(out)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        busy = CliRunner().invoke(main, arguments(tmp_path, out, tiny_checkpoints))
        assert busy.exit_code == 2 and f"pid {holder.pid}" in busy.output
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    result = CliRunner().invoke(main, arguments(tmp_path, out, tiny_checkpoints))
    assert result.exit_code == 0, result.output


def test_under_torchrun_every_process_stops_when_the_directory_is_busy(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    with output_lock.held(out):
        code, output = finished(torchrun(2, arguments(tmp_path, out, tiny_checkpoints)))
    assert code != 0
    assert "being written by another tts-batch run" in output
    assert not (out / "wavs").exists() and not (out / "manifest.jsonl").exists()
