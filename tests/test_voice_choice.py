"""Which voice a run uses when no checkpoint is given: NVIDIA's published
files when both are there, else the demo voice, with one notice line; and the
settings a voice carries in its WaveGlow file (name, sample rate, denoiser
strength), which go wherever the file goes.

The checkpoint folders are replaced by temporary ones, so these tests do not
depend on what the source tree's checkpoints/ holds."""
import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from checkpoint_files import write_ngc_tacotron2, write_ngc_waveglow
from outputs import manifest, mtimes
from tiny_models import canonical, tiny_tacotron2, tiny_waveglow
from tts_cli.cli import main
from tts_cli.config import Settings
from tts_cli.resume import audio_identity
from tts_cli.checkpoints import VoiceInfo
from tts_cli.errors import FatalError
from tts_cli.loading import make_engine, voice_settings, with_voice
from tts_cli import voice
from tts_cli.voice import DEMO_FILES, PUBLISHED_FILES, choose_voice, file_digest, remembered_digest, resolve_voice

NOTICE = ("using the demo voice (checkpoints/demo_*.pt; robotic, for trying the tool): "
          "for NVIDIA's voice put tacotron2_statedict.pt and waveglow_256channels_universal_v5.pt "
          "in checkpoints/ (see checkpoints/README.md)")


DEMO_VOICE = {"name": "demo", "sample_rate": 22050, "denoiser_strength": 0.0}


@pytest.fixture(scope="session")
def demo_files(tmp_path_factory):
    """The demo voice's two files as the recipe exports them: NGC layout,
    fp16, the WaveGlow carrying the voice's settings."""
    folder = tmp_path_factory.mktemp("demo")
    write_ngc_tacotron2(folder / DEMO_FILES["tacotron2"], canonical(tiny_tacotron2(seed=7)), fp16=True)
    write_ngc_waveglow(folder / DEMO_FILES["waveglow"], canonical(tiny_waveglow(seed=7)), fp16=True,
                       voice=DEMO_VOICE)
    return folder


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory whose ./checkpoints (empty, created) is the only
    place checkpoints are looked for."""
    folder = (tmp_path / "checkpoints").resolve()
    folder.mkdir()
    (folder / "README.md").write_text("where to get NVIDIA's voice\n")   # as the shipped folder has
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tts_cli.voice.checkpoint_dirs", lambda: [folder])
    (tmp_path / "corpus.txt").write_text("Hello there.\nIt cost $3.50 in 1963.\n")
    return tmp_path


def put(workdir, source, *kinds, names=DEMO_FILES):
    """Copy the files of `kinds` from `source` (a folder, or a published pair)
    into the working directory's checkpoints/ under `names`."""
    for kind in kinds:
        origin = source / names[kind] if not isinstance(source, tuple) else source[kind == "waveglow"]
        shutil.copy(origin, workdir / "checkpoints" / names[kind])


def publish(workdir, tiny_checkpoints, *kinds):
    put(workdir, tiny_checkpoints, *(kinds or PUBLISHED_FILES), names=PUBLISHED_FILES)


def synth(*extra, out="out"):
    return CliRunner().invoke(main, ["corpus.txt", "-o", out, "--device", "cpu",
                                     "--max-decoder-steps", "12", "--seed", "1", *extra])


def notices(result):
    return [line for line in result.output.splitlines() if line.startswith("using the demo voice")]


def test_with_nothing_published_the_demo_voice_speaks_and_says_so_once(workdir, demo_files):
    put(workdir, demo_files, *DEMO_FILES)
    result = synth()
    assert result.exit_code == 0, result.output
    assert notices(result) == [NOTICE]
    rows = manifest(workdir / "out")
    assert [r["status"] in ("ok", "suspect", "truncated") for r in rows] == [True, True]
    assert sorted(mtimes(workdir / "out")) == ["000001.wav", "000002.wav"]


def test_an_installed_demo_voice_points_at_the_guide_installed_beside_it(workdir, demo_files, monkeypatch):
    """pip install puts checkpoints/ (demo files and README) in the package as
    tts_cli/demo_voice/: the notice names the README that exists there."""
    installed = (workdir / "site" / "tts_cli" / "demo_voice").resolve()
    installed.mkdir(parents=True)
    for name in DEMO_FILES.values():
        shutil.copy(demo_files / name, installed / name)
    (installed / "README.md").write_text("guide\n")
    monkeypatch.setattr("tts_cli.voice.checkpoint_dirs", lambda: [workdir / "checkpoints", installed])
    [notice] = notices(synth())
    assert notice.endswith("(see site/tts_cli/demo_voice/README.md)")


def test_quiet_hides_the_notice_as_it_hides_the_others(workdir, demo_files):
    put(workdir, demo_files, *DEMO_FILES)
    result = synth("--quiet")
    assert result.exit_code == 0, result.output
    assert notices(result) == [] and "CPU" not in result.output
    assert len(mtimes(workdir / "out")) == 2


def test_the_published_files_win_over_the_demo_voice(workdir, demo_files, tiny_checkpoints):
    put(workdir, demo_files, *DEMO_FILES)
    publish(workdir, tiny_checkpoints)
    result = synth()
    assert result.exit_code == 0, result.output
    assert notices(result) == []
    voice = choose_voice(Settings())
    assert not voice.demo and voice.tacotron2.name == PUBLISHED_FILES["tacotron2"]


def test_one_published_file_alone_gives_the_demo_voice_naming_the_other(workdir, demo_files,
                                                                        tiny_checkpoints):
    put(workdir, demo_files, *DEMO_FILES)
    publish(workdir, tiny_checkpoints, "tacotron2")
    result = synth()
    assert result.exit_code == 0, result.output
    assert notices(result) == [
        "using the demo voice (checkpoints/demo_*.pt; robotic, for trying the tool): for NVIDIA's "
        "voice put waveglow_256channels_universal_v5.pt in checkpoints/ too (only "
        "tacotron2_statedict.pt was found) (see checkpoints/README.md)"]
    voice = choose_voice(Settings())
    assert voice.demo and voice.tacotron2.name == DEMO_FILES["tacotron2"]


@pytest.mark.parametrize("demo", [(), ("tacotron2",)], ids=["no demo", "half the demo"])
def test_with_neither_voice_the_error_says_where_to_get_nvidias(workdir, demo_files, demo):
    put(workdir, demo_files, *demo)
    result = synth()
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("tts-batch: error: ")
    assert "tacotron2_statedict.pt" in lines[0] and "NVIDIA/tacotron2" in lines[0]
    assert not (workdir / "out" / "wavs").exists()


def test_the_error_names_every_folder_it_looked_in(workdir, monkeypatch):
    # ./checkpoints, then the source tree's: a user who put the files in the
    # second one must see that it was searched too.
    second = workdir / "source" / "checkpoints"
    second.mkdir(parents=True)
    monkeypatch.setattr("tts_cli.voice.checkpoint_dirs", lambda: [workdir / "checkpoints", second])
    result = synth()
    assert result.exit_code == 2
    assert f"{workdir / 'checkpoints'} or {second};" in result.output


def test_given_checkpoints_never_mix_with_the_demo_voice(workdir, demo_files, tiny_checkpoints):
    put(workdir, demo_files, *DEMO_FILES)
    tacotron2, waveglow = tiny_checkpoints
    result = synth("--tacotron2", str(tacotron2), "--waveglow", str(waveglow))
    assert result.exit_code == 0, result.output
    assert notices(result) == []
    # One given, the other's published file missing: an error, not half a demo voice.
    result = synth("--tacotron2", str(tacotron2), out="half")
    assert result.exit_code == 2
    assert "no --waveglow given" in result.output and "waveglow_256channels_universal_v5.pt" in result.output
    # ... and with the other published file there, that one.
    publish(workdir, tiny_checkpoints, "waveglow")
    voice = choose_voice(Settings(tacotron2=str(tacotron2)))
    assert not voice.demo and voice.waveglow == workdir.resolve() / "checkpoints" / PUBLISHED_FILES["waveglow"]


def test_a_recipe_naming_checkpoints_counts_as_given(workdir, demo_files, tiny_checkpoints):
    put(workdir, demo_files, *DEMO_FILES)
    tacotron2, waveglow = tiny_checkpoints
    (workdir / "mine.yaml").write_text(f"tacotron2: {tacotron2}\nwaveglow: {waveglow}\n")
    result = synth("--recipe", "mine.yaml")
    assert result.exit_code == 0, result.output
    assert notices(result) == []


def test_the_fingerprint_hashes_the_files_the_voice_uses(workdir, demo_files, tiny_checkpoints):
    put(workdir, demo_files, *DEMO_FILES)
    demo = {kind: file_digest(demo_files / name) for kind, name in DEMO_FILES.items()}
    assert resolve_voice(Settings(device="cpu")).fingerprint == demo
    publish(workdir, tiny_checkpoints, "tacotron2")
    assert resolve_voice(Settings(device="cpu")).fingerprint == demo, "one published file alone is not used"
    publish(workdir, tiny_checkpoints, "waveglow")
    assert resolve_voice(Settings(device="cpu")).fingerprint == {kind: file_digest(path) for kind, path
                                             in zip(PUBLISHED_FILES, tiny_checkpoints)}


def test_switching_from_the_demo_voice_to_nvidias_redoes_every_line(workdir, demo_files,
                                                                   tiny_checkpoints):
    put(workdir, demo_files, *DEMO_FILES)
    assert synth().exit_code == 0
    before, keys = mtimes(workdir / "out"), [r["key"] for r in manifest(workdir / "out")]
    again = synth()
    assert again.exit_code == 0 and "2 reused" in again.output, "same voice: nothing redone"
    publish(workdir, tiny_checkpoints)
    result = synth()
    assert result.exit_code == 0, result.output
    assert "0 reused" in result.output and notices(result) == []
    after = mtimes(workdir / "out")
    assert all(after[name] != stamp for name, stamp in before.items())
    assert all(new != old for new, old in zip([r["key"] for r in manifest(workdir / "out")], keys))


def test_a_voice_runs_with_its_own_denoiser_strength_unless_one_is_asked_for(workdir, demo_files,
                                                                             tiny_checkpoints):
    put(workdir, demo_files, *DEMO_FILES)
    strength = lambda **given: make_engine(Settings(device="cpu", **given), []).settings.denoiser_strength
    assert strength() == 0.0, "the demo WaveGlow file says 0"
    assert strength(denoiser_strength=0.02) == 0.02
    given = {kind: str(workdir / "checkpoints" / name) for kind, name in DEMO_FILES.items()}
    publish(workdir, tiny_checkpoints)
    assert strength(waveglow=given["waveglow"]) == 0.0, "the demo WaveGlow behind NVIDIA's Tacotron2"
    assert strength(tacotron2=given["tacotron2"]) == 0.01, "NVIDIA's WaveGlow behind the demo Tacotron2"
    assert strength() == 0.01, "NVIDIA's voice keeps the reference's denoiser"
    assert strength(denoiser_strength=0.0) == 0.0


def renamed_copies(demo_files, folder):
    """The demo voice's files copied into ``folder`` under other names, as
    --tacotron2 / --waveglow options."""
    folder.mkdir()
    for kind, name in DEMO_FILES.items():
        shutil.copy(demo_files / name, folder / f"my_{kind}.ckpt")
    return ("--tacotron2", str(folder / "my_tacotron2.ckpt"), "--waveglow", str(folder / "my_waveglow.ckpt"))


def test_a_renamed_copy_of_the_demo_voice_keeps_its_settings_and_redoes_nothing(workdir, demo_files):
    put(workdir, demo_files, *DEMO_FILES)
    assert synth().exit_code == 0
    before, keys = mtimes(workdir / "out"), [r["key"] for r in manifest(workdir / "out")]
    copies = renamed_copies(demo_files, workdir / "elsewhere")
    original, copy = resolve_voice(Settings(device="cpu")), resolve_voice(Settings(
        device="cpu", tacotron2=copies[1], waveglow=copies[3]))
    assert voice_settings(Path(copies[3])) == VoiceInfo("demo", 22050, 0.0)
    assert audio_identity(Settings(), copy) == audio_identity(Settings(), original)
    result = synth(*copies)
    assert result.exit_code == 0, result.output
    assert "2 reused" in result.output
    assert mtimes(workdir / "out") == before and [r["key"] for r in manifest(workdir / "out")] == keys


def test_nvidias_files_carry_no_settings_and_get_the_reference_values(workdir, tiny_checkpoints):
    publish(workdir, tiny_checkpoints)
    voice = resolve_voice(Settings(device="cpu"))
    assert voice_settings(voice.waveglow) == VoiceInfo("waveglow_256channels_universal_v5", 22050, 0.01)
    assert synth().exit_code == 0
    assert {sf.info(str(p)).samplerate for p in (workdir / "out" / "wavs").iterdir()} == {22050}


@pytest.fixture(scope="session")
def voice_at_16k(tmp_path_factory):
    """(tacotron2, waveglow) of a voice whose WaveGlow file says 16 kHz and no denoiser."""
    folder = tmp_path_factory.mktemp("voice16k")
    write_ngc_tacotron2(folder / "t.pt", canonical(tiny_tacotron2(seed=8)))
    write_ngc_waveglow(folder / "w.pt", canonical(tiny_waveglow(seed=8)),
                       voice={"name": "sixteen", "sample_rate": 16000, "denoiser_strength": 0.0})
    return ("--tacotron2", str(folder / "t.pt"), "--waveglow", str(folder / "w.pt"))


def rates(out):
    return {sf.info(str(p)).samplerate for p in (out / "wavs").iterdir()}


def test_the_wavs_and_the_manifest_take_the_voices_sample_rate_unless_the_run_sets_one(workdir, voice_at_16k):
    assert synth(*voice_at_16k).exit_code == 0
    assert rates(workdir / "out") == {16000}
    assert all(r["duration"] == pytest.approx(r["num_samples"] / 16000, abs=1e-6) for r in manifest(workdir / "out"))
    again = synth(*voice_at_16k)
    assert again.exit_code == 0 and "2 reused" in again.output, again.output
    # Other values set by the run win over the voice's.
    (workdir / "other.yaml").write_text("sample_rate: 24000\n")
    other = synth(*voice_at_16k, "--recipe", "other.yaml", "--denoiser-strength", "0.02")
    assert other.exit_code == 0 and "0 reused" in other.output, other.output
    assert rates(workdir / "out") == {24000}
    assert all(r["duration"] == pytest.approx(r["num_samples"] / 24000, abs=1e-6) for r in manifest(workdir / "out"))
    settings = Settings(device="cpu", tacotron2=voice_at_16k[1], waveglow=voice_at_16k[3],
                        sample_rate=24000, denoiser_strength=0.02)
    own = voice_settings(Path(voice_at_16k[3]))
    assert own == VoiceInfo("sixteen", 16000, 0.0)
    assert with_voice(settings, own) == settings, "the run's own values win"
    assert with_voice(Settings(), own).sample_rate == 16000


def test_a_voice_s_rate_flac_cannot_store_ends_the_run_in_one_line_before_any_work(workdir, tmp_path):
    """96,001 Hz is a rate WAV takes and FLAC does not (above 65,535 Hz only
    whole tens): refused before a line is made, not as a write error per line."""
    waveglow = tmp_path / "w.pt"
    write_ngc_waveglow(waveglow, canonical(tiny_waveglow(seed=8)), voice={"sample_rate": 96001})
    write_ngc_tacotron2(tmp_path / "t.pt", canonical(tiny_tacotron2(seed=8)))
    voice = ("--tacotron2", str(tmp_path / "t.pt"), "--waveglow", str(waveglow))
    result = synth(*voice, "--audio-format", "flac")
    [error] = [line for line in result.output.splitlines() if line.startswith("tts-batch: error")]
    assert result.exit_code == 2 and f"{waveglow} makes audio at 96001 Hz" in error and "pass --sample-rate" in error
    assert not (workdir / "out" / "wavs").exists()
    assert synth(*voice, "--audio-format", "flac", "--sample-rate", "96000").exit_code == 0
    assert rates(workdir / "out") == {96000}


def test_a_wrong_voice_entry_ends_the_run_in_one_line_naming_the_file(workdir, tmp_path):
    waveglow = tmp_path / "bad.pt"
    write_ngc_waveglow(waveglow, canonical(tiny_waveglow(seed=8)), voice={"sample_rate": "22.05 kHz"})
    write_ngc_tacotron2(tmp_path / "t.pt", canonical(tiny_tacotron2(seed=8)))
    result = synth("--tacotron2", str(tmp_path / "t.pt"), "--waveglow", str(waveglow))
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("tts-batch: error")]
    assert len(lines) == 1 and str(waveglow) in lines[0] and "sample_rate must be" in lines[0], lines
    assert not (workdir / "out" / "wavs").exists()


@pytest.fixture(scope="session")
def silent_waveglow(tmp_path_factory):
    """(tacotron2, waveglow) whose WaveGlow makes silence from silence, as
    the demo voice's does: at sigma 0 its output is zero for any mel (its
    ``end`` layers are zero), so its bias spectrum, the denoiser's, is zero."""
    folder = tmp_path_factory.mktemp("silent")
    waveglow = tiny_waveglow(seed=9)
    for flow in waveglow.WN:
        flow.end.weight.data.zero_()
        flow.end.bias.data.zero_()
    write_ngc_tacotron2(folder / "t.pt", canonical(tiny_tacotron2(seed=9)))
    write_ngc_waveglow(folder / "w.pt", canonical(waveglow))
    return ("--tacotron2", str(folder / "t.pt"), "--waveglow", str(folder / "w.pt"))


def test_a_denoiser_that_cannot_act_says_so_in_one_line_and_leaves_the_audio(workdir, silent_waveglow):
    said = lambda result: [line for line in result.output.splitlines() if "denoiser" in line]
    result = synth(*silent_waveglow, "--denoiser-strength", "0.05")
    assert result.exit_code == 0, result.output
    assert said(result) == [
        "denoiser strength 0.05 has no effect with this WaveGlow: its output for an all-zero mel, "
        "the bias the denoiser removes, is silence; running without the denoiser"]
    none = synth(*silent_waveglow, "--denoiser-strength", "0", out="none")
    assert none.exit_code == 0 and said(none) == []
    for name in mtimes(workdir / "out"):
        mine = sf.read(workdir / "out" / "wavs" / name, dtype="int16")[0]
        assert np.array_equal(mine, sf.read(workdir / "none" / "wavs" / name, dtype="int16")[0]), name


def test_file_digest_is_sha256_of_bytes(tmp_path):
    path = tmp_path / "blob.pt"
    data = os.urandom(3 * (1 << 20) + 17)  # spans several read chunks
    path.write_bytes(data)
    assert file_digest(path) == hashlib.sha256(data).hexdigest()
    assert file_digest(str(path)) == file_digest(path)
    path.write_bytes(data[:-1])
    assert file_digest(path) == hashlib.sha256(data[:-1]).hexdigest()
    with pytest.raises(FatalError, match="nowhere.pt: cannot read"):
        file_digest(tmp_path / "nowhere.pt")


@pytest.fixture
def settled_at_once(monkeypatch, tmp_path):
    """A digest cache of the test's own, which keeps a file's digest however
    recently the file changed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(voice, "SETTLED_SECONDS", -1.0)
    return tmp_path / "cache" / "tts-batch" / "digests"


def test_a_files_digest_is_kept_between_runs_and_read_instead_of_the_file(settled_at_once, tmp_path, monkeypatch):
    path = tmp_path / "waveglow.pt"
    path.write_bytes(os.urandom(1 << 16))
    assert remembered_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(list(settled_at_once.iterdir())) == 1

    def unread(name):
        raise AssertionError(f"{name} hashed again")
    monkeypatch.setattr(voice, "file_digest", unread)
    assert remembered_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_rewritten_in_place_with_its_size_and_modification_time_is_hashed_again(settled_at_once, tmp_path):
    path = tmp_path / "waveglow.pt"
    path.write_bytes(b"a" * 4096)
    before = remembered_digest(path)
    kept_times = os.stat(path)
    time.sleep(0.05)   # past the file system's timestamp resolution
    with open(path, "r+b") as f:   # the same inode and size, other bytes
        f.write(b"b" * 4096)
    os.utime(path, ns=(kept_times.st_atime_ns, kept_times.st_mtime_ns))
    assert remembered_digest(path) == hashlib.sha256(b"b" * 4096).hexdigest() != before
    path.unlink()
    path.write_bytes(b"c" * 4096)   # replaced: another inode
    assert remembered_digest(path) == hashlib.sha256(b"c" * 4096).hexdigest()


def test_a_just_written_file_is_not_kept_and_an_unwritable_cache_still_gives_the_digest(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    path = tmp_path / "tacotron2.pt"
    path.write_bytes(b"x" * 100)
    assert remembered_digest(path) == hashlib.sha256(b"x" * 100).hexdigest()
    assert not cache.exists()   # changed this instant: a same-size rewrite could keep its times
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(voice, "SETTLED_SECONDS", -1.0)
    assert remembered_digest(path) == hashlib.sha256(b"x" * 100).hexdigest()
    with pytest.raises(FatalError, match="nowhere.pt: cannot read"):
        remembered_digest(tmp_path / "nowhere.pt")
