"""The demo voice shipped in checkpoints/ (made by recipes/demo-voice): with no
checkpoint options and NVIDIA's files absent, a run picks it up through the
normal loading path and speaks on CPU at a plausible length and level."""
import functools
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import soundfile
import torch
from click.testing import CliRunner

from outputs import manifest
from tts_cli.checkpoints import VoiceInfo, read_voice_info
from tts_cli.cli import main
from tts_cli.config import Settings
from tts_cli.resume import audio_identity
from tts_cli.loading import make_engine, voice_settings
from tts_cli.voice import DEMO_FILES, PUBLISHED_FILES, resolve_voice

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints"
LINES = ["The demo voice speaks at once, with no download.", "It cost $3.50 in 1963."]
# espeak-ng reads at 175 words a minute, about 15 characters of normalized
# text a second; the demo voice learned its timing from it.
CHARACTERS_PER_SECOND = 15


def test_both_demo_files_are_shipped_within_30_mb():
    files = [SHIPPED / name for name in DEMO_FILES.values()]
    assert all(f.is_file() for f in files), files
    assert sum(f.stat().st_size for f in files) <= 30_000_000


@pytest.fixture
def fresh_run(tmp_path, monkeypatch):
    """An empty working directory (no ./checkpoints), as on a fresh clone."""
    if any((SHIPPED / name).exists() for name in PUBLISHED_FILES.values()):
        pytest.skip("NVIDIA's files are in checkpoints/: they, not the demo voice, are the default")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("\n".join(LINES) + "\n")
    return tmp_path


def test_with_no_checkpoint_options_the_shipped_demo_voice_speaks(fresh_run):
    result = CliRunner().invoke(main, ["corpus.txt", "-o", "out", "--device", "cpu", "--seed", "1"])
    assert result.exit_code == 0, result.output
    notices = [line for line in result.output.splitlines() if "using the demo voice" in line]
    assert len(notices) == 1 and notices[0].startswith("using the demo voice ("), result.output
    rows = manifest(fresh_run / "out")
    assert [r["status"] for r in rows] == ["ok", "ok"]    # the gate stopped both
    for row in rows:
        audio, rate = soundfile.read(fresh_run / "out" / row["audio_filepath"], dtype="float32")
        audio = torch.from_numpy(audio)
        expected = len(row["normalized_text"]) / CHARACTERS_PER_SECOND
        assert 0.5 * expected < len(audio) / rate < 2 * expected, row
        rms = audio.pow(2).mean().sqrt().item()
        assert 0.01 < rms < 0.5, (row["id"], rms)                     # not silence, not blaring
        assert row["clipped_samples"] < 0.001 * len(audio), row
        # speech comes and goes: 20 ms frames vary in level, unlike steady noise or a hum
        frames = audio[: len(audio) // 441 * 441].view(-1, 441).pow(2).mean(1).sqrt()
        assert frames.std() > 0.3 * frames.mean(), row["id"]


def test_the_demo_waveglow_carries_the_demo_voices_settings():
    assert read_voice_info(SHIPPED / DEMO_FILES["waveglow"]) == VoiceInfo(
        name="demo", sample_rate=22050, denoiser_strength=0.0)


def test_a_renamed_copy_of_the_demo_voice_is_the_same_voice(fresh_run):
    copies = {}
    for kind, name in DEMO_FILES.items():
        copies[kind] = str(fresh_run / f"{kind}-copy.pt")
        shutil.copy(SHIPPED / name, copies[kind])
    original = resolve_voice(Settings(device="cpu"))
    copy = resolve_voice(Settings(device="cpu", **copies))
    assert original.demo and not copy.demo
    assert voice_settings(copy.waveglow) == voice_settings(original.waveglow) == \
        VoiceInfo("demo", 22050, 0.0)
    assert audio_identity(Settings(), copy) == audio_identity(Settings(), original)


def test_a_denoiser_asked_of_the_demo_voice_says_in_one_line_that_it_cannot_act(fresh_run):
    # The demo WaveGlow's carriers scale with the mel: an all-zero mel, the
    # denoiser's probe, gives silence, so there is no bias to subtract.
    notices = []
    engine = make_engine(Settings(device="cpu", denoiser_strength=0.05), notices)
    assert engine.denoiser is None
    said = [line for line in notices if "denoiser" in line]
    assert len(said) == 1 and said[0].startswith("denoiser strength 0.05 has no effect with this WaveGlow")


def test_a_wheel_carries_the_demo_voice_and_its_install_speaks_with_it(tmp_path):
    """`pip install .` (not -e) has no source tree beside the package: the
    wheel must carry the demo files, and the installed copy must find them."""
    pytest.importorskip("setuptools")
    root = SHIPPED.parent
    tree = tmp_path / "tree"    # built from a copy: the build leaves build/ behind
    shutil.copytree(root / "tts_cli", tree / "tts_cli", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "recipes", tree / "recipes", ignore=shutil.ignore_patterns("demo-voice", "__pycache__"))
    shutil.copytree(SHIPPED, tree / "checkpoints",   # without NVIDIA's files, if a developer has them there
                    ignore=shutil.ignore_patterns("__pycache__", *PUBLISHED_FILES.values()))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(root / name, tree / name)
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=300)
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                 "-w", str(tmp_path / "wheel"), str(tree)])
    assert built.returncode == 0, built.stderr[-2000:]
    site = tmp_path / "site"
    zipfile.ZipFile(next((tmp_path / "wheel").glob("*.whl"))).extractall(site)
    assert sorted(p.name for p in (site / "tts_cli" / "demo_voice").glob("demo_*.pt")) == sorted(DEMO_FILES.values())

    work = tmp_path / "work"
    work.mkdir()
    (work / "corpus.txt").write_text(LINES[1] + "\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    spoke = run([sys.executable, "-c", "import tts_cli, sys; from tts_cli.cli import main; "
                 "print(tts_cli.__file__, file=sys.stderr); main()",
                 "corpus.txt", "-o", "out", "--device", "cpu", "--seed", "1"], cwd=work, env=env)
    assert spoke.returncode == 0, spoke.stderr[-2000:]
    assert str(site / "tts_cli") in spoke.stderr        # the installed copy ran, not the source tree
    assert f"using the demo voice ({site / 'tts_cli' / 'demo_voice'}/demo_*.pt;" in spoke.stderr
    assert [r["status"] for r in manifest(work / "out")] == ["ok"]
