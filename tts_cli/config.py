"""Settings: a recipe (YAML) loaded into a frozen dataclass, then CLI overrides.

A recipe sets any field below by its name; the command line overrides a
recipe field by the same name (``--batch-size`` -> ``batch_size``). Unknown
keys and out-of-range values are errors that name the recipe file.
"""
from __future__ import annotations

import dataclasses
import numbers
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tts_cli.decode_rules import DecodeSettings
from tts_cli.errors import option
from tts_cli.formats import (AUDIO_FORMATS, CORPUS_FORMATS, FLAC_ANY_RATE_UP_TO, FLAC_SAMPLE_FORMATS, LAYOUTS,
                             NORMALIZATIONS, SAMPLE_FORMATS, SAMPLE_RATES, SHARD_SIZE, flac_stores)

DEFAULT_RECIPE = "ljspeech"
PRECISION_NAMES = ("fp32", "fp16", "bf16")


# Most lines per batch when the run sets none, by device type. CUDA: 128 ran
# fastest (BENCHMARKS.md). CPU: a batch is what a Ctrl-C waits for
# (signals.py) and what the progress bar waits for at most; 16 is as fast
# as larger batches, stops sooner after a Ctrl-C and moves the bar as often
# as smaller ones (BENCHMARKS.md, what each step bought).
BATCH_SIZES = {"cuda": 128, "cpu": 16}
# Whether the batches run shortest first, by device type (the same batches;
# only their order changes, and no audio). On a CPU, where a batch takes
# seconds, the first lines come out sooner and the bar moves steadily, in
# the same total time (BENCHMARKS.md, what each step bought).
SHORTEST_FIRST = {"cuda": False, "cpu": True}
# NVIDIA's published voice's sample rate and the reference's denoiser
# strength (NVIDIA's inference script): a voice's own when its WaveGlow file
# states none (voice.py).
REFERENCE_SAMPLE_RATE = 22050
REFERENCE_DENOISER_STRENGTH = 0.01
# WaveGlow's memory when the run sets none: (share of what the device has
# free, at most this many GiB). CUDA: half the free device memory, at most
# the 15 GiB that the bench runs with (about a million rows in fp16). CPU: a
# sixteenth of the available RAM, at most 1/4 GiB: there the budget is host
# RAM, which 15 GiB would exhaust on a small machine, and smaller slices
# also run faster on a CPU (BENCHMARKS.md, what each step bought).
WAVEGLOW_MEMORY_SHARE = {"cuda": (1 / 2, 15.0), "cpu": (1 / 16, 0.25)}


class ConfigError(ValueError):
    """A bad recipe or option; the message is one line. ``setting``: the
    setting at fault, where one is."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


# What --device accepts; whether the device exists is checked when torch is loaded.
DEVICE_NAME = re.compile(r"cpu|cuda(:[0-9]+)?")


@dataclass(frozen=True)
class Settings:
    tacotron2: str | None = None        # Tacotron2 checkpoint; None: look in checkpoints/
    waveglow: str | None = None         # WaveGlow checkpoint; None: look in checkpoints/
    sample_rate: int | None = None      # the files' rate, resampled to from the voice's; None: the voice's own
    sigma: float = 0.666                # WaveGlow noise scale, the reference's
    denoiser_strength: float | None = None  # bias-spectrum subtraction; 0 disables it; None: the voice's own (voice.py)
    max_decoder_steps: int = DecodeSettings.max_decoder_steps   # a line that reaches it is kept, truncated
    gate_threshold: float = DecodeSettings.gate_threshold      # stop where sigmoid(gate) > this
    prenet_dropout: float = DecodeSettings.prenet_dropout      # on at inference, as the reference; 0: deterministic
    seed: int | None = None             # run seed; None draws one (recorded in the manifest)
    batch_size: int | None = None       # most lines per batch; None: BATCH_SIZES by device
    sample_format: str = "pcm16"        # pcm16, pcm24 or float32 (WAV only)
    audio_format: str = "wav"           # wav or flac
    save_mels: bool = False             # also write mels/<id>.npy
    layout: str = "files"               # files (wavs/) or webdataset (tar shards in shards/; tarshards.py)
    shard_size: int = SHARD_SIZE        # a longer corpus goes into folders of this many lines; 0: flat (formats.Layout)
    format: str = "plain"               # corpus format: plain, ljspeech, tsv
    text_normalization: str = "extended"  # reference: NVIDIA's cleaners exactly; extended: also percentages,
                                          # times, addresses, units, symbols, dates (spoken_forms.py)
    device: str | None = None           # cuda, cuda:N, cpu; None: cuda where expected (devices.py)
    precision: str | None = None        # fp32, fp16, bf16; None: fp16 on CUDA, fp32 on CPU
    max_symbols_per_piece: int = 180    # longer lines are cut into pieces; 0 disables (splitting.py)
    piece_pause: float = 0.15           # seconds of silence between a cut line's pieces
    waveglow_memory: float | None = None  # GiB WaveGlow's activations may take (batches run in slices
                                          # within it); None: a share of the machine's (voice.py)
    check_alignment: bool = True        # measure each line's attention and retry lines that fail (alignment.py)
    retries: int = 2                    # new attempts, each with its own seed, for a line that fails
    # What a healthy line meets (alignment.py; the README's "Alignment checks"):
    min_coverage: float = 0.75          # share of the line's symbols that held the attention's peak
    min_focus: float = 0.5              # mean peak attention weight over the line's frames
    max_forward_jump: int = 8           # symbols the (smoothed) peak may move ahead at once
    max_backward_jump: int = 8          # symbols it may fall back behind the furthest it reached
    end_margin: int = 3                 # symbols the peak may still have ahead when the gate fires
    max_frames_per_symbol: float = 15.0
    strict: bool = False                # exit status 1 when a line is suspect or truncated, as for errors
    force: bool = False                 # redo every line, reusing nothing from an earlier run
    prune: bool = False                 # remove the files no manifest row names; rewrite shards without such lines
    quiet: bool = False                 # no progress bar or summary

    def __post_init__(self):
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, _typed(field, getattr(self, field.name)))
        for setting, problem in _problems(self):
            raise ConfigError(problem, setting)


# A field's declared type (its annotation's first name) -> the values it takes.
_KINDS = {"int": numbers.Integral, "float": numbers.Real, "bool": bool, "str": str}


def _typed(field: dataclasses.Field, value: Any) -> Any:
    """``value`` as the field's type: an int or numpy number given for a
    float field becomes a float (so ``sigma: 1`` in a recipe, ``sigma=1``
    in Python and ``--sigma 1`` make the same resume key); a value of
    another type is a ConfigError."""
    kind = field.type.split(" |")[0]
    if value is None and "None" in field.type:
        return value
    if isinstance(value, bool) and kind != "bool" or not isinstance(value, _KINDS[kind]):
        raise ConfigError(f"{field.name} must be {kind}, got {value!r}", field.name)
    return {"int": int, "float": float}.get(kind, lambda v: v)(value)


def _problems(s: Settings) -> list[tuple[str, str]]:
    """(setting, message) for each setting out of range."""
    checks = [
        ("device", s.device is None or DEVICE_NAME.fullmatch(s.device),
         f"device must be cpu, cuda or cuda:N, not {s.device!r}"),
        ("sample_rate", s.sample_rate is None or SAMPLE_RATES[0] <= s.sample_rate <= SAMPLE_RATES[1],
         f"sample_rate must be between {SAMPLE_RATES[0]} and {SAMPLE_RATES[1]} Hz"),
        ("sigma", s.sigma >= 0, "sigma must be >= 0"),
        ("denoiser_strength", s.denoiser_strength is None or s.denoiser_strength >= 0,
         "denoiser_strength must be >= 0"),
        ("max_decoder_steps", s.max_decoder_steps >= 1, "max_decoder_steps must be >= 1"),
        ("gate_threshold", 0 < s.gate_threshold < 1, "gate_threshold must be between 0 and 1"),
        ("prenet_dropout", 0 <= s.prenet_dropout < 1, "prenet_dropout must be in [0, 1)"),
        ("batch_size", s.batch_size is None or s.batch_size >= 1, "batch_size must be >= 1"),
        ("seed", s.seed is None or s.seed >= 0, "seed must be >= 0"),
        ("max_symbols_per_piece", s.max_symbols_per_piece >= 0,
         "max_symbols_per_piece must be >= 0 (0 disables splitting)"),
        ("piece_pause", 0 <= s.piece_pause <= 10, "piece_pause must be between 0 and 10 seconds"),
        ("waveglow_memory", s.waveglow_memory is None or s.waveglow_memory > 0, "waveglow_memory must be > 0"),
        ("layout", s.layout in LAYOUTS, f"layout must be one of {', '.join(LAYOUTS)}"),
        ("shard_size", s.shard_size >= 0, "shard_size must be >= 0 (0 keeps every file in one folder)"),
        ("retries", 0 <= s.retries <= 20, "retries must be between 0 and 20"),
        ("min_coverage", 0 <= s.min_coverage <= 1, "min_coverage must be between 0 and 1"),
        ("min_focus", 0 <= s.min_focus <= 1, "min_focus must be between 0 and 1"),
        ("max_forward_jump", s.max_forward_jump >= 1, "max_forward_jump must be >= 1"),
        ("max_backward_jump", s.max_backward_jump >= 0, "max_backward_jump must be >= 0"),
        ("end_margin", s.end_margin >= 0, "end_margin must be >= 0"),
        ("max_frames_per_symbol", s.max_frames_per_symbol > 0, "max_frames_per_symbol must be > 0"),
        ("sample_format", s.sample_format in SAMPLE_FORMATS,
         f"sample_format must be one of {', '.join(SAMPLE_FORMATS)}"),
        ("audio_format", s.audio_format in AUDIO_FORMATS, f"audio_format must be one of {', '.join(AUDIO_FORMATS)}"),
        ("sample_format", s.audio_format != "flac" or s.sample_format in FLAC_SAMPLE_FORMATS,
         f"FLAC stores integer samples: sample_format must be {' or '.join(FLAC_SAMPLE_FORMATS)} with flac"),
        ("sample_rate", s.audio_format != "flac" or s.sample_rate is None or flac_stores(s.sample_rate),
         f"with flac, a sample_rate above {FLAC_ANY_RATE_UP_TO} Hz must be a whole number of tens of Hz "
         f"(FLAC stores no other): {round(s.sample_rate or 0, -1)}, say, not {s.sample_rate}"),
        ("format", s.format in CORPUS_FORMATS, f"format must be one of {', '.join(CORPUS_FORMATS)}"),
        ("text_normalization", s.text_normalization in NORMALIZATIONS,
         f"text_normalization must be one of {', '.join(NORMALIZATIONS)}"),
        ("precision", s.precision is None or s.precision in PRECISION_NAMES,
         f"precision must be one of {', '.join(PRECISION_NAMES)}"),
    ]
    return [(setting, message) for setting, ok, message in checks if not ok]


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}

# What a setting left unset means (it is decided where the run needs it).
UNSET_MEANS = {
    "tacotron2": "checkpoints/tacotron2_statedict.pt; with neither checkpoint given and NVIDIA's files "
                 "missing, the demo voice shipped with tts-batch",
    "waveglow": "checkpoints/waveglow_256channels_universal_v5.pt; with neither checkpoint given and "
                "NVIDIA's files missing, the demo voice shipped with tts-batch",
    "sample_rate": f"the voice's own; {REFERENCE_SAMPLE_RATE} for NVIDIA's",
    "denoiser_strength": f"the voice's own; {REFERENCE_DENOISER_STRENGTH} for NVIDIA's, as the reference; "
                         "0 for the demo voice",
    "seed": "the one the output's manifest records, else a random one (recorded there)",
    "batch_size": f"{BATCH_SIZES['cuda']} on a GPU, {BATCH_SIZES['cpu']} on CPU",
    "device": "cuda when the machine shows a GPU and torch was built for one",
    "precision": "fp16 on CUDA, fp32 on CPU",
    "waveglow_memory": (f"{Fraction(WAVEGLOW_MEMORY_SHARE['cuda'][0])} of the GPU's free memory, at most "
                        f"{WAVEGLOW_MEMORY_SHARE['cuda'][1]:g}; on CPU {Fraction(WAVEGLOW_MEMORY_SHARE['cpu'][0])} "
                        f"of the available RAM, at most {WAVEGLOW_MEMORY_SHARE['cpu'][1]:g}"),
}


def default_help(name: str) -> str:
    """``[default: ...]`` for an option's help: Settings' default (the
    default recipe sets none), or what leaving it unset means."""
    value = FIELDS[name].default
    shown = UNSET_MEANS[name] if value is None else {False: "off", True: "on"}.get(value, value)
    return f"[default: {shown}]"


def _yaml_error(where: str, e: yaml.YAMLError) -> str:
    """One line: the recipe, the line and column where YAML gave up, why."""
    mark = getattr(e, "problem_mark", None)
    at = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{where}{at}: not valid YAML ({problem}); fix the recipe"


def builtin_recipes() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("tts_cli.recipes").iterdir()
                  if p.name.endswith(".yaml"))


def recipe_text(name_or_path: str) -> tuple[str, str]:
    """(where, YAML text) of a built-in recipe name or a file path."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ConfigError(f"recipe must be a built-in recipe's name ({', '.join(builtin_recipes())}) or a file's "
                          f"path, not {name_or_path!r}", "recipe")
    if name_or_path in builtin_recipes():
        where = f"recipes/{name_or_path}.yaml"
        return where, resources.files("tts_cli.recipes").joinpath(f"{name_or_path}.yaml").read_text()
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"recipe {name_or_path!r}: no such built-in recipe "
                          f"({', '.join(builtin_recipes())}) or file")
    try:
        return str(path), path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"recipe {path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"recipe {path}: cannot be read ({e.strerror})") from None


def load_settings(recipe: str = DEFAULT_RECIPE, overrides: dict[str, Any] | None = None) -> Settings:
    """The recipe's settings with ``overrides`` (None values ignored) on
    top. A bad override's message starts with the option as its reader
    gives it (``errors.option``: ``--batch-size``; a Python caller's
    keyword is the setting the message names already)."""
    where, text = recipe_text(recipe)
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_error(where, e)) from None
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: a recipe is a mapping of setting: value")
    unknown = sorted(map(str, set(values) - set(FIELDS)))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(FIELDS)}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    check_names(given)
    try:
        return Settings(**{**values, **given})
    except ConfigError as e:
        if e.setting in given:
            named = option(e.setting)
            raise ConfigError(str(e) if named == e.setting else f"{named}: {e}", e.setting) from None
        raise ConfigError(f"{where}: {e}", e.setting) from None


def check_names(options: dict[str, Any]) -> None:
    """A ConfigError naming the options that are no setting's name."""
    unknown = sorted(set(options) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")


# Settings that do not change a line's audio, and why; every other setting
# is in each line's resume key (resume.audio_identity), so a new one is too
# unless it is listed here.
NOT_IN_THE_RESUME_KEY = {
    "tacotron2": "the files are in the key by their contents (the voice's fingerprint), not their paths",
    "waveglow": "as tacotron2",
    "seed": "the run seed goes into each line's key beside the identity (resume.line_key)",
    "batch_size": "a line's audio does not depend on the batch that made it",
    "waveglow_memory": "WaveGlow runs slices of whole lines: a line's audio does not depend on it",
    "format": "how the corpus is read; what a line says is in its ids",
    "device": "in the key as the device type the voice resolved to",
    "precision": "in the key as the precision the voice resolved to",
    "max_symbols_per_piece": "where a line is cut is in its pieces' ids",
    "piece_pause": "in the key of a cut line only (resume.line_key)",
    "save_mels": "writes a mel beside the WAV; the WAV is the same",
    "shard_size": "which folder a line's files go in; a row from another layout keeps its paths",
    "layout": "where a line's audio is kept; a re-run keeps only rows whose audio is where this layout puts it",
    "strict": "the exit status only",
    "force": "redoes every line whatever the keys",
    "prune": "removes files no row names; a line's audio is the same",
    "quiet": "what is printed only",
}
# What a healthy line meets (alignment.py), and the alignment checks'
# settings: in the key together, and only when the run checks.
ALIGNMENT_THRESHOLDS = ("min_coverage", "min_focus", "max_forward_jump", "max_backward_jump", "end_margin",
                        "max_frames_per_symbol")
ALIGNMENT_SETTINGS = ("check_alignment", "retries", *ALIGNMENT_THRESHOLDS)

# Settings that decide what the loaded models make, so a ``Synthesizer``
# takes them when it loads (the engine is built from them); the others are
# the run's own.
MODEL_SETTINGS = frozenset({
    "tacotron2", "waveglow", "device", "precision", "sigma", "denoiser_strength", "max_decoder_steps",
    "gate_threshold", "prenet_dropout", "waveglow_memory", "save_mels", "check_alignment", "min_coverage",
    "min_focus", "max_forward_jump", "max_backward_jump", "end_margin", "max_frames_per_symbol",
})
