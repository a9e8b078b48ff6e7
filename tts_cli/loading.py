"""The voice's models, loaded: the two files ``voice.resolve_voice`` chose,
read (checkpoints.py) and built into Tacotron2 and WaveGlow, in an engine
on the device torch confirms; and the voice, loaded: with the name, sample
rate and denoiser strength its WaveGlow file states (the run's own
settings win).
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, replace
from pathlib import Path

import torch

from tts_cli.checkpoints import (CheckpointError, VoiceInfo, load_tacotron2_weights, load_waveglow,
                                 read_voice_info)
from tts_cli.config import REFERENCE_DENOISER_STRENGTH, REFERENCE_SAMPLE_RATE, ConfigError, Settings
from tts_cli.engine import Engine, precision_name, resolve_device, resolve_precision
from tts_cli.errors import FatalError, first_line, option
from tts_cli.tacotron2 import Tacotron2
from tts_cli.text import SYMBOLS
from tts_cli.voice import Voice, choose_voice, resolve_voice
from tts_cli.waveglow import WaveGlow


def load_engine(settings: Settings, voice: Voice) -> tuple[Engine, Settings, Voice]:
    """The models of the resolved ``voice`` loaded into an engine on its
    device; the run's settings with the voice's sample rate and denoiser
    strength filled in where the run leaves them unset (what the WAVs and
    the manifest read); and the voice, loaded (its name, sample rate and
    denoiser strength: its WaveGlow file's, else the reference's). The
    engine's own notices (a model the fast path cannot serve, a denoiser
    that cannot act) are in ``engine.notices``."""
    device = _confirmed_device(voice.device, settings.device)
    dtype, _ = resolve_precision(device, voice.precision)
    tacotron2, waveglow, own = _load(voice)
    voice = replace(voice, **asdict(_with_reference_values(own, voice.waveglow)))
    settings = with_voice(settings, voice)
    return Engine(tacotron2, waveglow, device, dtype, settings), settings, voice


def _confirmed_device(expected: str, requested: str | None) -> torch.device:
    """The device the run planned for, as torch knows it; one line when torch
    cannot use it."""
    try:
        return resolve_device(expected)
    except (ValueError, RuntimeError) as e:
        if requested is None:   # a GPU showed itself (devices.py), but torch cannot use it
            raise FatalError(f"this machine shows a GPU, but torch {torch.__version__} cannot use it "
                             f"(torch.cuda.is_available() is False; often a driver older than the "
                             f"CUDA torch was built for); fix that, or pass {option('device', 'cpu')}") from None
        raise FatalError(str(e)) from None


def make_engine(settings: Settings, notices: list[str]) -> Engine:
    """``load_engine`` of the settings' voice, every notice added to ``notices``."""
    voice = resolve_voice(settings)
    notices.extend(voice.notices)
    engine, _, _ = load_engine(settings, voice)
    notices.extend(engine.notices)
    return engine


def engine_voice(engine: Engine, settings: Settings) -> tuple[Voice, Settings]:
    """The voice of an engine the caller built (no files to hash), loaded,
    and the run's settings with its sample rate and denoiser strength."""
    voice = Voice(None, None, fingerprint={"engine": "given by the caller"}, device=str(engine.device),
                  precision=precision_name(engine.dtype), label="the caller's engine",
                  sample_rate=REFERENCE_SAMPLE_RATE, denoiser_strength=engine.settings.denoiser_strength)
    return voice, with_voice(settings, voice)


def voice_settings(waveglow: Path) -> VoiceInfo:
    """The name, sample rate and denoiser strength of the voice whose
    WaveGlow file is ``waveglow``: what the file states (its
    ``checkpoints.VOICE_ENTRY``), each it leaves out the reference's
    (NVIDIA's files state none): the file name's stem, 22050 Hz, 0.01."""
    try:
        own = read_voice_info(waveglow)
    except CheckpointError as e:
        raise FatalError(str(e)) from None
    return _with_reference_values(own, waveglow)


def _with_reference_values(own: VoiceInfo, waveglow: Path) -> VoiceInfo:
    """What ``own`` (the file ``waveglow``'s entry) leaves out, the reference's."""
    return VoiceInfo(name=_unless_set(own.name, waveglow.stem),
                     sample_rate=_unless_set(own.sample_rate, REFERENCE_SAMPLE_RATE),
                     denoiser_strength=_unless_set(own.denoiser_strength, REFERENCE_DENOISER_STRENGTH))


def with_voice(settings: Settings, voice: Voice | VoiceInfo) -> Settings:
    """``settings`` with the voice's sample rate and denoiser strength where
    the run sets none; a voice's rate the run's files cannot be written at
    (FLAC's steps of 10 Hz) is one line naming the voice, before any work."""
    try:
        return replace(settings, sample_rate=_unless_set(settings.sample_rate, voice.sample_rate),
                       denoiser_strength=_unless_set(settings.denoiser_strength, voice.denoiser_strength))
    except ConfigError as e:
        raise FatalError(f"{getattr(voice, 'waveglow', None) or 'the voice'} makes audio at {voice.sample_rate} Hz: "
                         f"{e}; pass {option('sample_rate')} to write it at another rate") from None


def _unless_set(value, otherwise):
    return otherwise if value is None else value


def load_models(settings: Settings, voice: Voice | None = None) -> tuple[Tacotron2, WaveGlow]:
    """The two models of ``voice`` (the files), by default ``choose_voice(settings)``."""
    tacotron2, waveglow, _ = _load(voice or choose_voice(settings))
    return tacotron2, waveglow


def _load(voice: Voice) -> tuple[Tacotron2, WaveGlow, VoiceInfo]:
    """The two models and what the WaveGlow file says of its voice; each file read once."""
    try:
        tacotron2_sd = load_tacotron2_weights(voice.tacotron2)
        waveglow_sd, own = load_waveglow(voice.waveglow)
    except CheckpointError as e:
        raise FatalError(str(e)) from None
    tacotron2 = _build(Tacotron2, tacotron2_sd, voice.tacotron2)
    waveglow = _build(WaveGlow, waveglow_sd, voice.waveglow)
    _check_pair(tacotron2, waveglow, voice)
    return tacotron2, waveglow, own


def _check_pair(tacotron2: Tacotron2, waveglow: WaveGlow, voice: Voice) -> None:
    """One line when the two models cannot make speech together, before
    any line is tried: a Tacotron2 whose symbol table is smaller than the
    text front end's (trained on another), or mels of another size than
    the WaveGlow's (the files of two voices)."""
    if tacotron2.dims.n_symbols < len(SYMBOLS):
        raise FatalError(f"{voice.tacotron2}: its embedding holds {tacotron2.dims.n_symbols} symbols, fewer than "
                         f"the {len(SYMBOLS)} of the text front end it must read (NVIDIA's); it was trained "
                         f"with another symbol set, which tts-batch cannot write text in")
    if tacotron2.dims.n_mel != waveglow.dims.n_mel:
        raise FatalError(f"{voice.tacotron2} makes mels of {tacotron2.dims.n_mel} channels but {voice.waveglow} "
                         f"takes {waveglow.dims.n_mel}: the files are of two voices; give a matching pair")


def _build(model_class, state_dict, path: Path):
    """The model from a file's weights, or one line naming the file: the
    file is the user's, so whatever it makes fail is the file's fault. The
    sizes are read off the tensors, so the model is built on the meta
    device, where nothing is allocated, and then takes the file's tensors
    as its weights: a file whose tensors disagree must not get a model
    sized by its largest one before load_state_dict says so."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # copying into meta tensors is a no-op, and says so
            shaped = model_class.from_state_dict(state_dict)
        model = _filled(shaped, state_dict)
    except Exception as e:  # noqa: BLE001 - see above
        raise FatalError(f"{path}: the weights do not form a {model_class.__name__} "
                         f"({type(e).__name__}: {first_line(e)})") from None
    if isinstance(model, WaveGlow):
        for k, conv in enumerate(model.convinv):
            try:
                conv.inverse_weight()
            except torch.linalg.LinAlgError:
                raise FatalError(f"{path}: WaveGlow's 1x1 convolution convinv.{k} is not invertible, so "
                                 f"no audio can be made with it; the file is damaged: download it again") from None
    return model


def _filled(shaped: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The meta model ``shaped`` holding the file's weights themselves: no
    random weights drawn first and no copy (the published WaveGlow's 88
    million weights took longer to draw than the file took to read). What
    the file may leave out (BatchNorm's step counter) is made zero;
    from_state_dict has refused a file that leaves out a weight."""
    # contiguous: the model's own layout whatever views the file's tensors are
    shaped.load_state_dict({k: v.contiguous() for k, v in state_dict.items()}, strict=False, assign=True)
    for module in shaped.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_meta:
                module.register_buffer(name, torch.zeros(buffer.shape, dtype=buffer.dtype))
    return shaped
