"""Average the weights of several training checkpoints of one run.

States a few hundred steps apart on one trajectory (same learning rate and
options) scatter around the minimum they circle; their mean sits nearer it
than any one of them (Polyak averaging, as in stochastic weight averaging).
Only the floating-point weights are averaged; everything else (step, Adam
state, loss scaler, integer buffers) comes from the last checkpoint named,
so the result resumes and exports like it:

    python average.py runs/t2_avg/checkpoint.pt A/checkpoint.pt B/checkpoint.pt ...
    python train_tacotron2.py --data runs/data --out runs/t2_avg --minutes 0 --no-check
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

import common


def average(checkpoints: list[dict]) -> dict:
    """The last checkpoint, its floating weights replaced by the mean of all."""
    models = [c["model"] for c in checkpoints]
    shapes = [{name: tuple(t.shape) for name, t in m.items()} for m in models]
    if any(s != shapes[0] for s in shapes):
        raise ValueError("the checkpoints hold different weights (not one model of one size)")
    mean = {}
    for name, last in models[-1].items():
        if last.is_floating_point():
            mean[name] = torch.stack([m[name].float() for m in models]).mean(0).to(last.dtype)
        else:
            mean[name] = last
    return dict(checkpoints[-1], model=mean)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.split("\n\n")[2].strip(), file=sys.stderr)
        return 2
    out, sources = Path(argv[0]), [Path(p) for p in argv[1:]]
    checkpoints = [common.load_checkpoint(p) for p in sources]
    for path, checkpoint in zip(sources, checkpoints):
        if checkpoint is None:
            print(f"average.py: {path} does not exist", file=sys.stderr)
            return 1
    try:
        averaged = average(checkpoints)
    except ValueError as error:
        print(f"average.py: {', '.join(map(str, sources))}: {error}", file=sys.stderr)
        return 1
    common.save_checkpoint(out, **averaged)
    steps = ", ".join(str(c.get("step")) for c in checkpoints)
    print(f"mean of steps {steps} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
