"""tts-batch end to end through click's CliRunner, on tiny checkpoints."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from outputs import manifest
from tts_cli.cli import main
from tiny_models import HOP

ROOT = Path(__file__).resolve().parent.parent

CORPUS = (
    "Printing, in the only sense with which we are at present concerned.\n"
    "\n"
    "It cost $3.50 in 1963.\n"
    "...!?\n"
    "A much longer line, which goes on and on, so that it lands in another batch than the short ones.\n"
    "Hi.\n"
)


def run(args, checkpoints, **kwargs):
    tacotron2, waveglow = checkpoints
    return CliRunner().invoke(main, [*args, "--tacotron2", str(tacotron2), "--waveglow", str(waveglow),
                                     "--device", "cpu", "--max-decoder-steps", "12", "--seed", "1",
                                     "--no-check-alignment", "--quiet"], **kwargs)



def test_every_line_gets_a_row_and_every_spoken_line_a_wav(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    out = tmp_path / "out"
    result = run([str(corpus), "-o", str(out), "--batch-size", "2", "--save-mels"], tiny_checkpoints)
    assert result.exit_code == 0, result.output
    rows = manifest(out)
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["id"] for r in rows] == ["000001", "000002", "000003", "000004", "000005", "000006"]
    assert [r["status"] for r in rows if r["line"] in (2, 4)] == ["skipped", "skipped"]
    assert rows[2]["normalized_text"] == "it cost three dollars, fifty cents in nineteen sixty-three."
    spoken = [r for r in rows if r["status"] in ("ok", "truncated")]
    assert len(spoken) == 4
    for r in spoken:
        audio, rate = sf.read(out / r["audio_filepath"], dtype="float32")
        assert rate == 22050
        assert len(audio) == r["num_samples"] == r["mel_frames"] * HOP
        assert r["duration"] == pytest.approx(r["num_samples"] / 22050, abs=1e-6)
        assert 1 <= r["mel_frames"] <= 12
        assert (r["status"] == "truncated") == (r["mel_frames"] == 12 and r["reason"] is not None)
        mel = np.load(out / r["mel_filepath"])
        assert mel.shape == (16, r["mel_frames"]) and mel.dtype == np.float32


def test_a_cut_lines_mel_is_its_pieces_mels_and_its_audio_has_the_pauses_besides(tmp_path, tiny_checkpoints):
    """What the README tells a user pairing mels with audio: the pauses are in the WAV alone."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One short sentence here. And then another one, a little longer.\n")
    out = tmp_path / "out"
    result = run([str(corpus), "-o", str(out), "--save-mels", "--max-symbols-per-piece", "30",
                  "--piece-pause", "0.1"], tiny_checkpoints)
    assert result.exit_code == 0, result.output
    [row] = manifest(out)
    assert row["pieces"] >= 2
    mel = np.load(out / row["mel_filepath"])
    assert mel.shape[1] == row["mel_frames"]
    assert row["num_samples"] == row["mel_frames"] * HOP + (row["pieces"] - 1) * round(0.1 * 22050)


def test_same_seed_same_audio_whatever_the_batch_size(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    for batch in ("1", "4"):
        result = run([str(corpus), "-o", str(tmp_path / batch), "--batch-size", batch,
                      "--sample-format", "float32"], tiny_checkpoints)
        assert result.exit_code == 0, result.output
    for row in manifest(tmp_path / "1"):
        if row["audio_filepath"]:
            one = sf.read(tmp_path / "1" / row["audio_filepath"])[0]
            four = sf.read(tmp_path / "4" / row["audio_filepath"])[0]
            np.testing.assert_allclose(one, four, atol=1e-4 * max(np.abs(one).max(), 1e-3))


def test_ljspeech_format_names_files_by_id(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "metadata.csv"
    corpus.write_bytes("\ufeffLJ001-0001|Hello there.|Hello there.\r\nLJ001-0002|\xe9t\xe9?|x\r\n".encode()
                      + b"LJ001-0003|bad \xff byte\n")
    out = tmp_path / "out"
    result = run([str(corpus), "-o", str(out), "--format", "ljspeech"], tiny_checkpoints)
    assert result.exit_code == 1, "a line in error gives exit status 1"
    rows = manifest(out)
    assert [r["id"] for r in rows] == ["LJ001-0001", "LJ001-0002", "LJ001-0003"]
    assert (out / "wavs" / "LJ001-0001.wav").exists() and (out / "wavs" / "LJ001-0002.wav").exists()
    assert rows[1]["normalized_text"] == "ete?"
    assert rows[2]["status"] == "error" and "UTF-8" in rows[2]["reason"]


def test_a_plain_corpus_of_ids_and_text_runs_as_asked_with_one_line_naming_its_format(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "metadata.csv"
    corpus.write_text("LJ001-0001|Printing, in the only sense.\nLJ001-0002|Hi.\n")
    tacotron2, waveglow = tiny_checkpoints
    args = [str(corpus), "--tacotron2", str(tacotron2), "--waveglow", str(waveglow), "--device", "cpu",
            "--max-decoder-steps", "12", "--seed", "1"]
    plain = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    hints = [line for line in plain.output.splitlines() if "--format ljspeech" in line]
    assert len(hints) == 1 and str(corpus) in hints[0]
    assert [r["id"] for r in manifest(tmp_path / "plain")] == ["000001", "000002"]
    asked = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "ljspeech"), "--format", "ljspeech"])
    assert asked.exit_code == 0 and "--format" not in asked.output, asked.output


def test_duplicate_ids_stop_before_any_work(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "c.tsv"
    corpus.write_text("a\tone\nb\ttwo\na\tthree\n")
    out = tmp_path / "out"
    result = run([str(corpus), "-o", str(out), "--format", "tsv"], tiny_checkpoints)
    assert result.exit_code == 2
    assert "c.tsv:3" in result.output and "duplicate id 'a'" in result.output
    assert not out.exists()


def hello_and_a_broken_waveglow(tmp_path, tiny_checkpoints):
    """A one-line corpus, and a WaveGlow file cut short."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello\n")
    broken = tmp_path / "broken.pt"
    broken.write_bytes(tiny_checkpoints[1].read_bytes()[:1000])
    return corpus, broken


def test_a_bad_checkpoint_is_one_line_naming_the_file(tmp_path, tiny_checkpoints):
    corpus, broken = hello_and_a_broken_waveglow(tmp_path, tiny_checkpoints)
    result = run([str(corpus), "-o", str(tmp_path / "out")], (tiny_checkpoints[0], broken))
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1 and "broken.pt" in lines[0]
    swapped = run([str(corpus), "-o", str(tmp_path / "out")], (tiny_checkpoints[1], tiny_checkpoints[1]))
    assert swapped.exit_code == 2 and "--waveglow" in swapped.output


def test_missing_published_checkpoints_say_where_to_get_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tts_cli.voice.checkpoint_dirs", lambda: [tmp_path / "checkpoints"])
    (tmp_path / "c.txt").write_text("hello\n")
    result = CliRunner().invoke(main, ["c.txt", "-o", "out", "--device", "cpu"])
    assert result.exit_code == 2
    assert "tacotron2_statedict.pt" in result.output and "NVIDIA/tacotron2" in result.output


def test_usage_errors_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["c.txt", "-o", "out", "--batch-size", "0"])
    assert result.exit_code == 2
    result = CliRunner().invoke(main, ["c.txt", "-o", "out", "--recipe", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2 and "none.yaml" in result.output
    result = CliRunner().invoke(main, ["bench", "--batch-size", "0", "--device", "cpu"])
    assert result.exit_code == 2 and "--batch-size" in result.output
    for device in ("gpu", "CPU", "cuda:x"):
        result = CliRunner().invoke(main, ["bench", "--device", device])
        assert result.exit_code == 2 and f"--device {device}: use cuda, cuda:N or cpu" in result.output


def test_a_usage_mistake_is_one_line_naming_the_option(tmp_path):
    (tmp_path / "c.txt").write_text("hello\n")
    corpus = str(tmp_path / "c.txt")
    for args, named in (([corpus, "-o", "out", "--batch-size", "0"], "--batch-size"),
                        ([corpus, "-o", "out", "--bogus"], "--bogus"),
                        ([corpus], "--output"),
                        ([corpus, "-o", "out", "--tacotron2", str(tmp_path)], "is a directory"),
                        (["export", str(tmp_path / "none")], "does not exist")):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert result.output.count("\n") == 1 and result.output.startswith("tts-batch: error: ")
        assert named in result.output and "--help" in result.output
    for args, command in (([corpus, "--seed"], "synth"), (["export", str(tmp_path), "--to"], "export"),
                          (["bench", "--lines"], "bench")):   # a value missing: where its options are listed
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and f"requires an argument. (tts-batch {command} --help lists" in result.output


def test_the_command_alone_shows_its_help_not_an_error():
    result = CliRunner().invoke(main, [])
    assert result.output.startswith("Usage: ") and "synth" in result.output and "error" not in result.output


def test_help_lists_the_options():
    result = CliRunner().invoke(main, ["synth", "--help"])
    for option in ("--tacotron2", "--waveglow", "--sigma", "--denoiser-strength", "--max-decoder-steps",
                   "--gate-threshold", "--prenet-dropout", "--seed", "--batch-size", "--sample-format",
                   "--save-mels", "--format", "--force", "--max-symbols-per-piece", "--piece-pause", "--quiet", "--device", "--precision", "--recipe",
                   "--text-normalization"):
        assert option in result.output


def without_torch(args, cwd, stdin=None):
    """The command in a process where importing torch fails: what it says
    before torch would load (exit status, stderr)."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tts_cli.cli import main\n"
            "main(prog_name='tts-batch')")
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.returncode, done.stderr


@pytest.mark.parametrize("args, says", [
    (["missing.txt", "-o", "out"], "missing.txt: no such file"),
    (["c.txt", "-o", "out", "--device", "tpu"], "--device: device must be cpu, cuda or cuda:N, not 'tpu'"),
    (["c.txt", "-o", "out", "--device", "cuda:x"], "not 'cuda:x'"),
    (["c.txt", "-o", "out", "--tacotron2", "missing.pt"], "tacotron2 checkpoint missing.pt: no such file"),
    (["c.txt", "-o", "out", "--recipe", "r.yaml"], "waveglow checkpoint .: is a directory"),
    (["c.txt", "-o", "c.txt"], "-o c.txt: is a file"),
    (["c.txt", "-o", "out", "--recipe", "none.yaml"], "none.yaml"),
])
def test_mistakes_are_one_line_before_torch_is_imported(tmp_path, args, says):
    (tmp_path / "c.txt").write_text("hello\n")
    (tmp_path / "r.yaml").write_text("waveglow: .\n")
    code, stderr = without_torch(args, tmp_path)
    assert code == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tts-batch: error: ") and says in lines[0], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "r.yaml"], "nothing written"


def test_a_corpus_on_stdin_runs_and_resumes_by_content(tmp_path, tiny_checkpoints):
    out = tmp_path / "out"
    first = run(["-", "-o", str(out)], tiny_checkpoints, input="Hello there.\nA second line.\n")
    assert first.exit_code == 0, first.output
    assert [r["status"] for r in manifest(out)] == ["ok", "ok"]
    tacotron2, waveglow = tiny_checkpoints
    again = CliRunner().invoke(main, ["-", "-o", str(out), "--tacotron2", str(tacotron2), "--waveglow",
                                      str(waveglow), "--device", "cpu", "--max-decoder-steps", "12",
                                      "--no-check-alignment"], input="Hello there.\nA second line.\n")
    assert again.exit_code == 0, again.output
    assert "nothing to do: 2 lines: 2 ok; 2 reused from an earlier run" in again.output
    changed = run(["-", "-o", str(out)], tiny_checkpoints, input="Hello there.\nAnother second line.\n")
    assert changed.exit_code == 0, changed.output
    assert [r["text"] for r in manifest(out)] == ["Hello there.", "Another second line."]


def test_the_summary_counts_in_words(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "c.txt"
    corpus.write_text("Hello there.\n")
    tacotron2, waveglow = tiny_checkpoints
    result = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "out"), "--tacotron2", str(tacotron2),
                                       "--waveglow", str(waveglow), "--device", "cpu",
                                       "--max-decoder-steps", "12", "--seed", "1", "--no-check-alignment"])
    assert result.exit_code == 0, result.output
    assert re.search(r"^1 line: 1 (ok|truncated); 0 reused", result.output, re.M), result.output
    assert "s of audio made in" in result.output


def test_a_run_that_fails_before_any_work_leaves_the_output_as_it_found_it(tmp_path, tiny_checkpoints):
    corpus, broken = hello_and_a_broken_waveglow(tmp_path, tiny_checkpoints)
    result = run([str(corpus), "-o", str(tmp_path / "new")], (tiny_checkpoints[0], broken))
    assert result.exit_code == 2 and not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    result = run([str(corpus), "-o", str(tmp_path / "empty"), "--save-mels"], (tiny_checkpoints[0], broken))
    assert result.exit_code == 2 and list((tmp_path / "empty").iterdir()) == []


def test_a_finished_run_leaves_no_lock_file(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello\n")
    result = run([str(corpus), "-o", str(tmp_path / "out")], tiny_checkpoints)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.jsonl", "wavs"]


def test_bench_on_cpu_is_refused_in_one_line():
    result = CliRunner().invoke(main, ["bench", "--device", "cpu"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line and not line.startswith("bench: ")]
    assert len(lines) == 1 and "GPU figures" in lines[0] and "--device cpu" in lines[0]


def test_the_plan_comes_first_and_a_rerun_with_nothing_to_do_never_imports_torch(tmp_path, tiny_checkpoints):
    (tmp_path / "c.txt").write_text("Hello there.\nA second line.\n\n")
    tacotron2, waveglow = tiny_checkpoints
    args = ["c.txt", "-o", "out", "--tacotron2", str(tacotron2), "--waveglow", str(waveglow), "--device", "cpu",
            "--max-decoder-steps", "12", "--seed", "1"]
    code, stderr = without_torch(args, tmp_path)
    assert code != 0 and stderr.startswith("running on CPU in fp32"), "no torch: the run stops at the models"
    assert stderr.splitlines()[1] == (f"3 lines: 2 to do, 0 reused from an earlier run, 1 without audio "
                                      f"(skipped or unreadable); {tacotron2} + {waveglow} on cpu, fp32")
    made = subprocess.run([sys.executable, "-m", "tts_cli", *args, "--quiet"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert made.returncode == 0, made.stderr
    code, stderr = without_torch(args, tmp_path)
    assert code == 0, stderr
    assert "3 lines: 0 to do, 2 reused from an earlier run, 1 without audio" in stderr
    # the alignment checks on, as by default (the random model's lines may come out suspect)
    assert re.search(r"nothing to do: 3 lines: .*1 skipped; 2 reused from an earlier run", stderr), stderr


def test_the_command_ends_with_its_status_its_summary_said_and_every_file_in_place(tmp_path,
                                                                                  never_stopping_checkpoints):
    """``python -m tts_cli`` ends the process as soon as the work is done
    (cli.run): the summary still reaches stderr, the exit status is the
    command's (1 with --strict and a truncated line), and the manifest
    and WAVs are complete on disk."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    tacotron2, waveglow = never_stopping_checkpoints
    done = subprocess.run(
        [sys.executable, "-m", "tts_cli", str(corpus), "-o", str(tmp_path / "out"), "--tacotron2", str(tacotron2),
         "--waveglow", str(waveglow), "--device", "cpu", "--max-decoder-steps", "12", "--seed", "1",
         "--no-check-alignment", "--strict"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    rows = manifest(tmp_path / "out")
    assert sum(r["status"] == "truncated" for r in rows) == 4   # every spoken line: its gate never fires
    assert done.returncode == 1, done.stderr
    assert "6 lines:" in done.stderr and "manifest:" in done.stderr.splitlines()[-1], done.stderr
    assert len(rows) == 6
    for r in rows:
        if r["audio_filepath"]:
            assert sf.info(tmp_path / "out" / r["audio_filepath"]).frames == r["num_samples"]
    # what goes to a piped stdout (block-buffered) is flushed before the end
    version = subprocess.run([sys.executable, "-m", "tts_cli", "--version"], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
    assert version.returncode == 0 and re.search(r"version \d", version.stdout), version


def test_another_sample_rate_is_resampled_not_relabelled(tmp_path, tiny_checkpoints):
    """--sample-rate 16000: each WAV is the voice's 22,050 Hz audio resampled
    (not the same samples under a 16 kHz header), so its duration is the
    same, and the manifest's duration and num_samples match the file."""
    from tts_cli.audio import resample
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    native = run([str(corpus), "-o", str(tmp_path / "native"), "--sample-format", "float32"], tiny_checkpoints)
    low = run([str(corpus), "-o", str(tmp_path / "low"), "--sample-format", "float32", "--sample-rate", "16000"],
              tiny_checkpoints)
    assert native.exit_code == 0 and low.exit_code == 0, native.output + low.output
    spoken = 0
    for a, b in zip(manifest(tmp_path / "native"), manifest(tmp_path / "low"), strict=True):
        if a["audio_filepath"] is None:
            continue
        spoken += 1
        x, rate_x = sf.read(tmp_path / "native" / a["audio_filepath"], dtype="float32")
        y, rate_y = sf.read(tmp_path / "low" / b["audio_filepath"], dtype="float32")
        assert (rate_x, rate_y) == (22050, 16000)
        assert np.array_equal(y, resample(x, 22050, 16000))
        assert b["num_samples"] == len(y) and b["duration"] == pytest.approx(len(y) / 16000)
        assert b["duration"] == pytest.approx(a["duration"], abs=1 / 16000)
    assert spoken == 4


def test_flac_output_is_written_resumed_and_counted_like_wav(tmp_path, tiny_checkpoints):
    """--audio-format flac: wavs/<id>.flac, 16-bit unless asked, each the
    same samples the WAV run holds; the manifest points at them; a re-run
    reuses them, and switching format redoes the lines."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    wav = run([str(corpus), "-o", str(tmp_path / "wav")], tiny_checkpoints)
    flac = run([str(corpus), "-o", str(tmp_path / "flac"), "--audio-format", "flac"], tiny_checkpoints)
    assert wav.exit_code == 0 and flac.exit_code == 0, wav.output + flac.output
    spoken = [(a, b) for a, b in zip(manifest(tmp_path / "wav"), manifest(tmp_path / "flac"), strict=True)
              if a["audio_filepath"] is not None]
    assert len(spoken) == 4
    for a, b in spoken:
        assert b["audio_filepath"] == f"wavs/{b['id']}.flac"
        info = sf.info(tmp_path / "flac" / b["audio_filepath"])
        assert (info.format, info.subtype, info.frames) == ("FLAC", "PCM_16", b["num_samples"])
        same = sf.read(tmp_path / "flac" / b["audio_filepath"], dtype="int16")[0]
        assert np.array_equal(same, sf.read(tmp_path / "wav" / a["audio_filepath"], dtype="int16")[0])
    again = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "flac"), "--audio-format", "flac",
                                      "--tacotron2", str(tiny_checkpoints[0]), "--waveglow", str(tiny_checkpoints[1]),
                                      "--device", "cpu", "--max-decoder-steps", "12", "--seed", "1",
                                      "--no-check-alignment"])
    assert "0 to do, 4 reused" in again.output
    switched = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "flac"), "--tacotron2",
                                         str(tiny_checkpoints[0]), "--waveglow", str(tiny_checkpoints[1]),
                                         "--device", "cpu", "--max-decoder-steps", "12", "--seed", "1",
                                         "--no-check-alignment"])
    assert "4 to do, 0 reused" in switched.output
    assert all(r["audio_filepath"] is None or r["audio_filepath"].endswith(".wav")
               for r in manifest(tmp_path / "flac"))


def test_flac_with_float_samples_is_refused_before_anything_runs(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Hello.\n")
    result = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "out"), "--audio-format", "flac",
                                       "--sample-format", "float32", "--device", "cpu"])
    assert result.exit_code == 2
    assert "FLAC stores integer samples" in result.output and not (tmp_path / "out").exists()


def quiet_run(tmp_path: Path, corpus: bytes, *extra: str) -> subprocess.CompletedProcess:
    """The command with --quiet as cron runs it: a fresh process, stdout and stderr captured."""
    (tmp_path / "corpus.txt").write_bytes(corpus)
    return subprocess.run([sys.executable, "-m", "tts_cli", "corpus.txt", "-o", "out", "--device", "cpu", "--quiet",
                           "--max-decoder-steps", "12", "--seed", "1", *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})


def test_a_quiet_run_that_succeeds_prints_nothing(tmp_path, tiny_checkpoints):
    done = quiet_run(tmp_path, b"Hello there.\n", "--tacotron2", str(tiny_checkpoints[0]),
                     "--waveglow", str(tiny_checkpoints[1]), "--no-check-alignment")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_quiet_run_with_a_failed_line_says_so_in_one_line(tmp_path, tiny_checkpoints):
    """Cron mails only what a job prints: exit 1 alone would go unheard."""
    done = quiet_run(tmp_path, b"Hello there.\nbad \xff byte\n", "--tacotron2", str(tiny_checkpoints[0]),
                     "--waveglow", str(tiny_checkpoints[1]), "--no-check-alignment")
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "2 lines:" in line and "1 error" in line and "manifest.jsonl" in line


def test_a_quiet_run_still_says_the_demo_voice_stands_in(tmp_path):
    """NVIDIA's files missing: the audio is the robotic demo voice's, which
    --quiet must not hide; the CPU's slowness notice it may."""
    done = quiet_run(tmp_path, b"Hi.\n")
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert "using the demo voice" in line and "running on CPU" not in done.stderr


def test_a_quiet_run_still_says_a_precision_asked_for_is_not_used(tmp_path, tiny_checkpoints):
    """--precision fp16 on a CPU runs in fp32: a cron job that asked for it hears so."""
    done = quiet_run(tmp_path, b"Hello there.\n", "--precision", "fp16", "--tacotron2", str(tiny_checkpoints[0]),
                     "--waveglow", str(tiny_checkpoints[1]), "--no-check-alignment")
    assert done.returncode == 0
    [line] = done.stderr.splitlines()
    assert "warning" in line and "--precision fp16 is for CUDA" in line


def test_a_quiet_run_still_says_the_corpus_looks_misread(tmp_path, tiny_checkpoints):
    done = quiet_run(tmp_path, b"utt1|Hello there.\nutt2|And again.\n", "--tacotron2", str(tiny_checkpoints[0]),
                     "--waveglow", str(tiny_checkpoints[1]), "--no-check-alignment")
    assert done.returncode == 0
    [line] = done.stderr.splitlines()
    assert "warning" in line and "--format ljspeech" in line


def test_when_most_lines_fail_for_one_reason_the_terminal_says_which(tmp_path, tiny_checkpoints):
    """A tab-separated corpus read as ljspeech: every row fails with "no '|'
    separator"; one line on the terminal says so, --quiet or not."""
    done = quiet_run(tmp_path, b"a\tHello.\nb\tThere.\nc\tAgain.\n", "--format", "ljspeech",
                     "--tacotron2", str(tiny_checkpoints[0]), "--waveglow", str(tiny_checkpoints[1]))
    assert done.returncode == 1
    assert "tts-batch: 3 of 3 lines failed for one reason: no '|' separator; expected 'id|text'" in done.stderr.splitlines()


def test_files_no_row_names_are_counted_and_pruned_only_when_asked(tmp_path, tiny_checkpoints):
    """The corpus shrank from 5 spoken lines to 1: the other WAVs and mels
    are counted in one line (even --quiet); --prune removes them and only
    them."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    out = tmp_path / "out"
    assert run([str(corpus), "-o", str(out), "--save-mels"], tiny_checkpoints).exit_code == 0
    corpus.write_text("Hi.\n")
    kept = run([str(corpus), "-o", str(out), "--save-mels"], tiny_checkpoints)
    assert kept.exit_code == 0
    [line] = [line for line in kept.output.splitlines() if "no manifest row names" in line]
    assert "6 files" in line and "--prune removes them" in line
    assert len(list((out / "wavs").glob("*.wav"))) == 4
    pruned = run([str(corpus), "-o", str(out), "--save-mels", "--prune"], tiny_checkpoints)
    assert pruned.exit_code == 0
    [row] = manifest(out)
    assert sorted(p.name for p in (out / "wavs").iterdir()) == [Path(row["audio_filepath"]).name]
    assert sorted(p.name for p in (out / "mels").iterdir()) == [Path(row["mel_filepath"]).name]


def test_an_output_folder_that_cannot_hold_files_is_not_blamed_on_the_disk(tmp_path):
    """-o under /proc (or through a file): the advice is to choose another -o,
    not to free disk space."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Hi.\n")
    (tmp_path / "a-file").write_text("")
    for out in ("/proc/tts-batch-out", str(tmp_path / "a-file" / "out")):
        result = CliRunner().invoke(main, [str(corpus), "-o", out, "--device", "cpu", "-q"])
        assert result.exit_code == 2
        assert "choose another -o" in result.output and "free disk space" not in result.output, result.output


def test_a_line_in_another_script_is_suspect_not_ok(tmp_path, tiny_checkpoints):
    """日本語 is spoken as its transliteration ("ri ben yu"), not what it
    says: for a dataset that is a wrong label, so the row says why."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("日本語のテキスト\nA plain English line.\nCafé crème, naïve.\n", encoding="utf-8")
    result = run([str(corpus), "-o", str(tmp_path / "out")], tiny_checkpoints)
    assert result.exit_code == 0, result.output
    rows = manifest(tmp_path / "out")
    assert rows[0]["status"] == "suspect"
    assert rows[0]["reason"].startswith("letters of another script the voice cannot say ('日本語のテキスト')")
    assert rows[0]["normalized_text"] in rows[0]["reason"][-60:] or "ri ben yu" in rows[0]["reason"]
    assert [r["status"] for r in rows[1:]] == ["ok", "ok"]      # Latin letters with accents are Latin


SPOKEN_FORMS = "It rose 12% by 7:30 p.m. on March 3.\nWrite to info@example.com & call #5.\n"


def test_the_extended_normalization_says_what_the_reference_drops_and_a_rerun_in_the_other_remakes(
        tmp_path, tiny_checkpoints):
    corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
    corpus.write_text(SPOKEN_FORMS)
    assert run([str(corpus), "-o", str(out)], tiny_checkpoints).exit_code == 0
    extended = manifest(out)
    assert [r["normalized_text"] for r in extended] == [
        "it rose twelve percent by seven thirty p m on march third.",
        "write to info at example dot com and call number five."]
    assert [(r["status"], r["reason"], r["dropped"]) for r in extended] == [("ok", None, None)] * 2

    result = run([str(corpus), "-o", str(out), "--text-normalization", "reference"], tiny_checkpoints)
    assert result.exit_code == 0, result.output
    reference = manifest(out)
    assert [r["normalized_text"] for r in reference] == [
        "it rose twelve by seven:thirty p.m. on march three.", "write to infoexample.com  call five."]
    assert [r["dropped"] for r in reference] == ["%", "@&#"]
    assert [r["status"] for r in reference] == ["suspect", "suspect"]
    assert reference[1]["reason"] == "characters the voice cannot say, left out: '@&#'"
    assert all(a["key"] != b["key"] for a, b in zip(extended, reference)), "the mode is in the resume key"


def test_the_normalization_can_be_set_by_a_recipe_and_is_checked(tmp_path, tiny_checkpoints):
    corpus, recipe = tmp_path / "corpus.txt", tmp_path / "nvidia.yaml"
    corpus.write_text("12%\n")
    recipe.write_text("text_normalization: reference\n")
    assert run([str(corpus), "-o", str(tmp_path / "out"), "--recipe", str(recipe)], tiny_checkpoints).exit_code == 0
    assert manifest(tmp_path / "out")[0]["normalized_text"] == "twelve"
    recipe.write_text("text_normalization: nvidia\n")
    result = run([str(corpus), "-o", str(tmp_path / "out"), "--recipe", str(recipe)], tiny_checkpoints)
    assert result.exit_code == 2 and "text_normalization must be one of reference, extended" in result.output


def test_dropped_characters_are_recorded_and_only_lost_words_make_a_line_suspect(tmp_path, tiny_checkpoints):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\u201cQuoted,\u201d she said.\nTrending #tts \U0001F600\n[sic] *bold*\n###\n", encoding="utf-8")
    result = run([str(corpus), "-o", str(tmp_path / "out")], tiny_checkpoints)
    assert result.exit_code == 0, result.output
    rows = manifest(tmp_path / "out")
    assert [(r["status"], r["dropped"]) for r in rows] == [
        ("ok", "\u201c\u201d"), ("suspect", "#\U0001F600"), ("ok", "[]*"), ("skipped", "#")]
    assert rows[1]["reason"] == "characters the voice cannot say, left out: '#\U0001F600'"


def test_lost_words_are_told_even_under_quiet(tmp_path, tiny_checkpoints):
    """What the audio leaves out of its text changes the dataset: cron hears of it."""
    done = quiet_run(tmp_path, "Hello there.\n50% off\n\u65e5\u672c\u8a9e\n".encode(), "--tacotron2",
                     str(tiny_checkpoints[0]), "--waveglow", str(tiny_checkpoints[1]), "--no-check-alignment",
                     "--text-normalization", "reference")
    assert done.returncode == 0 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("tts-batch: warning: 2 lines with characters the voice cannot say (line 2: '%')"), line


def test_a_line_with_no_audible_speech_is_suspect(tmp_path, tiny_checkpoints):
    """The tiny voice's gate fires at the first frame: 11.6 ms of audio is
    no speech, whatever the alignment's measures say of one symbol."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A\n")
    tacotron2, waveglow = tiny_checkpoints
    result = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "out"), "--tacotron2", str(tacotron2),
                                       "--waveglow", str(waveglow), "--device", "cpu", "--seed", "1", "-q"])
    assert result.exit_code == 0, result.output
    [row] = manifest(tmp_path / "out")
    assert row["mel_frames"] == 1 and row["alignment"]["attempts"] == 1
    assert (row["status"], row["reason"]) == (
        "suspect", "no audible speech: the stop gate fired after 1 frame (fewer than 5)")


def test_the_progress_bar_is_drawn_on_a_terminal_of_no_width(tmp_path, tiny_checkpoints):
    """A pty nobody sized reports 0 columns (and COLUMNS=0 says the same):
    the bar falls back to 80 columns instead of vanishing."""
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios
    (tmp_path / "corpus.txt").write_text("Hello there.\nA second line.\n")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    tacotron2, waveglow = tiny_checkpoints
    process = subprocess.Popen(
        [sys.executable, "-m", "tts_cli", "corpus.txt", "-o", "out", "--device", "cpu", "--seed", "1",
         "--max-decoder-steps", "12", "--no-check-alignment", "--tacotron2", str(tacotron2), "--waveglow",
         str(waveglow)], cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower,
        env={**os.environ, "COLUMNS": "0",
             "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    os.close(follower)
    said = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:   # the process closed its end
            break
        if not chunk:
            break
        said += chunk
    os.close(leader)
    assert process.wait(timeout=300) == 0, said
    bars = [part for part in said.decode(errors="replace").split("\r") if "2/2" in part]
    assert bars and "100%|" in bars[-1] and "line" in bars[-1], said
    assert len(bars[-1].rstrip("\r\n")) == 79, "80 columns, one left free"


def test_a_file_or_folder_in_the_way_of_the_output_says_to_move_it(tmp_path, tiny_checkpoints):
    """Not "free disk space", and not --force, which could not help."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Hi.\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "wavs").write_text("")
    (tmp_path / "b" / "manifest.jsonl").mkdir(parents=True)
    for out, said in (("a", "a file is in the way of that folder: move it away"),
                      ("b", "a folder where the manifest goes; move it away")):
        result = run([str(corpus), "-o", str(tmp_path / out)], tiny_checkpoints)
        assert result.exit_code == 2 and said in result.output
        assert "disk space" not in result.output and "--force" not in result.output


def test_a_signal_after_the_last_line_is_said_under_quiet_with_its_status(tmp_path, tiny_checkpoints):
    """Cron sees 143: one line says the job is whole all the same."""
    (tmp_path / "corpus.txt").write_text("Hi.\n")
    script = ("import os, signal, sys, tts_cli.pipeline as p\n"
              "p.refresh_saying = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGTERM)   # the job's very end\n"
              "from tts_cli.cli import run\n"
              "sys.argv = ['tts-batch', *sys.argv[1:]]\n"
              "run()\n")
    done = subprocess.run([sys.executable, "-c", script, "corpus.txt", "-o", "out", "--device", "cpu", "--quiet",
                           "--max-decoder-steps", "12", "--no-check-alignment", "--tacotron2", str(tiny_checkpoints[0]),
                           "--waveglow", str(tiny_checkpoints[1])], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 143
    [line] = done.stderr.splitlines()
    assert "SIGTERM received after the last line was written: every line has its row" in line
    assert [r["status"] for r in manifest(tmp_path / "out")] != ["pending"]
