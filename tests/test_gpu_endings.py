"""How runs end on a GPU (marked requires_cuda; CI has no GPU and skips
them): a real CUDA out-of-memory splits the batch and the run finishes; a
second signal ends the command as cleanly as the first; two processes
sharing the work write what one process writes.

The out-of-memory test needs torch alone. The others run the command, so
they also need soundfile, inflect and Unidecode; without them they skip.
Run with -s to see what each measured.
"""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tts_cli.checkpoints import load_tacotron2_weights, load_waveglow_weights
from tts_cli.engine import Engine, Job, SynthesisError
from tts_cli.tacotron2 import Tacotron2
from tts_cli.waveglow import WaveGlow
from tiny_models import engine_settings, force_lengths

pytestmark = pytest.mark.requires_cuda

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "checkpoints"
TRANSCRIPTS = ROOT / "tts_cli" / "data" / "ljspeech_2000.psv"


# every line demo_engine() decodes is this many frames long
FRAMES = 300


def demo_engine() -> Engine:
    """The shipped demo voice on the GPU, fp32, WaveGlow allowed 15 GiB:
    a batch goes through WaveGlow whole unless memory runs out. Every line
    FRAMES frames long, its gate aside."""
    tacotron2 = force_lengths(Tacotron2.from_state_dict(load_tacotron2_weights(DEMO / "demo_tacotron2.pt")),
                              lambda lengths: torch.full_like(lengths, FRAMES))
    waveglow = WaveGlow.from_state_dict(load_waveglow_weights(DEMO / "demo_waveglow.pt"))
    settings = engine_settings(denoiser_strength=0.0, max_decoder_steps=400, waveglow_memory=15.0)
    return Engine(tacotron2, waveglow, torch.device("cuda"), torch.float32, settings)


def jobs(count: int, symbols: int) -> list[Job]:
    """Lines of letters (symbol ids 38..63), FRAMES frames each from ``demo_engine()``."""
    return [Job([38 + (7 * i + 3 * k) % 26 for k in range(symbols)], seed=i) for i in range(count)]


def run(engine: Engine, batch: list[Job]) -> list:
    return list(engine.synthesize_all([batch]))


def rel(a, b) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("where", ["waveglow", "new shape"])
def test_a_real_out_of_memory_splits_the_batch_and_the_run_finishes(where):
    # "waveglow": the batch's decoder graph exists; WaveGlow's 64 lines do not
    # fit in what is left. "new shape": a batch whose decoder graph must be
    # captured with the device nearly full (and its halves' graphs while
    # WaveGlow works on the other thread).
    engine = demo_engine()
    batch = jobs(64, 80)
    reference = run(engine, batch)
    assert len(reference) == 1 and not isinstance(reference[0][1], Exception)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run(engine, batch[:1])
    need_one = torch.cuda.max_memory_allocated() - base
    if where == "new shape":
        batch = jobs(64, 150)   # another memory bucket: a graph not captured yet
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    headroom = max(6 * need_one, 256 * 2 ** 20)
    filler = torch.empty(free - headroom, dtype=torch.uint8, device="cuda")
    try:
        out = run(engine, batch)
    finally:
        del filler
        torch.cuda.empty_cache()
    errors = [(js, r) for js, r in out if isinstance(r, Exception)]
    print(f"\n{where}: {len(out)} groups from a batch of 64 with {headroom / 2 ** 20:.0f} MiB free "
          f"(one line needs {need_one / 2 ** 20:.0f} MiB); {len(errors)} failed alone")
    assert sorted(j.seed for js, _ in out for j in js) == list(range(64)), "every line comes back once"
    assert len(out) > 1, "the batch was not split"
    for js, r in errors:
        assert len(js) == 1 and isinstance(r, SynthesisError) and r.out_of_memory, (len(js), r)
    # with room for one line six times over, every line is made (the README says so)
    assert errors == []
    if where == "waveglow":
        made = {j.seed: result for js, rs in out if not isinstance(rs, Exception) for j, result in zip(js, rs)}
        for job, result in zip(reference[0][0], reference[0][1]):
            if job.seed in made:
                assert made[job.seed].frames == result.frames
                assert rel(made[job.seed].audio, result.audio) < 1e-3


def command_ready():
    for module in ("soundfile", "inflect", "unidecode"):
        pytest.importorskip(module)


def corpus(folder: Path, lines: int) -> Path:
    path = folder / "metadata.csv"
    path.write_text("".join(TRANSCRIPTS.read_text().splitlines(keepends=True)[:lines]))
    return path


def tts_batch(args, **env):
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])   # keeps packages carried there
    return subprocess.Popen([sys.executable, "-m", "tts_cli", *map(str, args)],
                            env={**os.environ, "PYTHONPATH": path, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_any_number_of_signals_end_a_gpu_run_cleanly(tmp_path):
    command_ready()
    out = tmp_path / "out"
    process = tts_batch([corpus(tmp_path, 1024), "-o", out, "--format", "ljspeech", "--device", "cuda",
                         "--seed", "1", "--quiet"])
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline and len(list(out.glob("wavs/*.wav"))) < 128:
        time.sleep(0.01)
    assert process.poll() is None, process.stderr.read()
    process.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    time.sleep(0.05)
    while process.poll() is None:
        process.send_signal(signal.SIGTERM)
        time.sleep(0.02)
    stderr = process.stderr.read()
    print(f"\nended {time.monotonic() - signalled:.2f} s after the first signal")
    assert process.returncode == 130, stderr
    assert "terminate called" not in stderr and "Traceback" not in stderr, stderr
    # --quiet: the one line saying the run was stopped, beside warnings --quiet never hides (the demo voice)
    assert len([line for line in stderr.splitlines() if "warning:" not in line]) == 1, stderr


def test_two_processes_on_one_gpu_write_bitwise_what_one_process_writes(tmp_path):
    # Started by hand as torchrun would start them, both on GPU 0
    # (LOCAL_RANK 0): each takes whole batches of the one-process plan.
    command_ready()
    import soundfile as sf
    lines = corpus(tmp_path, 64)
    args = [lines, "--format", "ljspeech", "--device", "cuda", "--seed", "1", "--batch-size", "16",
            "--sample-format", "float32", "--quiet"]
    single = tts_batch([args[0], "-o", tmp_path / "one", *args[1:]])
    assert single.wait() == 0, single.stderr.read()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [tts_batch([args[0], "-o", tmp_path / "two", *args[1:]], WORLD_SIZE="2", RANK=str(rank),
                       LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for rank in (0, 1)]
    for process in ranks:
        assert process.wait() == 0, process.stderr.read()
    differ = []
    for wav in sorted((tmp_path / "one" / "wavs").glob("*.wav")):
        mine, theirs = (sf.read(folder / "wavs" / wav.name, dtype="float32")[0] for folder in
                        (tmp_path / "two", tmp_path / "one"))
        if mine.tobytes() != theirs.tobytes():
            differ.append((wav.stem, float(abs(mine - theirs).max()) if len(mine) == len(theirs) else "length"))
    print(f"\n{len(differ)} of 64 WAVs differ: {differ[:5]}")
    assert differ == []
