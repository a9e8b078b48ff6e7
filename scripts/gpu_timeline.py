"""When each batch of a bench corpus run was decoded and vocoded, on the GPU.

The bench's engine (random full-size weights, each line round(5.7 x
symbols) frames) runs a corpus end to end, as `tts-batch bench` does; CUDA
events recorded on each stage's stream around every decoder batch
(`decode_checked`), every WaveGlow batch (`_vocode_launch`) and the decoder
graphs' capture give when the GPU did each, from the moment the run was
called. From them: when WaveGlow first had work (fill), its busy time, the
gaps between one WaveGlow batch and the next, and the time after the last
(tail). BENCHMARKS.md, Timeline, reads this.

    python scripts/gpu_timeline.py                           # the bench's 2,000 lines, one run
    python scripts/gpu_timeline.py --corpus other500.psv --runs 2 --json timeline.json

Needs a CUDA GPU. Each run after the first in the process finds its
decoder graphs captured.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from tts_cli import bench
from tts_cli.decoder_graph import GraphedDecoder
from tts_cli.engine import Engine

STAGES = {"capture": (GraphedDecoder, "prepare"), "decode": (Engine, "decode_checked"),
          "vocode": (Engine, "_vocode_launch")}


def record_stages(marks: list) -> None:
    """Wrap each stage's method so that every call appends (stage, lines,
    frames made, start event, end event) to ``marks``."""
    for stage, (owner, name) in STAGES.items():
        def timed(self, work, *args, _stage=stage, _method=getattr(owner, name), **kwargs):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            out = _method(self, work, *args, **kwargs)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            marks.append((_stage, len(work), sum(getattr(out, "counts", None) or [0]), start, end))
            return out
        setattr(owner, name, timed)


def one_run(engine: Engine, settings, corpus: Path, marks: list) -> dict:
    marks.clear()
    torch.cuda.synchronize()
    origin = torch.cuda.Event(enable_timing=True)
    origin.record()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        summary = bench._corpus_run(settings, corpus, Path(folder) / "out", engine)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started   # before the folder's files are deleted
    spans = [dict(stage=stage, lines=lines, frames=frames, start=origin.elapsed_time(s) / 1e3,
                  end=origin.elapsed_time(e) / 1e3) for stage, lines, frames, s, e in marks]
    vocoded = sorted((x for x in spans if x["stage"] == "vocode"), key=lambda x: x["start"])
    gaps = [b["start"] - a["end"] for a, b in zip(vocoded, vocoded[1:])]
    return dict(wall=wall, audio_seconds_per_second=summary.speed, first_waveglow=vocoded[0]["start"],
                waveglow_busy=sum(x["end"] - x["start"] for x in vocoded), gaps=len(gaps),
                gaps_seconds=sum(gaps), tail=wall - vocoded[-1]["end"], spans=spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=bench.SAMPLE_CORPUS)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write every span here")
    args = parser.parse_args()
    b = bench.BenchSettings(corpus=args.corpus, end_to_end_only=True)
    try:
        device, dtype, settings = bench._run_settings(b)
        engine, _ = bench._ready_engine(device, dtype, settings)
    except ValueError as e:   # no GPU: the bench's own message
        sys.exit(f"gpu_timeline: {e}")
    marks: list = []
    record_stages(marks)
    runs = [one_run(engine, settings, args.corpus, marks) for _ in range(args.runs)]
    for i, run in enumerate(runs):
        print(f"run {i + 1}: {args.corpus.name}: {run['wall']:.2f} s, {run['audio_seconds_per_second']:.1f} audio s/s; "
              f"first WaveGlow batch at {run['first_waveglow']:.2f} s; WaveGlow busy {run['waveglow_busy']:.2f} s; "
              f"{run['gaps']} gaps between its batches, {run['gaps_seconds']:.2f} s; "
              f"{run['tail']:.2f} s after its last batch")
        for x in run["spans"]:
            print(f"  {x['stage']:7} {x['lines']:4d} lines {x['frames']:7d} frames  {x['start']:7.3f} - {x['end']:7.3f} s")
    if args.json:
        args.json.write_text(json.dumps(runs))


if __name__ == "__main__":
    sys.exit(main())
