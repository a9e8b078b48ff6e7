"""What both training scripts share: precision, time budget, checkpoints, logs."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import torch
from torch import Tensor

from tts_cli.checkpoints import VoiceInfo, voice_entry

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# What a demo WaveGlow export says about its voice (tts_cli.checkpoints'
# voice entry), so that tts-batch runs it so under any file name. espeak-ng
# writes 22,050 Hz. No denoiser: its probe, an all-zero log mel, gives
# silence from the constructed WaveGlow (its carriers scale with the mel),
# so there is nothing to subtract; a trained one's output there is ~2,000
# times full scale (the probe lies far above every espeak-ng mel), and
# subtracting even 0.01 of it left near silence. At sigma 0 its own output
# for real mels is about -74 dB below full scale.
DEMO_VOICE = voice_entry(VoiceInfo(name="demo", sample_rate=22050, denoiser_strength=0.0))


def default_precision(device: str) -> str:
    # bf16 needs no loss scaling and is what Hopper runs fastest; CPU tests use fp32.
    return "bf16" if device.startswith("cuda") else "fp32"


def autocast(device: str, precision: str):
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def grad_scaler(device: str, precision: str) -> torch.amp.GradScaler:
    # Only fp16 can underflow small gradients; bf16 has fp32's exponent range.
    return torch.amp.GradScaler(torch.device(device).type, enabled=precision == "fp16")


class Budget:
    """Wall-clock time left of --minutes, so a run ends (and saves) before the
    device machine's 10-minute limit kills it."""

    def __init__(self, minutes: float):
        self.start = time.monotonic()
        self.seconds = minutes * 60.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def spent(self) -> bool:
        return self.elapsed() >= self.seconds


def save_checkpoint(path: Path, compressed: bool = False, **state) -> None:
    """torch.save under a temporary name, then rename: a kill mid-save leaves
    the previous checkpoint whole. ``compressed``: the zip's entries deflated
    (torch.save stores them raw). torch.load reads such a file as it is,
    except with mmap=True, which neither our loader nor NVIDIA's code uses;
    the demo WaveGlow's fixed upsampler, zero but for its diagonal, shrinks
    from 13.1 MB to almost nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if compressed:
        raw = io.BytesIO()
        torch.save(state, raw)
        with zipfile.ZipFile(raw) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for entry in src.infolist():
                dst.writestr(entry.filename, src.read(entry.filename))
    else:
        torch.save(state, tmp)
    tmp.replace(path)


class Diverged(RuntimeError):
    """The weights stopped being finite; nothing is saved over the last good checkpoint."""


def require_finite(parameters, step: int, checkpoint: Path) -> None:
    """Raise Diverged unless every parameter is finite. Called before every
    save, and when a logged loss is not finite: a captured step has no
    gradient scaler to skip a bad update, so one NaN reaches every weight."""
    if not all(bool(torch.isfinite(p).all()) for p in parameters):
        raise Diverged(f"training diverged by step {step}: the weights are no longer finite. Nothing was "
                       f"saved over {checkpoint}, which keeps the last good step; resume from it with a "
                       f"lower --lr")


def skip_if_not_finite(parameters, grad_norm: Tensor, skipped_in_a_row: Tensor,
                       skipped_in_all: Tensor) -> None:
    """Make this step a no-op for the weights where its gradient is not
    finite (what a GradScaler does for fp16; a captured bf16 step has none):
    the gradients are zeroed, so Adam moves the weights by its momentum alone
    instead of spreading a NaN into every one. Branch-free, so it runs inside
    a CUDA graph. ``skipped_in_a_row`` and ``skipped_in_all`` (0-d device
    tensors) count the skipped steps, consecutive (a finite step resets it)
    and in all."""
    finite = torch.isfinite(grad_norm)
    for p in parameters:
        if p.grad is not None:
            p.grad.nan_to_num_(0.0, 0.0, 0.0).mul_(finite)
    skipped_in_a_row.add_(1).mul_(~finite)
    skipped_in_all.add_(~finite)


def require_few_skipped(skipped_in_a_row: Tensor, limit: int, step: int, checkpoint: Path) -> None:
    """Raise Diverged once ``limit`` steps in a row had no finite gradient:
    the weights are finite but no batch trains them any more."""
    if int(skipped_in_a_row) >= limit:
        raise Diverged(f"training diverged by step {step}: its last {int(skipped_in_a_row)} steps had no "
                       f"finite gradient. Nothing was saved over {checkpoint}, which keeps the last good "
                       f"step; resume from it with a lower --lr")


def run_training(train, args, script: str) -> int:
    """train(args) as a script's exit status: 0, or 3 after Diverged (one line on stderr)."""
    try:
        train(args)
    except Diverged as e:
        print(f"{script}: {e}", file=sys.stderr)
        return 3
    return 0


def load_checkpoint(path: Path) -> dict | None:
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def run_dims(default, overrides: dict | None, saved: dict | None):
    """The model size of a run: the one its checkpoint was trained at when it
    resumes (so resuming or exporting a run of another size needs no --dims
    again), else ``default`` with --dims ``overrides``. A --dims that
    contradicts the checkpoint is an error, not a silent choice."""
    wanted = dataclasses.replace(default, **overrides) if overrides else default
    if saved is None or "dims" not in saved:
        return wanted
    trained = type(default)(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved["dims"].items()})
    if overrides and wanted != trained:
        raise SystemExit(f"--dims {overrides} differs from the checkpoint's model size {saved['dims']}; "
                         "leave --dims out to resume it, or use a new --out")
    return trained


def waveglow_config(dims) -> dict:
    """The ``config`` of a WaveGlow export (NVIDIA's key names) for
    ``tts_cli.waveglow.WaveGlowDims``: what ``tts_cli.checkpoints`` reads
    the architecture from."""
    return {"n_mel_channels": dims.n_mel, "n_flows": dims.n_flows, "n_group": dims.n_group,
            "n_early_every": dims.n_early_every, "n_early_size": dims.n_early_size,
            "WN_config": {"n_layers": dims.wn_layers, "kernel_size": dims.wn_kernel,
                          "n_channels": dims.wn_channels}}


def read_export(path: Path) -> tuple[dict, int, dict]:
    """A trainer's export (DeepLearningExamples layout): its state dict
    without the 'module.' prefix, the training step it was made at, and its
    config. The trainers start from one when a snapshot has no optimizer
    state (``--init-from``)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    state = {k.removeprefix("module."): v for k, v in saved["state_dict"].items()}
    return state, int(saved["config"].get("demo_voice_step", saved.get("epoch", 0))), saved["config"]


def use_graphs(args) -> bool:
    """Replay whole training steps from CUDA graphs: on CUDA, unless
    --no-graphs, and not in fp16 (a GradScaler's skipped steps cannot be
    replayed; bf16 needs no scaler)."""
    return args.graphs and args.device.startswith("cuda") and args.precision != "fp16"


# What a failed capture raises (an operation a graph cannot hold, an optimizer
# not set up for capture); the training scripts then go on eagerly.
CAPTURE_ERRORS = (RuntimeError, AssertionError)


def capture_failure(error: BaseException) -> str:
    """A failed capture's error for the log's "graphs off" line: its first
    line, up to 600 characters (200 cut off CUDA's allocated/reserved
    breakdown of an out-of-memory error)."""
    return str(error).splitlines()[0][:600] if str(error) else type(error).__name__


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict, captured: bool, lr: float) -> None:
    """load_state_dict, then this run's mode and learning rate: the saved
    param groups carry the saving run's ``capturable`` and ``lr`` (so --lr
    would otherwise be ignored on resume), and a capturable Adam keeps its
    step counts on the device."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group["capturable"] = captured
        group["lr"] = lr
        for p in group["params"]:
            entry = optimizer.state.get(p)
            if captured and entry:
                entry["step"] = entry["step"].to(p.device, torch.float32)


def warm_up_before_capture(step, times: int = 2) -> None:
    """Run ``step()`` (real training steps) on a side stream before the first
    capture: CUDA libraries set themselves up on first use, which a capture
    must not see."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            step()
    torch.cuda.current_stream().wait_stream(side)
    # The eager steps' memory stays cached for eager use, where the graphs'
    # pool cannot take it: at Tacotron2's batch 1024 (127 GiB eager) the first
    # capture then ran out of the H200's 139.8 GiB.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


class CapturedStep:
    """A whole training step, ``step(inputs) -> outputs`` (forward, backward,
    clipping, optimizer), captured once into a CUDA graph over the static
    tensors ``inputs``; fill them and ``replay()``. Eagerly a step launches
    thousands of small kernels from Python and the GPU mostly waits; replayed,
    the same kernels run back to back. Graphs given one ``pool`` share their
    memory: safe when they replay one at a time and each replay's outputs are
    read before the next (every tensor that lives across replays, inputs,
    weights, optimizer state, was allocated outside the pool)."""

    def __init__(self, step, inputs: dict, optimizer: torch.optim.Optimizer, pool=None):
        # The graph allocates its own gradients; set_to_none keeps this capture
        # from adding into another graph's (or the warm-up's).
        optimizer.zero_grad(set_to_none=True)
        self.inputs = inputs
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = step(inputs)

    def replay(self):
        self.graph.replay()
        return self.outputs


def gpu_memory(device: str) -> dict[str, float]:
    """Peak GPU memory so far, for the log (nothing on CPU)."""
    if not device.startswith("cuda"):
        return {}
    return {"peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}


class Log:
    """One JSON object per line in OUT/log.jsonl (appended across resumed runs)
    and a short line on stdout."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "log.jsonl"

    def write(self, **row) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)


def epoch_batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """This epoch's batches: every item once, each batch of similar lengths
    (less padding), the order random. A pure function of (seed, epoch), so a
    resumed run needs only its step count to continue where it stopped."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    pool = batch_size * 16
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start:start + pool], key=lambda i: lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


class BatchOrder:
    """Step -> batch through epoch_batches, the current epoch kept (re-sorting
    13,000 lengths every step would cost more than nothing)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self.per_epoch = len(epoch_batches(lengths, batch_size, seed, 0))
        self.epoch, self.batches = -1, []

    def __call__(self, step: int) -> list[int]:
        epoch = step // self.per_epoch
        if epoch != self.epoch:
            self.epoch, self.batches = epoch, epoch_batches(
                self.lengths, self.batch_size, self.seed, epoch)
        return self.batches[step % self.per_epoch]


def training_arguments(description: str, data_help: str, defaults: dict) -> argparse.ArgumentParser:
    """The options both training scripts share; ``defaults`` sets each
    script's own max_steps, batch_size, lr and log_every."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", type=Path, required=True, help=data_help)
    p.add_argument("--out", type=Path, required=True, help="checkpoint, log and export folder")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of this run")
    p.add_argument("--max-steps", type=int, default=defaults["max_steps"])
    p.add_argument("--batch-size", type=int, default=defaults["batch_size"])
    p.add_argument("--lr", type=float, default=defaults["lr"])
    p.add_argument("--precision", choices=sorted(PRECISIONS), default=None)
    p.add_argument("--device", default=device)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-every", type=int, default=defaults["log_every"])
    p.add_argument("--save-every-minutes", type=float, default=2.0)
    p.add_argument("--no-graphs", dest="graphs", action="store_false",
                   help="on CUDA, run steps eagerly instead of replaying captured graphs")
    p.add_argument("--init-from", type=Path, default=None,
                   help="with no checkpoint in --out yet: start from this export's weights and step "
                        "(a committed snapshot, recipes/demo-voice/snapshot/) with a fresh optimizer")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the held-out progress check at each save")
    return p


def finish_arguments(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    args.precision = args.precision or default_precision(args.device)
    return args


def parse_dims(text: str) -> dict:
    """'a=1,b=2:3' -> {'a': 1, 'b': (2, 3)}: model size overrides (the tests use tiny ones)."""
    dims = {}
    for item in text.split(","):
        key, value = item.split("=")
        dims[key] = tuple(int(v) for v in value.split(":")) if ":" in value else int(value)
    return dims
