"""The voice: which checkpoint files, loaded into which models, on which device.

With no --tacotron2 / --waveglow, NVIDIA's published file names are looked for
in ./checkpoints, then in the checkpoints/ folder of the source tree.
"""
from __future__ import annotations

from pathlib import Path

from tts_cli.checkpoints import (CheckpointError, file_digest, load_tacotron2_weights,
                                 load_waveglow_weights)
from tts_cli.config import Settings
from tts_cli.engine import Engine, SynthesisSettings, resolve_device, resolve_precision
from tts_cli.errors import FatalError, first_line
from tts_cli.tacotron2 import DecodeSettings, Tacotron2
from tts_cli.waveglow import WaveGlow

PUBLISHED_FILES = {
    "tacotron2": "tacotron2_statedict.pt",
    "waveglow": "waveglow_256channels_universal_v5.pt",
}
WHERE_TO_GET = {
    "tacotron2": "NVIDIA's published LJSpeech Tacotron2 (linked from github.com/NVIDIA/tacotron2's "
                 "README; NGC's Tacotron2 checkpoints load too)",
    "waveglow": "NVIDIA's published WaveGlow (linked from github.com/NVIDIA/waveglow's README; "
                "NGC's WaveGlow checkpoints load too)",
}


def checkpoint_dirs() -> list[Path]:
    """Where published checkpoints are looked for: ./checkpoints, then the
    checkpoints/ folder of the source tree this package runs from."""
    dirs = [Path.cwd() / "checkpoints", Path(__file__).resolve().parent.parent / "checkpoints"]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def find_checkpoint(kind: str, given: str | None) -> Path:
    if given is not None:
        return Path(given)
    name = PUBLISHED_FILES[kind]
    for folder in checkpoint_dirs():
        if (folder / name).is_file():
            return folder / name
    raise FatalError(f"no --{kind} given and no {name} in {checkpoint_dirs()[0]}; "
                     f"put {WHERE_TO_GET[kind]} there as {name}, or pass --{kind} PATH")


def load_models(settings: Settings) -> tuple[Tacotron2, WaveGlow]:
    paths = {kind: find_checkpoint(kind, getattr(settings, kind)) for kind in PUBLISHED_FILES}
    try:
        tacotron2_sd = load_tacotron2_weights(paths["tacotron2"])
        waveglow_sd = load_waveglow_weights(paths["waveglow"])
    except CheckpointError as e:
        raise FatalError(str(e)) from None
    return (_build(Tacotron2, tacotron2_sd, paths["tacotron2"]),
            _build(WaveGlow, waveglow_sd, paths["waveglow"]))


def _build(model_class, state_dict, path: Path):
    try:
        return model_class.from_state_dict(state_dict)
    except (KeyError, ValueError, RuntimeError, IndexError) as e:
        raise FatalError(f"{path}: the weights do not form a {model_class.__name__} "
                         f"({first_line(e)})") from None


def make_engine(settings: Settings, notices: list[str]) -> Engine:
    try:
        device = resolve_device(settings.device)
    except (ValueError, RuntimeError) as e:
        raise FatalError(str(e)) from None
    dtype, notice = resolve_precision(device, settings.precision)
    if notice:
        notices.append(notice)
    tacotron2, waveglow = load_models(settings)
    return Engine(tacotron2, waveglow, device, dtype, synthesis_settings(settings))


def synthesis_settings(s: Settings) -> SynthesisSettings:
    """The engine's share of the run's settings."""
    decode = DecodeSettings(max_decoder_steps=s.max_decoder_steps, gate_threshold=s.gate_threshold,
                            prenet_dropout=s.prenet_dropout)
    return SynthesisSettings(sigma=s.sigma, denoiser_strength=s.denoiser_strength, decode=decode)


def model_fingerprint(settings: Settings) -> dict[str, str]:
    """sha256 of both checkpoint files: a resume key must change when the
    weights change, whatever the files are called. Hashing the ~650 MB
    WaveGlow takes a few seconds, so it is done once per run."""
    fingerprint = {}
    for kind in PUBLISHED_FILES:
        try:
            fingerprint[kind] = file_digest(find_checkpoint(kind, getattr(settings, kind)))
        except CheckpointError as e:
            raise FatalError(str(e)) from None
    return fingerprint
