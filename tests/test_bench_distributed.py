"""``tts-batch bench`` end to end only: in one process (--end-to-end-only) and
over two torchrun processes on CPU with gloo, with tiny models in place of
the full-size random ones.

Run as a script, this file is one torchrun process of the bench: it puts the
tiny models in place and runs the ``tts-batch`` command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from test_distributed import free_port
from tiny_models import tiny_tacotron2, tiny_waveglow
from tts_cli import bench
from tts_cli.cli import main

LINES = [
    "LJ001-0001|Printing, in short.",
    "LJ001-0002|It cost $3.50.",
    "LJ001-0003|A longer line, in another batch.",
    "LJ001-0004|Hi.",
    "LJ001-0005|The last line.",
]
TABLE_HEADER = "| measure | value |"


def tiny_random_models(device, seed=0):
    """Same seed, same weights: every process builds the same models, as
    bench's own do (on any device: they are not the full-size ones)."""
    return tiny_tacotron2(seed), tiny_waveglow(seed)


def corpus_file(tmp_path):
    path = tmp_path / "corpus.csv"
    path.write_text("".join(f"{line}\n" for line in LINES))
    return path


def bench_arguments(corpus, json_path):
    return ["bench", "--device", "cpu", "--batch-size", "2", "--corpus", str(corpus),
            "--json", str(json_path)]


def bench_in_one_process(monkeypatch, corpus, json_path):
    monkeypatch.setattr(bench, "random_models", tiny_random_models)
    result = CliRunner().invoke(main, [*bench_arguments(corpus, json_path), "--end-to-end-only"])
    assert result.exit_code == 0, result.output
    return result.output, json.loads(json_path.read_text())


def bench_under_torchrun(processes, corpus, json_path):
    """``torchrun --nproc_per_node=N`` of this file: (exit status, all output)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__,
               *bench_arguments(corpus, json_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_end_to_end_only_measures_the_corpus_run_and_nothing_else(tmp_path, monkeypatch):
    output, result = bench_in_one_process(monkeypatch, corpus_file(tmp_path), tmp_path / "one.json")
    assert result["processes"] == 1 and result["lines"] == len(LINES)
    assert result["audio_seconds"] > 0
    assert result["audio_seconds_per_second_per_process"] == result["audio_seconds_per_second"]
    # the single-GPU measures (each a separate run) are skipped
    assert "gpu_busy_fraction" not in result and "baseline_audio_seconds_per_second" not in result
    assert "| audio seconds per wall second per process |" in output
    assert "GPU busy" not in output and "naive batch-1 loop" not in output


def test_the_bench_states_what_a_thousand_hours_of_audio_cost_in_gpu_hours(tmp_path, monkeypatch):
    # 1,000 h of audio at s audio seconds per second per GPU take 1,000 / s GPU-hours
    output, result = bench_in_one_process(monkeypatch, corpus_file(tmp_path), tmp_path / "one.json")
    cost = result["gpu_hours_per_1000_audio_hours"]
    assert cost * result["audio_seconds_per_second_per_process"] == pytest.approx(1000)
    assert f"| GPU-hours per 1,000 hours of audio | {cost:.2f} |" in output


def test_two_processes_share_the_corpus_and_rank_0_alone_reports(tmp_path, monkeypatch):
    corpus = corpus_file(tmp_path)
    _, alone = bench_in_one_process(monkeypatch, corpus, tmp_path / "one.json")
    code, output = bench_under_torchrun(2, corpus, tmp_path / "two.json")
    assert code == 0, output
    together = json.loads((tmp_path / "two.json").read_text())
    assert together["processes"] == 2 and together["lines"] == len(LINES)
    # each line's length is fixed, so the audio made does not depend on who made it
    assert abs(together["audio_seconds"] - alone["audio_seconds"]) < 1e-6
    assert abs(together["audio_seconds_per_second_per_process"]
               - together["audio_seconds_per_second"] / 2) < 1e-9
    assert output.count(TABLE_HEADER) == 1, output
    assert output.count("bench: under torchrun only the end-to-end run is measured") == 1, output


if __name__ == "__main__":
    bench.random_models = tiny_random_models
    main(prog_name="tts-batch")


def test_the_whole_bench_runs_on_cpu_and_its_stage_rates_add_up(tmp_path, monkeypatch):
    """Plain ``tts-batch bench`` on CPU (tiny models): every measure that does
    not need CUDA is there and the GPU-only ones read n/a; the end-to-end
    rate's share of WaveGlow alone and the speed-up over the naive loop are
    the ratios of the rates the table prints."""
    monkeypatch.setattr(bench, "random_models", tiny_random_models)
    json_path = tmp_path / "all.json"
    result = CliRunner().invoke(main, [*bench_arguments(corpus_file(tmp_path), json_path),
                                       "--baseline-lines", "2"])
    assert result.exit_code == 0, result.output
    r = json.loads(json_path.read_text())
    assert r["lines"] == len(LINES) and r["audio_seconds"] > 0 and r["baseline_lines"] == 2
    assert r["decoder_ms_per_step_batch1"] > 0 and r["waveglow_alone_audio_seconds_per_second"] > 0
    assert r["waveglow_executed_tflops"] < r["waveglow_tflops"]     # the folded path runs on CPU too
    assert r["end_to_end_share_of_waveglow_alone"] == \
        r["audio_seconds_per_second"] / r["waveglow_alone_audio_seconds_per_second"]
    assert r["speedup_over_baseline"] == r["audio_seconds_per_second"] / r["baseline_audio_seconds_per_second"]
    assert r["flac_16khz_share_of_wav"] == \
        r["audio_seconds_per_second_flac_16khz"] / r["audio_seconds_per_second_checked_again"]
    assert "| 16 kHz FLAC as a share of WAV |" in result.output
    assert "| end to end as a share of WaveGlow alone |" in result.output
    assert "| GPU busy (steady state: middle half of a 4-batch window) | n/a |" in result.output
