"""How Tacotron2 decodes: the reference's stop rule and its step limit.

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
