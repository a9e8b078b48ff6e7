"""How Tacotron2 decodes: the reference's stop rule and its step limit, a
stop rule for lengths fixed from outside, and how few frames are too few to
be speech.

A leaf that imports nothing: the model (tacotron2.py) decodes by these
rules and the run's settings (config.py) take their defaults from them, so
the defaults are written once and the model needs none of the run's I/O.

A stop rule is called as ``rule(gate, step, lengths, cfg)`` and returns
where rows stop, a bool tensor of the gate's shape: ``gate`` holds the gate
logits of one step (B,), with ``step`` that step's index (an int), or of K
steps at once (K, B), with ``step`` their indices as a (K, 1) tensor (the
graphed decoder); ``lengths`` (B,) are the rows' symbol counts; ``cfg`` is
the run's ``DecodeSettings``. A row stops at the first step its rule says
so and keeps that frame. The decoder's rule is ``Decoder.stop_rule``
(tacotron2.py), ``gate_stops`` unless swapped from outside.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DecodeSettings:
    """How Tacotron2 decodes: the reference's rules, and the defaults of the
    run settings of the same names."""
    max_decoder_steps: int = 1000
    gate_threshold: float = 0.5
    prenet_dropout: float = 0.5
    stop_check_every: int = 16   # host sync once per this many steps, not every step

    @classmethod
    def from_settings(cls, settings) -> "DecodeSettings":
        """The decoder's share of the run's settings (``config.Settings``),
        read by name; what the run does not set keeps its default here."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls) if hasattr(settings, f.name)})


def gate_stops(gate, step, lengths, cfg: DecodeSettings):
    """The reference's stop rule: a row stops where sigmoid(gate) exceeds
    ``cfg.gate_threshold``."""
    return gate.float().sigmoid() > cfg.gate_threshold


class StopAfter:
    """A stop rule for lengths fixed from outside, the gate aside:
    ``frames_of`` takes the rows' symbol counts (a tensor) and gives each
    row's frames. At least one, at most max_decoder_steps: a longer row
    stops at the limit's last step, not cut off there."""

    def __init__(self, frames_of):
        self.frames_of = frames_of

    def __call__(self, gate, step, lengths, cfg: DecodeSettings):
        return step + 1 == self.frames_of(lengths).clamp(1, cfg.max_decoder_steps)


# A line (or piece) that stops after fewer frames than this said nothing a
# listener hears, and is suspect. The decoder makes one mel frame a step and
# keeps the frame where the gate fires, so a gate that fires at step k leaves
# k frames: 11.6 ms each at NVIDIA's hop of 256 samples at 22050 Hz (the
# demo voice's too). 4 frames, 46 ms, are shorter than a syllable's vowel
# in read speech (50 ms and up) and than the short words a line can hold
# ("A." from the demo voice: 9 frames); the demo voice's 3-frame (35 ms)
# "A" is a gate that fired before the attention left the first symbol.
MIN_SPEECH_FRAMES = 5
