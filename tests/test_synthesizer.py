"""The Python front door: Synthesizer.load, .synthesize, .synthesize_to_dir."""
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from outputs import manifest
from tts_cli import Synthesizer
from tts_cli.cli import main
from tts_cli.config import ConfigError
from tts_cli.errors import FatalError

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["Printing, in the only sense with which we are at present concerned.", "", "It cost $3.50 in 1963.",
         "A much longer line, which goes on and on, so that it lands in another batch than the short ones.",
         "Hi."]
SAME = dict(device="cpu", max_decoder_steps=12)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    tacotron2, waveglow = tiny_checkpoints
    return Synthesizer.load(tacotron2, waveglow, **SAME)


def test_synthesize_gives_each_text_the_audio_the_command_writes_for_it(tmp_path, tiny, tiny_checkpoints):
    """In memory, in the order given, each text's audio is bitwise the WAV
    that `tts-batch` writes for the same line of a plain corpus with the same
    seed; a text with nothing to say gives an empty array."""
    audio = tiny.synthesize(TEXTS, seed=5)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    tacotron2, waveglow = tiny_checkpoints
    result = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "out"), "--tacotron2", str(tacotron2),
                                       "--waveglow", str(waveglow), "--device", "cpu", "--max-decoder-steps", "12",
                                       "--seed", "5", "--sample-format", "float32", "-q"])
    assert result.exit_code == 0, result.output
    rows = manifest(tmp_path / "out")
    assert len(audio) == len(TEXTS) == len(rows)
    for made, row in zip(audio, rows):
        assert made.dtype == np.float32 and made.ndim == 1
        if row["audio_filepath"] is None:
            assert made.shape == (0,)
            continue
        written, rate = sf.read(tmp_path / "out" / row["audio_filepath"], dtype="float32")
        assert rate == tiny.sample_rate and np.array_equal(made, written)
    assert tiny.synthesize(TEXTS[2:3], seed=5)[0].shape[0] > 0


def test_the_voice_is_known_once_loaded(tiny, tiny_checkpoints):
    assert tiny.voice.sample_rate == tiny.sample_rate == 22050
    assert tiny.voice.name == "waveglow_256channels_universal_v5"   # NVIDIA's files name none: the file's stem
    assert tiny.voice.denoiser_strength == 0.01
    # one object: the files it was loaded from, where it runs, and what the resume keys hold of it
    assert (tiny.voice.tacotron2, tiny.voice.waveglow) == tuple(Path(p) for p in tiny_checkpoints)
    assert (tiny.voice.device, tiny.voice.precision) == ("cpu", "fp32") and not tiny.voice.demo
    assert tiny.voice is tiny.resolved_voice and set(tiny.voice.fingerprint) == {"tacotron2", "waveglow"}


def test_a_text_the_front_end_cannot_read_is_refused_by_its_position(tiny):
    with pytest.raises(ValueError, match=r"text 1 .*number too large"):
        tiny.synthesize(["Fine.", "1" * 40])


def test_a_line_that_never_stops_comes_back_with_a_warning(never_stopping_checkpoints):
    s = Synthesizer.load(*never_stopping_checkpoints, device="cpu", max_decoder_steps=10, check_alignment=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        audio = s.synthesize(["It never ends."], seed=1)
    assert audio[0].shape[0] > 0
    assert [str(w.message) for w in caught] == [
        "text 0 is truncated: reached max_decoder_steps (10) without the stop gate firing"]


def test_load_fails_as_the_command_does(tmp_path, tiny_checkpoints):
    tacotron2, _ = tiny_checkpoints
    with pytest.raises(FatalError, match="waveglow checkpoint .*missing.pt: no such file"):
        Synthesizer.load(tacotron2, tmp_path / "missing.pt", device="cpu")
    with pytest.raises(ConfigError, match="sigma"):
        Synthesizer.load(*tiny_checkpoints, device="cpu", sigma=-1)
    with pytest.raises(ConfigError, match="unknown"):
        Synthesizer.load(*tiny_checkpoints, device="cpu", recipe=str(_recipe(tmp_path, "colour: blue")))


def _recipe(folder: Path, text: str) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(text + "\n")
    return path


def test_synthesize_to_dir_is_the_command_s_job(tmp_path, tiny, tiny_checkpoints):
    """The same files and rows as the command, so the command resumes it:
    a later `tts-batch` over the folder with the same settings redoes
    nothing."""
    summary = tiny.synthesize_to_dir(TEXTS, tmp_path / "out", seed=2)
    assert summary.counts["skipped"] == 1 and summary.made == 4
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    tacotron2, waveglow = tiny_checkpoints
    again = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / "out"), "--tacotron2", str(tacotron2),
                                      "--waveglow", str(waveglow), "--device", "cpu", "--max-decoder-steps", "12",
                                      "--seed", "2"])
    assert again.exit_code == 0, again.output
    assert "0 to do, 4 reused" in again.output


def test_what_the_models_make_is_fixed_when_they_load(tmp_path, tiny):
    with pytest.raises(ValueError, match="max_decoder_steps, sigma: fixed when the models load"):
        tiny.synthesize_to_dir(TEXTS, tmp_path / "out", sigma=0.1, max_decoder_steps=5)
    assert not (tmp_path / "out").exists()


def test_the_readme_s_python_example_runs(tmp_path):
    """The README's example, as written, in a fresh interpreter (the demo voice on CPU)."""
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"## Python\n.*?```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-2000:]
    written = sorted((tmp_path / "out" / "wavs").glob("*.wav"))
    assert len(written) == 2 and all(sf.info(w).frames > 0 for w in written)
    assert (tmp_path / "hello.wav").is_file() and sf.info(tmp_path / "hello.wav").samplerate == 22050


def test_audio_comes_at_the_rate_asked_for(tiny_checkpoints, tiny):
    s = Synthesizer.load(*tiny_checkpoints, sample_rate=16000, **SAME)
    assert s.sample_rate == 16000 and s.voice.sample_rate == tiny.sample_rate == 22050
    [low], [native] = s.synthesize(["It cost $3.50."], seed=3), tiny.synthesize(["It cost $3.50."], seed=3)
    assert abs(len(low) / 16000 - len(native) / 22050) <= 1 / 16000


def test_the_dataset_options_work_through_synthesize_to_dir(tiny_checkpoints, tmp_path):
    """16 kHz FLAC in shards, as the command writes them, from Python."""
    s = Synthesizer.load(*tiny_checkpoints, sample_rate=16000, **SAME)
    summary = s.synthesize_to_dir(TEXTS, tmp_path / "out", seed=1, audio_format="flac", shard_size=2)
    made = [row for row in manifest(tmp_path / "out") if row["audio_filepath"]]
    assert len(made) == summary.counts["ok"] + summary.counts["suspect"] + summary.counts["truncated"] == 4
    for row in made:
        info = sf.info(tmp_path / "out" / row["audio_filepath"])
        assert (info.format, info.samplerate, info.frames) == ("FLAC", 16000, row["num_samples"])
    assert {Path(row["audio_filepath"]).parent.name for row in made} == {"00000", "00001", "00002"}


def test_an_option_of_the_wrong_name_or_type_is_one_line(tmp_path, tiny, tiny_checkpoints):
    """A misspelt or mistyped option fails at once, in one line naming it,
    not later in the middle of the models or as a traceback."""
    for options, message in [({"sgima": 0.5}, "unknown setting.* sgima"), ({"sigma": "0.5"}, "sigma must be float"),
                             ({"batch_size": 2.5}, "batch_size must be int"),
                             ({"check_alignment": "no"}, "check_alignment must be bool")]:
        with pytest.raises(ConfigError, match=message) as e:
            Synthesizer.load(*tiny_checkpoints, **SAME, **options)
        assert "\n" not in str(e.value) and "--" not in str(e.value), "a Python caller gave no flag"
    with pytest.raises(ConfigError, match="unknown setting.* recipe"):
        tiny.synthesize_to_dir(TEXTS, tmp_path / "out", recipe="ljspeech")
    with pytest.raises(ConfigError, match="seed must be int"):
        tiny.synthesize(TEXTS, seed="1")
    assert not (tmp_path / "out").exists()


def test_one_string_is_refused_rather_than_spoken_a_letter_at_a_time(tiny, tmp_path):
    with pytest.raises(TypeError, match="list of strings"):
        tiny.synthesize("Hello there.")
    with pytest.raises(TypeError, match="text 1: a string, not NoneType"):
        tiny.synthesize(["Fine.", None])
    with pytest.raises(TypeError, match="text 1: a string, not int"):
        tiny.synthesize_to_dir(["Fine.", 3], tmp_path / "out")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(FatalError, match="a-file: is a file; give a directory"):
        tiny.synthesize_to_dir(["Fine."], tmp_path / "a-file")


def test_a_seed_given_to_load_is_the_one_synthesize_uses(tiny_checkpoints, tiny):
    seeded = Synthesizer.load(*tiny_checkpoints, seed=4, **SAME)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the tiny voice's lines are suspect
        [first], [again] = seeded.synthesize(["Hello there."]), seeded.synthesize(["Hello there."])
        [four], [five] = tiny.synthesize(["Hello there."], seed=4), tiny.synthesize(["Hello there."], seed=5)
    assert np.array_equal(first, again) and np.array_equal(first, four) and not np.array_equal(four, five)


def test_a_signal_ends_the_run_as_a_keyboard_interrupt_and_gives_the_caller_its_handlers_back(tmp_path, tiny):
    """A notebook's Ctrl-C: the files in flight are finished, ``except
    Exception`` does not swallow it, the next Ctrl-C works, and the same
    call again finishes the job."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    sent = []

    def stop_once(line):
        if not sent:
            sent.append(line)
            os.kill(os.getpid(), signal.SIGINT)

    texts = ["Hello there.", "A second line.", "And a third."]
    with pytest.raises(KeyboardInterrupt) as stopped:
        tiny.synthesize_to_dir(texts, tmp_path / "out", on_notice=stop_once, quiet=True)
    assert not isinstance(stopped.value, Exception)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    summary = tiny.synthesize_to_dir(texts, tmp_path / "out", quiet=True)
    assert summary.counts["pending"] == 0 and sum(summary.counts.values()) == 3


def test_an_option_given_as_none_to_synthesize_to_dir_leaves_the_loaded_one(tiny_checkpoints, tmp_path):
    seeded = Synthesizer.load(*tiny_checkpoints, seed=5, sample_rate=16000, **SAME)
    summary = seeded.synthesize_to_dir(["Hi."], tmp_path / "out", quiet=True, seed=None, sample_rate=None)
    assert summary.seed == 5 and sf.info(tmp_path / "out" / "wavs" / "000001.wav").samplerate == 16000


def test_a_drawn_seed_is_kept_so_the_same_audio_can_be_made_again(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the tiny voice's lines are suspect
        [first] = tiny.synthesize(["Hello there."])
        drawn = tiny.last_seed
        [other] = tiny.synthesize(["Hello there."])
        [again] = tiny.synthesize(["Hello there."], seed=drawn)
    assert drawn is not None and np.array_equal(first, again) and not np.array_equal(first, other)


def test_what_the_command_says_even_under_quiet_load_says_as_a_warning(tiny_checkpoints):
    with pytest.warns(UserWarning, match="precision='fp16' is for CUDA; running on CPU in fp32") as said:
        s = Synthesizer.load(*tiny_checkpoints, device="cpu", precision="fp16")
    assert said[0].filename == __file__, "the warning points at the caller's line"
    assert "cpu, fp32" in repr(s) and f"{s.sample_rate} Hz" in repr(s)
    import tts_cli
    assert "Synthesizer" in dir(tts_cli)


def test_a_text_with_a_lone_surrogate_is_an_error_row_and_the_rest_goes_on(tiny, tmp_path):
    """Bytes decoded with surrogateescape (file names, say) are not text."""
    summary = tiny.synthesize_to_dir(["Hello \udcff there.", "Second."], tmp_path / "out", quiet=True)
    first, second = manifest(tmp_path / "out")
    assert first["status"] == "error" and "lone surrogate, U+DCFF, at character 7" in first["reason"]
    assert first["text"] == "Hello \\udcff there.", "the row shows which text it was"
    assert second["status"] != "error" and summary.counts["error"] == 1
    with pytest.raises(ValueError, match=r"text 0 \('Hello \\\\udcff there.'\): .*lone surrogate"):
        tiny.synthesize(["Hello \udcff there."])


def test_a_python_caller_is_told_the_keyword_and_the_command_s_user_the_flag(tiny, tiny_checkpoints, tmp_path):
    """What to do is said in the reader's own terms: ``force=True`` to a
    Python caller, ``--force`` on the command line, for the same damaged
    manifest."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.jsonl").write_text("{not json\n")
    with pytest.raises(FatalError, match=r"pass force=True to start over") as e:
        tiny.synthesize_to_dir(TEXTS, out, quiet=True)
    assert "--" not in str(e.value)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Hi.\n")
    result = CliRunner().invoke(main, [str(corpus), "-o", str(out), "--tacotron2", str(tiny_checkpoints[0]),
                                       "--waveglow", str(tiny_checkpoints[1]), "--device", "cpu", "--quiet"])
    assert result.exit_code != 0 and "pass --force to start over" in result.output
    assert "force=True" not in result.output


def test_load_refuses_what_is_no_path_or_recipe_in_one_line_naming_the_keyword(tiny_checkpoints):
    with pytest.raises(ConfigError, match="tacotron2 must be str, got 123"):
        Synthesizer.load(123, tiny_checkpoints[1], device="cpu")
    with pytest.raises(ConfigError, match="recipe must be a built-in recipe's name .* not None"):
        Synthesizer.load(*tiny_checkpoints, device="cpu", recipe=None)
    with pytest.raises(FatalError, match=r"no tacotron2 given .* or pass tacotron2=<path>") as e:
        Synthesizer.load(waveglow=tiny_checkpoints[1], device="cpu")
    assert "--" not in str(e.value)
    assert Synthesizer.load(*(os.fsencode(path) for path in tiny_checkpoints), **SAME).voice.tacotron2 is not None


def test_synthesize_to_dir_says_what_the_command_says_of_a_corpus_that_looks_misread(tiny, tmp_path):
    """Ids before a '|' in a plain corpus would be spoken: the command's
    warning comes as a notice, in the caller's words; a corpus path may be
    bytes; a model setting given again at its loaded value is no change."""
    corpus = tmp_path / "lj.txt"
    corpus.write_text("".join(f"LJ001-{n:04d}|Line number {n}.\n" for n in range(1, 6)))
    notices = []
    tiny.synthesize_to_dir(os.fsencode(corpus), tmp_path / "out", on_notice=notices.append, quiet=True,
                           device="cpu", max_decoder_steps=12)
    [hint] = [notice for notice in notices if "look like" in notice]
    assert "5 of its 5 lines" in hint and "pass format='ljspeech' if those are ids" in hint
    assert len(manifest(tmp_path / "out")) == 5
    with pytest.raises(ValueError, match="max_decoder_steps: fixed when the models load"):
        tiny.synthesize_to_dir(corpus, tmp_path / "out", max_decoder_steps=13)


def test_a_signal_after_the_last_line_still_reaches_the_caller_as_a_keyboard_interrupt(tiny, tmp_path):
    """A run with nothing left to do, stopped by a Ctrl-C: the caller's
    program stops as a Ctrl-C stops it, and keeps its handler."""
    from tts_cli.pipeline import Interrupted

    texts = ["Hi.", "Hello there."]
    tiny.synthesize_to_dir(texts, tmp_path / "out", quiet=True)

    def interrupt(notice):
        if "to do" in notice:
            os.kill(os.getpid(), signal.SIGINT)

    mine = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as e:
        tiny.synthesize_to_dir(texts, tmp_path / "out", on_notice=interrupt, quiet=True)
    assert (e.value.done, e.value.total) == (2, 2) and e.value.summary.reused == 2
    assert signal.getsignal(signal.SIGINT) is mine
