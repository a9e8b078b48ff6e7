"""Alignment health: whether Tacotron2's attention read a line as it should.

Tacotron2 goes wrong in one way in practice: its attention skips words,
repeats them, or never reaches the end of the line, and the audio then no
longer says the text. The decoder records where its attention peaked at
every frame (``tacotron2.AttentionPath``); ``tacotron2.alignment_measures``
turns that into the measures below, per line, on the device. Here, without
torch: the thresholds a line must meet, what fails, and which of several
attempts to keep.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from tts_cli.config import ALIGNMENT_THRESHOLDS, Settings


def thresholds_record(t: Settings) -> dict:
    """What a healthy line meets, as the run's settings ``t`` set it."""
    return {name: getattr(t, name) for name in ALIGNMENT_THRESHOLDS}


@dataclass(frozen=True)
class Health:
    """One line's (or piece's) measures, from ``tacotron2.alignment_measures``."""
    coverage: float
    focus: float
    backward_jump: int
    forward_jump: int
    symbols_left: int            # after the peak at the last frame
    gated: bool                  # the gate fired (else max_decoder_steps cut the line)
    frames_per_symbol: float

    def failures(self, t: Settings) -> list[str]:
        """Each measure that falls short of ``t``, as the manifest says it."""
        checks = [
            (self.coverage >= t.min_coverage, f"coverage {self.coverage:.2f} < {t.min_coverage:g}"),
            (self.focus >= t.min_focus, f"focus {self.focus:.2f} < {t.min_focus:g}"),
            (self.forward_jump <= t.max_forward_jump,
             f"jumped {self.forward_jump} symbols ahead (at most {t.max_forward_jump})"),
            (self.backward_jump <= t.max_backward_jump,
             f"jumped {self.backward_jump} symbols back (at most {t.max_backward_jump})"),
            (self.reached_end(t), "did not reach the end: " + (
                f"{self.symbols_left} symbols left when the gate fired (at most {t.end_margin})"
                if self.gated else "the gate never fired")),
            (self.frames_per_symbol <= t.max_frames_per_symbol,
             f"{self.frames_per_symbol:.1f} frames per symbol (at most {t.max_frames_per_symbol:g})"),
        ]
        return [message for ok, message in checks if not ok]

    def reached_end(self, t: Settings) -> bool:
        return self.gated and self.symbols_left <= t.end_margin

    def record(self, t: Settings) -> dict:
        """The manifest's ``alignment`` entry for this line or piece."""
        return {"coverage": round(self.coverage, 4), "focus": round(self.focus, 4),
                "backward_jump": self.backward_jump, "forward_jump": self.forward_jump,
                "symbols_left": self.symbols_left, "reached_end": self.reached_end(t),
                "frames_per_symbol": round(self.frames_per_symbol, 3)}


@dataclass(frozen=True)
class Checked:
    """A line's (or piece's) kept attempt: its health, what it fails, which
    attempt it was (1: the line's own seed) of how many made."""
    health: Health
    failures: tuple[str, ...]
    attempt: int
    attempts: int

    def record(self, t: Settings) -> dict:
        return {**self.health.record(t), "attempt": self.attempt, "attempts": self.attempts}

    def plain(self) -> dict:
        """As plain data (a piece handed between torchrun's processes)."""
        health = {f.name: getattr(self.health, f.name) for f in fields(Health)}
        return {"health": health, "failures": list(self.failures), "attempt": self.attempt,
                "attempts": self.attempts}

    @classmethod
    def from_plain(cls, plain: dict) -> "Checked":
        return cls(Health(**plain["health"]), tuple(plain["failures"]), plain["attempt"], plain["attempts"])


def best(healths: list[Health], t: Settings) -> int:
    """Which attempt to keep: the first that fails nothing, else the first
    of those that fail the fewest measures."""
    return min(range(len(healths)), key=lambda k: (len(healths[k].failures(t)), k))


def line_record(pieces: list[Checked], t: Settings) -> dict:
    """A manifest row's ``alignment``: its one piece's entry; for a cut
    line, the worst of its pieces' measures, the latest attempt any piece
    kept and the attempts made for all, with each piece's own entry under
    ``pieces``."""
    entries = [p.record(t) for p in pieces]
    if len(entries) == 1:
        return entries[0]
    worst = {"coverage": min, "focus": min, "backward_jump": max, "forward_jump": max,
             "symbols_left": max, "reached_end": all, "frames_per_symbol": max}
    line = {key: pick(e[key] for e in entries) for key, pick in worst.items()}
    line["attempt"] = max(e["attempt"] for e in entries)
    line["attempts"] = sum(e["attempts"] for e in entries)
    return {**line, "pieces": entries}


def suspicion(pieces: list[Checked]) -> str | None:
    """Why a line is suspect (its kept attempts' failures), or None."""
    failing = [(n, p) for n, p in enumerate(pieces, start=1) if p.failures]
    if not failing:
        return None
    def where(n: int) -> str:
        return f"piece {n} of {len(pieces)}: " if len(pieces) > 1 else ""
    tried = max(p.attempts for _, p in failing)
    return ("alignment: " + "; ".join(where(n) + ", ".join(p.failures) for n, p in failing)
            + f" (best of {tried} attempt{'s' if tried > 1 else ''})")
