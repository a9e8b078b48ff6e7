"""Decoding: Tacotron2 over a batch of lines, and the alignment retry policy.

A line whose alignment fails the run's checks is decoded again with its
retry seeds, and its best attempt kept (``alignment.best``); what comes out
is a ``DecodedBatch``, each line's kept attempt. ``Decoding`` is the part
of ``engine.Engine`` that does this.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from tts_cli.alignment import Checked, Health, best
from tts_cli.batching import pad_sequences
from tts_cli.devices import on_its_device
from tts_cli.tacotron2 import Decoded, alignment_measures, decode


@dataclass(frozen=True)
class Job:
    ids: list[int]          # symbol ids of one line (or piece)
    seed: int               # its own seed (prenet dropout, WaveGlow noise)
    index: int = -1         # the caller's number for it (the pipeline's: its place in the run's work)
    retry_seeds: tuple[int, ...] = ()  # the seeds of its retries, should its alignment fail
    # Set by the decoder: the kept attempt's alignment check (``seed`` is then that attempt's).
    checked: Checked | None = None


@dataclass(frozen=True)
class DecodedBatch:
    """A batch as decoded: each line's kept attempt, what WaveGlow takes."""
    jobs: list[Job]            # as kept: each with its kept attempt's seed and its ``checked``
    mel: torch.Tensor          # (B, n_mel, F) postnet mel, zero past each row's frames
    frames: torch.Tensor       # (B,) frames per row, on the device
    truncated: torch.Tensor    # (B,) bool: hit max_decoder_steps without the stop rule firing
    counts: list[int]          # ``frames`` on the host
    cut: list[bool]            # ``truncated`` on the host

    def rows(self, part: slice) -> "DecodedBatch":
        """The lines of ``part``, their mel as wide as their longest line."""
        counts = self.counts[part]
        return DecodedBatch(self.jobs[part], self.mel[part, :, :max(counts)], self.frames[part],
                            self.truncated[part], counts, self.cut[part])


# alignment_measures' measures that count symbols
_WHOLE = ("backward_jump", "forward_jump", "symbols_left")


@dataclass(frozen=True)
class Measured(Health):
    """A decoded row's health and its frames."""
    frames: int = 0


def measured(decoded: Decoded, lengths: torch.Tensor, symbols: int) -> list[Measured]:
    """Each decoded row's alignment health (``tacotron2.alignment_measures``),
    read to the host in one copy; ``lengths``: the rows' symbols (on the
    decoder's device), ``symbols``: the padded length of their ids."""
    measures = alignment_measures(decoded.attention, decoded.frames, lengths, symbols)
    names = list(measures)
    table = torch.stack([measures[name].double() for name in names]
                        + [decoded.frames.double(), decoded.truncated.double()], 1).tolist()
    return [Measured(frames=int(row[-2]), gated=not row[-1],
                     **{name: (int(v) if name in _WHOLE else v) for name, v in zip(names, row)})
            for row in table]


class Decoding:
    """Engine methods that decode. They read the engine's ``device``,
    ``decode_settings``, ``settings`` (the alignment checks'), ``tacotron2`` and ``graphed``
    (the decoder replayed from CUDA graphs, or None)."""

    @on_its_device
    @torch.inference_mode()
    def decode_only(self, jobs: list[Job]) -> Decoded:
        """Tacotron2 for one batch, unchecked: ``tacotron2.Decoded``."""
        ids, lengths = pad_sequences([j.ids for j in jobs], device=self.device)
        seeds = torch.tensor([j.seed for j in jobs], dtype=torch.long, device=self.device)
        if self.graphed is not None:
            return self.graphed.decode(ids, lengths, seeds)
        return decode(self.tacotron2, ids, lengths, seeds, self.decode_settings)

    @on_its_device
    @torch.inference_mode()
    def decode_checked(self, jobs: list[Job], alone=None) -> DecodedBatch:
        """``decode_only`` with the alignment checks: a line that fails them
        is decoded again with each of its retry seeds in turn until one
        passes, and its best attempt kept (``alignment.best``). The jobs come
        back as kept, each with its kept attempt's seed (which WaveGlow's
        noise then follows) and its ``checked``. ``alone(b, t)``: a context
        to decode a batch of b lines of up to t symbols in, when that shape
        was not met before (on CUDA it may need a graph captured)."""
        t = self.settings
        decoded = self.decode_only(jobs)
        if not t.check_alignment:
            return DecodedBatch(jobs, *decoded[:3], decoded.frames.tolist(), decoded.truncated.tolist())
        tried = [[health] for health in self._health(jobs, decoded)]
        attempts, rows = [decoded], [list(range(len(jobs)))]   # attempt k decoded rows[k]
        failing = [n for n in range(len(jobs)) if tried[n][0].failures(t)]
        for k in range(1, 1 + max(len(job.retry_seeds) for job in jobs)):
            failing = [n for n in failing if len(jobs[n].retry_seeds) >= k]
            if not failing:
                break
            again = [dataclasses.replace(jobs[n], seed=jobs[n].retry_seeds[k - 1]) for n in failing]
            with alone(len(again), max(len(job.ids) for job in again)) if alone else contextlib.nullcontext():
                attempts.append(self.decode_only(again))
            rows.append(failing)
            for n, health in zip(failing, self._health(again, attempts[-1])):
                tried[n].append(health)
            failing = [n for n in failing if tried[n][-1].failures(t)]
        kept = [best(healths, t) for healths in tried]
        counts = [h[k].frames for h, k in zip(tried, kept)]
        kept_jobs = [dataclasses.replace(job, seed=job.seed if k == 0 else job.retry_seeds[k - 1],
                                         checked=Checked(tried[n][k], tuple(tried[n][k].failures(t)), k + 1,
                                                         len(tried[n])))
                     for n, (job, k) in enumerate(zip(jobs, kept))]
        return DecodedBatch(kept_jobs, *self._kept(attempts, rows, kept, max(counts)), counts,
                            [not h[k].gated for h, k in zip(tried, kept)])

    def _health(self, jobs: list[Job], decoded: Decoded) -> list[Measured]:
        """Each job's alignment health (``measured``)."""
        lengths = torch.tensor([len(job.ids) for job in jobs], device=self.device)
        return measured(decoded, lengths, max(len(job.ids) for job in jobs))

    @staticmethod
    def _kept(attempts: list[Decoded], rows: list[list[int]], kept: list[int], longest: int):
        """(mel, frames, truncated) of each row's kept attempt; ``longest``:
        the most frames among them."""
        first = attempts[0]
        if not any(kept):
            return first.mel, first.frames, first.truncated
        mel = first.mel.new_zeros(first.mel.shape[0], first.mel.shape[1], longest)
        width = min(longest, first.mel.shape[2])
        mel[:, :, :width] = first.mel[:, :, :width]
        frames, truncated = first.frames.clone(), first.truncated.clone()
        for k in range(1, len(attempts)):
            mine = [n for n in rows[k] if kept[n] == k]
            if not mine:
                continue
            at = torch.tensor([rows[k].index(n) for n in mine], device=mel.device)
            to = torch.tensor(mine, device=mel.device)
            width = min(longest, attempts[k].mel.shape[2])
            mel[to] = 0
            mel[to, :, :width] = attempts[k].mel[at, :, :width]
            frames[to] = attempts[k].frames[at]
            truncated[to] = attempts[k].truncated[at]
        return mel, frames, truncated
