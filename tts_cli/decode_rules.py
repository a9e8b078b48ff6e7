"""How Tacotron2 decodes: the reference's stop rule and its step limit, and
how few frames are too few to be speech.

A leaf that imports nothing: the model (tacotron2.py) decodes by these
rules and the run's settings (config.py) take their defaults from them, so
the defaults are written once and the model needs none of the run's I/O.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeSettings:
    """How Tacotron2 decodes: the reference's rules, and the defaults of the
    run settings of the same names."""
    max_decoder_steps: int = 1000
    gate_threshold: float = 0.5
    prenet_dropout: float = 0.5
    stop_check_every: int = 16   # host sync once per this many steps, not every step


# A line (or piece) that stops after fewer frames than this said nothing a
# listener hears, and is suspect. The decoder makes one mel frame a step and
# keeps the frame where the gate fires, so a gate that fires at step k leaves
# k frames: 11.6 ms each at NVIDIA's hop of 256 samples at 22050 Hz (the
# demo voice's too). 4 frames, 46 ms, are shorter than a syllable's vowel
# in read speech (50 ms and up) and than the short words a line can hold
# ("A." from the demo voice: 9 frames); the demo voice's 3-frame (35 ms)
# "A" is a gate that fired before the attention left the first symbol.
MIN_SPEECH_FRAMES = 5
