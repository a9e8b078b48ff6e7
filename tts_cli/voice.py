"""The voice: which checkpoint files, loaded into which models, on which device.

Which two files a run uses is decided once, by ``choose_voice``; model loading
and the resume keys' fingerprint both ask it, so they never disagree:

1. ``--tacotron2`` / ``--waveglow`` (or the recipe's ``tacotron2`` /
   ``waveglow``): the given files; one not given is NVIDIA's published file,
   looked for as in 2. The demo voice never stands in for half of a pair.
2. Neither given: NVIDIA's published file names (``PUBLISHED_FILES``) are
   looked for in ./checkpoints, then in the checkpoints/ folder of the source
   tree (``checkpoint_dirs``); both found, they are used.
3. Otherwise, when both demo files (``DEMO_FILES``, a small voice trained for
   trying the tool) are found there, the demo voice is used and the run says so
   in one notice line, naming the published file(s) that would give NVIDIA's
   voice. This holds when one published file is present too: the two
   published models only make sense together, so the notice names the missing
   one rather than ending the run.
4. Neither pair complete: a run-ending error naming the first missing
   published file and where to get it.

The voice's name, sample rate and denoiser strength come from its WaveGlow
file (``voice_settings``: the entry ``checkpoints.VOICE_ENTRY`` in it, else
the reference's values), not from where the file is or what it is called;
the run's own ``sample_rate`` / ``denoiser_strength``, when set, win
(``resolve_voice``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tts_cli.checkpoints import (CheckpointError, VoiceInfo, file_digest, load_tacotron2_weights,
                                 load_waveglow_weights, read_voice_info)
from tts_cli.config import (REFERENCE_DENOISER_STRENGTH, REFERENCE_SAMPLE_RATE, WAVEGLOW_MEMORY_SHARE,
                            Settings)
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
# The demo voice (made by recipes/demo-voice), used when NVIDIA's files are not there.
DEMO_FILES = {
    "tacotron2": "demo_tacotron2.pt",
    "waveglow": "demo_waveglow.pt",
}


@dataclass(frozen=True)
class Voice:
    """The two checkpoint files a run uses."""
    tacotron2: Path
    waveglow: Path
    demo: bool = False            # the demo voice stands in for NVIDIA's
    notice: str | None = None     # the one line that says so

    def path(self, kind: str) -> Path:
        return getattr(self, kind)


def choose_voice(settings: Settings) -> Voice:
    """The files this run uses; the order is in the module docstring."""
    given = {kind: getattr(settings, kind) for kind in PUBLISHED_FILES}
    published = {kind: _look_for(name) for kind, name in PUBLISHED_FILES.items()}
    if any(path is not None for path in given.values()):
        return Voice(**{kind: Path(given[kind]) if given[kind] is not None
                        else published[kind] or _missing(kind) for kind in PUBLISHED_FILES})
    if all(published.values()):
        return Voice(**published)
    demo = {kind: _look_for(name) for kind, name in DEMO_FILES.items()}
    if all(demo.values()):
        return Voice(**demo, demo=True, notice=_demo_notice(demo, published))
    return _missing(next(kind for kind, path in published.items() if path is None))


def checkpoint_dirs() -> list[Path]:
    """Where the published checkpoints and the demo voice are looked for:
    ./checkpoints, then the checkpoints/ folder of the source tree this
    package runs from, then (in a non-editable install, which has no source
    tree) the installed copy of that folder, ``tts_cli.demo_voice``."""
    dirs = [Path.cwd() / "checkpoints"]
    source_tree = Path(__file__).resolve().parent.parent / "checkpoints"
    if source_tree.is_dir():
        dirs.append(source_tree)
    try:
        from tts_cli import demo_voice
        dirs.append(Path(demo_voice.__file__).parent)
    except ImportError:     # run from the source tree, not installed
        pass
    return list(dict.fromkeys(d.resolve() for d in dirs))


def _look_for(name: str) -> Path | None:
    for folder in checkpoint_dirs():
        if (folder / name).is_file():
            return folder / name
    return None


def _missing(kind: str):
    name = PUBLISHED_FILES[kind]
    folders = checkpoint_dirs()
    searched = " or ".join(str(folder) for folder in folders)
    raise FatalError(f"no --{kind} given and no {name} in {searched}; put {WHERE_TO_GET[kind]} "
                     f"in {folders[0]} as {name}, or pass --{kind} PATH")


def _demo_notice(demo: dict[str, Path], published: dict[str, Path | None]) -> str:
    folders = {path.parent for path in demo.values()}
    where = (f"{_shown(folders.pop())}/demo_*.pt" if len(folders) == 1
             else ", ".join(_shown(path) for path in demo.values()))
    missing = " and ".join(PUBLISHED_FILES[kind] for kind, path in published.items() if path is None)
    found = " and ".join(PUBLISHED_FILES[kind] for kind, path in published.items() if path is not None)
    todo = f"put {missing} in checkpoints/" + (f" too (only {found} was found)" if found else "")
    return (f"using the demo voice ({where}; robotic, for trying the tool): "
            f"for NVIDIA's voice {todo} (see checkpoints/README.md)")


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_models(settings: Settings, voice: Voice | None = None) -> tuple[Tacotron2, WaveGlow]:
    """The two models of ``voice`` (the files), by default ``choose_voice(settings)``."""
    voice = voice or choose_voice(settings)
    try:
        tacotron2_sd = load_tacotron2_weights(voice.tacotron2)
        waveglow_sd = load_waveglow_weights(voice.waveglow)
    except CheckpointError as e:
        raise FatalError(str(e)) from None
    return (_build(Tacotron2, tacotron2_sd, voice.tacotron2),
            _build(WaveGlow, waveglow_sd, voice.waveglow))


def _build(model_class, state_dict, path: Path):
    """The model from a file's weights, or one line naming the file: the
    file is the user's, so whatever it makes fail is the file's fault. The
    sizes are read off the tensors, so the model is first built on the meta
    device, where nothing is allocated: a file whose tensors disagree must
    not get a model sized by its largest one before load_state_dict says so."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # copying into meta tensors is a no-op, and says so
            model_class.from_state_dict(state_dict)
        model = model_class.from_state_dict(state_dict)
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


@dataclass(frozen=True)
class ResolvedVoice:
    """Everything about a run's voice that decides its audio, resolved once
    per run before any model loads (a re-run with nothing left to do loads
    none): the files, their fingerprint for the resume keys, the device and
    dtype, the voice's name, the denoiser strength and sample rate the run
    uses, and the notices that go with them."""
    files: Voice | None            # None: an engine the caller built (the bench)
    fingerprint: dict[str, str]    # sha256 of each file, or what stands for them
    device: torch.device
    dtype: torch.dtype
    name: str                      # the WaveGlow file's voice name, else its file name's stem
    denoiser_strength: float       # the run's setting, else the voice's
    sample_rate: int               # Hz; the run's setting, else the voice's
    notices: tuple[str, ...] = ()


def resolve_voice(settings: Settings) -> ResolvedVoice:
    """The run's voice, from its settings (the order in the module docstring)."""
    try:
        device = resolve_device(settings.device)
    except (ValueError, RuntimeError) as e:
        raise FatalError(str(e)) from None
    dtype, notice = resolve_precision(device, settings.precision)
    files = choose_voice(settings)
    notices = tuple(line for line in (notice, files.notice) if line)
    own = voice_settings(files.waveglow)
    return ResolvedVoice(files, model_fingerprint(files), device, dtype, own.name,
                         _unless_set(settings.denoiser_strength, own.denoiser_strength),
                         _unless_set(settings.sample_rate, own.sample_rate), notices)


def voice_settings(waveglow: Path) -> VoiceInfo:
    """The name, sample rate and denoiser strength of the voice whose
    WaveGlow file is ``waveglow``: what the file states (its
    ``checkpoints.VOICE_ENTRY``), each it leaves out the reference's
    (NVIDIA's files state none): the file name's stem, 22050 Hz, 0.01."""
    try:
        own = read_voice_info(waveglow)
    except CheckpointError as e:
        raise FatalError(str(e)) from None
    return VoiceInfo(name=_unless_set(own.name, waveglow.stem),
                     sample_rate=_unless_set(own.sample_rate, REFERENCE_SAMPLE_RATE),
                     denoiser_strength=_unless_set(own.denoiser_strength, REFERENCE_DENOISER_STRENGTH))


def _unless_set(value, otherwise):
    return otherwise if value is None else value


def engine_voice(engine: Engine, settings: Settings) -> ResolvedVoice:
    """The voice of an engine the caller built (no files to hash)."""
    return ResolvedVoice(None, {"engine": "given by the caller"}, engine.device, engine.dtype,
                         "the caller's engine", engine.settings.denoiser_strength,
                         _unless_set(settings.sample_rate, REFERENCE_SAMPLE_RATE))


def with_voice(settings: Settings, voice: ResolvedVoice) -> Settings:
    """``settings`` with the sample rate and denoiser strength the run uses
    (``voice``'s) filled in: what the WAVs, the manifest and resume read."""
    return replace(settings, sample_rate=voice.sample_rate, denoiser_strength=voice.denoiser_strength)


def load_engine(settings: Settings, voice: ResolvedVoice) -> Engine:
    """The models of ``voice`` loaded into an engine; its own notices (a
    model the fast path cannot serve) are in ``engine.notices``."""
    tacotron2, waveglow = load_models(settings, voice.files)
    return Engine(tacotron2, waveglow, voice.device, voice.dtype,
                  synthesis_settings(settings, voice.denoiser_strength, voice.device))


def make_engine(settings: Settings, notices: list[str]) -> Engine:
    """``load_engine`` of the settings' voice, every notice added to ``notices``."""
    voice = resolve_voice(settings)
    notices.extend(voice.notices)
    engine = load_engine(settings, voice)
    notices.extend(engine.notices)
    return engine


def synthesis_settings(s: Settings, denoiser: float | None = None,
                       device: torch.device | None = None) -> SynthesisSettings:
    """The engine's share of the run's settings; ``denoiser`` (default: the
    run's, else the reference's strength) and ``device`` (default: the
    run's) fill what the run leaves unset."""
    decode = DecodeSettings(max_decoder_steps=s.max_decoder_steps, gate_threshold=s.gate_threshold,
                            prenet_dropout=s.prenet_dropout)
    memory = s.waveglow_memory or waveglow_memory_gib(device or resolve_device(s.device))
    strength = _unless_set(denoiser, _unless_set(s.denoiser_strength, REFERENCE_DENOISER_STRENGTH))
    return SynthesisSettings(sigma=s.sigma, denoiser_strength=strength, decode=decode,
                             waveglow_memory_gib=memory, return_mels=s.save_mels)




def waveglow_memory_gib(device: torch.device) -> float:
    """WaveGlow's default budget on ``device``, in GiB (WAVEGLOW_MEMORY_SHARE)."""
    share, most = WAVEGLOW_MEMORY_SHARE[device.type]
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_ram()
    return min(share * free / 2 ** 30, most) if free is not None else most


def available_ram(root: Path = Path("/")) -> int | None:
    """Bytes of RAM this process can still take: the kernel's MemAvailable,
    or less where a cgroup (a container's memory limit) leaves less; None
    where neither can be read (not Linux)."""
    found = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    cgroup = root / "sys/fs/cgroup"
    for limit, usage in (("memory.max", "memory.current"),     # cgroup v2
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):   # v1
        try:
            found.append(max(int((cgroup / limit).read_text()) - int((cgroup / usage).read_text()), 0))
        except (OSError, ValueError):   # no such file, or "max": no limit
            pass
    return min(found) if found else None


def model_fingerprint(files: Voice) -> dict[str, str]:
    """sha256 of the two files: a resume key must change when the weights
    change, whatever the files are called (switching between the demo voice
    and NVIDIA's redoes every line). Hashing the ~650 MB WaveGlow takes a
    few seconds, so it is done once per run (``resolve_voice``)."""
    fingerprint = {}
    for kind in PUBLISHED_FILES:
        try:
            fingerprint[kind] = file_digest(files.path(kind))
        except CheckpointError as e:
            raise FatalError(str(e)) from None
    return fingerprint
