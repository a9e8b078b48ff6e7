"""How long tts-batch takes to end after the first Ctrl-C, and the run's peak memory.

Runs ``python -m tts_cli`` on the first LJSpeech transcripts shipped in
tts_cli/data/, waits until a batch's WAVs are written (the run is then in
its steady state: WaveGlow busy with one batch, the decoder with the next),
sends SIGINT and measures the time to the process's exit. Prints one line.

    python scripts/measure_exit.py                       # the demo voice, default device
    python scripts/measure_exit.py --voice published     # random weights in NVIDIA's published shapes
    python scripts/measure_exit.py --no-signal           # a whole run: its wall time and peak memory

``--voice published`` writes full-size Tacotron2 and WaveGlow checkpoints
with random weights (no download), the stop gate made never to fire, so
every line is ``--max-decoder-steps`` frames long (600, about 7 s: LJSpeech's
lines average 6.6 s) and marked truncated. Peak GPU memory is read from nvidia-smi, where there
is one (the process's whole use, CUDA context included).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = ROOT / "tts_cli" / "data" / "ljspeech_2000.psv"


def published_checkpoints(folder: Path) -> list[str]:
    """Random full-size models saved as plain state dicts, which load like NVIDIA's files."""
    import torch
    from tts_cli.tacotron2 import PUBLISHED_DIMS as TACOTRON2_DIMS, Tacotron2
    from tts_cli.waveglow import PUBLISHED_DIMS as WAVEGLOW_DIMS, WaveGlow

    torch.manual_seed(0)
    tacotron2, waveglow = Tacotron2(TACOTRON2_DIMS), WaveGlow(WAVEGLOW_DIMS)
    for conv in waveglow.convinv:   # random rotations, invertible, as WaveGlow initialises them
        c = conv.conv.weight.shape[0]
        conv.conv.weight.data = torch.linalg.qr(torch.randn(c, c))[0][:, :, None]
    gate = tacotron2.decoder.gate_layer.linear_layer   # never stops: every line is --max-decoder-steps long
    gate.weight.data.zero_()
    gate.bias.data.fill_(-10.0)
    paths = [folder / "tacotron2.pt", folder / "waveglow.pt"]
    for model, path in zip((tacotron2, waveglow), paths):
        torch.save(model.state_dict(), path)
    return ["--tacotron2", str(paths[0]), "--waveglow", str(paths[1])]


class GpuMemory(threading.Thread):
    """The most GPU memory nvidia-smi reports for ``pid``, polled."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak_mib, self.done = pid, None, threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                       "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                      timeout=10).stdout.splitlines()
            except (OSError, subprocess.SubprocessError):
                return
            for row in rows:
                pid, _, used = row.partition(",")
                if pid.strip() == str(self.pid) and used.strip().isdigit():
                    self.peak_mib = max(self.peak_mib or 0, int(used))
            self.done.wait(0.2)


def default_batch_size(device: str | None) -> int:
    import torch
    from tts_cli.config import BATCH_SIZES
    on_gpu = device != "cpu" and (device is not None or torch.cuda.is_available())
    return BATCH_SIZES["cuda" if on_gpu else "cpu"]


def wavs(out: Path) -> int:
    folder = out / "wavs"
    return sum(1 for _ in folder.glob("*.wav")) if folder.is_dir() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voice", choices=("demo", "published"), default="demo")
    parser.add_argument("--device", help="passed to tts-batch (default: its own)")
    parser.add_argument("--lines", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, help="passed to tts-batch (default: its own)")
    parser.add_argument("--max-decoder-steps", type=int, help="default: 600 for --voice published")
    parser.add_argument("--after-wavs", type=int, help="signal once this many WAVs are written "
                                                       "(default: one batch's)")
    parser.add_argument("--no-signal", action="store_true", help="let the run finish")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it")
    a = parser.parse_args()

    work = a.keep or Path(tempfile.mkdtemp(prefix="tts-exit-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus, out = work / "metadata.csv", work / "out"
    corpus.write_text("".join(TRANSCRIPTS.read_text(encoding="utf-8").splitlines(keepends=True)[: a.lines]),
                      encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "tts_cli", str(corpus), "-o", str(out), "--format", "ljspeech",
               "--seed", "1", "--quiet"]
    steps = a.max_decoder_steps or (600 if a.voice == "published" else None)
    if a.voice == "published":
        command += published_checkpoints(work)
    for flag, value in (("--device", a.device), ("--batch-size", a.batch_size), ("--max-decoder-steps", steps)):
        if value is not None:
            command += [flag, str(value)]
    after = a.after_wavs or a.batch_size or default_batch_size(a.device)

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    gpu = GpuMemory(process.pid)
    if shutil.which("nvidia-smi"):
        gpu.start()
    stderr = []
    threading.Thread(target=lambda: stderr.extend(process.stderr), daemon=True).start()
    signalled = before = None
    if not a.no_signal:
        while wavs(out) < after and process.poll() is None:
            time.sleep(0.01)
        if process.poll() is None:
            before = wavs(out)
            process.send_signal(signal.SIGINT)
            signalled = time.monotonic()
    _, status, usage = os.wait4(process.pid, 0)
    ended = time.monotonic()
    gpu.done.set()
    code = os.waitstatus_to_exitcode(status)
    peak = f"peak RSS {usage.ru_maxrss / 2 ** 20:.2f} GiB" + (
        f", peak GPU {gpu.peak_mib / 1024:.2f} GiB" if gpu.peak_mib else "")
    what = f"device {a.device or 'default'}, {a.voice} voice, {a.lines} lines, batch {a.batch_size or 'default'}"
    if signalled is None:
        print(f"whole run: {ended - started:.1f} s, exit status {code}, {wavs(out)} WAVs; {peak}; {what}"
              + ("" if a.no_signal else " (it ended before the signal)"))
    else:
        print(f"exit after the first SIGINT: {ended - signalled:.2f} s (exit status {code}; "
              f"{wavs(out) - before} WAVs written after it, {before} before); {peak}; {what}")
    if code not in (0, 1, 130):
        print("".join(stderr[-5:]), end="", file=sys.stderr)
    if a.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
