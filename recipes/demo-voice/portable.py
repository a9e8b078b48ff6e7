"""Shrink a training checkpoint so it can travel to another machine, and
restore it there.

The device machine goes back when idle, and with it ``runs/``; the next run
may start on a fresh machine. ``checkpoint.pt`` is too big to carry (weights
+ both Adam moments in fp32: 50 MB for Tacotron2, 37 MB for WaveGlow, against
a 64 MiB carry). ``pack`` keeps the fp32 weights, the step and the loss
scaler, drops Adam's first moment (it forgets its past within ~10 steps at
beta1 = 0.9, so restarting it at zero costs nothing measurable) and keeps the
second moment in bf16 (it averages over ~1,000 steps at beta2 = 0.999 and
needs fp32's exponent range, which bf16 has): 60 % of the size.
``unpack`` rebuilds a checkpoint the training scripts resume from.

    python portable.py pack runs/tacotron2/checkpoint.pt tacotron2.resume.pt
    python portable.py unpack tacotron2.resume.pt runs/tacotron2/checkpoint.pt
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

import common


def pack(checkpoint: dict) -> dict:
    state = checkpoint["optimizer"]["state"]
    slim = {i: {"step": s["step"], "exp_avg_sq": s["exp_avg_sq"].to(torch.bfloat16)}
            for i, s in state.items()}
    optimizer = dict(checkpoint["optimizer"], state=slim)
    return dict(checkpoint, optimizer=optimizer, packed=True)


def unpack(packed: dict) -> dict:
    state = {i: {"step": s["step"],
                 "exp_avg": torch.zeros(s["exp_avg_sq"].shape, dtype=torch.float32),
                 "exp_avg_sq": s["exp_avg_sq"].float()}
             for i, s in packed["optimizer"]["state"].items()}
    checkpoint = {k: v for k, v in packed.items() if k != "packed"}
    checkpoint["optimizer"] = dict(packed["optimizer"], state=state)
    return checkpoint


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("pack", "unpack"):
        print(__doc__.strip().splitlines()[-2].strip(), file=sys.stderr)
        return 2
    verb, src, dst = argv[0], Path(argv[1]), Path(argv[2])
    checkpoint = common.load_checkpoint(src)
    if checkpoint is None:
        print(f"portable.py: {src} does not exist", file=sys.stderr)
        return 1
    common.save_checkpoint(dst, **(pack if verb == "pack" else unpack)(checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
