"""Memory follows the machine: WaveGlow's default budget is a share of what
the device has free (host RAM on CPU), and a run of the demo voice on CPU
stays small."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tts_cli import devices, loading
from tts_cli import engine as engine_module
from tts_cli.config import Settings, load_settings
from tts_cli.engine import Engine

GIB = 2 ** 30


def budget(settings, device):
    return engine_module.engine_settings(settings, torch.device(device)).waveglow_memory


@pytest.mark.parametrize("available_gib, expected", [(2, 2 / 16), (3.2, 0.2), (64, 0.25), (2048, 0.25)])
def test_on_cpu_the_default_budget_is_a_share_of_the_available_ram(monkeypatch, available_gib, expected):
    # A fixed budget fits no machine: the GPU's 15 GiB would let 100 short
    # lines of the demo voice take more RAM than a laptop has.
    monkeypatch.setattr(engine_module, "available_ram", lambda: available_gib * GIB)
    assert budget(load_settings(), "cpu") == pytest.approx(expected)


@pytest.mark.parametrize("free_gib, expected", [(139, 15.0), (24, 12.0), (3, 1.5), (0.1, 0.05)])
def test_on_a_gpu_the_default_budget_is_a_share_of_its_free_memory(monkeypatch, free_gib, expected):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * GIB), 141 * GIB))
    assert budget(load_settings(), "cuda") == pytest.approx(expected)


def test_a_budget_the_run_sets_is_kept_on_any_machine(monkeypatch):
    monkeypatch.setattr(engine_module, "available_ram", lambda: 1 * GIB)
    assert budget(load_settings(overrides={"waveglow_memory": 3.5}), "cpu") == 3.5
    assert budget(Settings(waveglow_memory=0.01), "cpu") == 0.01


def test_a_containers_memory_limit_counts_as_what_is_available(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")
    assert devices.available_ram(tmp_path) == 32 * GIB
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        cgroup = tmp_path / "sys/fs/cgroup"
        (cgroup / limit).parent.mkdir(parents=True, exist_ok=True)
        (cgroup / limit).write_text(f"{4 * GIB}\n")
        (cgroup / usage).write_text(f"{1 * GIB}\n")
        assert devices.available_ram(tmp_path) == 3 * GIB
        (cgroup / limit).write_text("max\n")   # no limit (cgroup v2 says so in words)
        (cgroup / usage).unlink()
    assert devices.available_ram(tmp_path / "nowhere") is None


def test_the_budget_bounds_what_waveglow_runs_at_once(monkeypatch):
    # The demo voice's WaveGlow in fp32 takes 3,904 bytes a row (one row per
    # 8 samples); 1/4 GiB holds 68,759 rows, about two and a half lines of 9 s.
    monkeypatch.setattr(engine_module, "available_ram", lambda: 64 * GIB)
    settings = load_settings(overrides={"device": "cpu"})
    engine = loading.make_engine(settings, [])
    assert isinstance(engine, Engine) and engine.max_waveglow_rows == 68_759


def test_a_100_line_run_of_the_demo_voice_on_cpu_stays_under_2_gb(tmp_path):
    # The shipped demo voice and the first 100 LJSpeech transcripts, each cut
    # at 200 decoder frames to keep the test short: WaveGlow's slices still
    # fill its budget (100 x 200 frames are 640,000 rows; a 15 GiB budget
    # would let the host take more than 2 GB here).
    corpus = tmp_path / "metadata.csv"
    data = Path(__file__).resolve().parent.parent / "tts_cli" / "data" / "ljspeech_2000.psv"
    corpus.write_text("".join(data.read_text().splitlines(keepends=True)[:100]))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    process = subprocess.Popen([sys.executable, "-m", "tts_cli", str(corpus), "-o", str(tmp_path / "out"),
                                "--format", "ljspeech", "--device", "cpu", "--max-decoder-steps", "200",
                                "--seed", "1", "--quiet"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) in (0, 1), process.stderr.read()
    assert len(list((tmp_path / "out" / "wavs").glob("*.wav"))) >= 95
    assert usage.ru_maxrss * 1024 < 2e9, f"peak resident {usage.ru_maxrss / 1e6:.2f} GB"
