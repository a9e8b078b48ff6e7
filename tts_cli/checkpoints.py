"""Read Tacotron2 and WaveGlow checkpoint files into canonical weight dicts.

This is the only module that knows how checkpoints are laid out on disk.  The
loaders return a flat ``{name: tensor}`` dict (CPU, float32, contiguous) whose
names are those of NVIDIA's reference models, without any wrapper prefix; the
model modules build networks from it, reading every size off tensor shapes.

Formats understood
------------------
* NVIDIA/tacotron2 ``tacotron2_statedict.pt``: a dict with ``iteration``,
  ``state_dict``, ``optimizer``, ``learning_rate``.
* NVIDIA/waveglow ``waveglow_256channels_universal_v5.pt`` and the older
  releases: a dict with ``model``, ``iteration``, ``optimizer``,
  ``learning_rate`` where ``model`` is a pickled ``glow.WaveGlow`` module with
  weight norm (``weight_g``/``weight_v``).  Current releases carry one fused
  ``WN.k.cond_layer``; releases before Aug 2019 carry ``WN.k.cond_layers.i``.
* NVIDIA DeepLearningExamples / NGC: a dict with ``epoch``, ``config``,
  ``state_dict``; names prefixed ``module.``; fp32 or fp16; WaveGlow with
  per-layer ``cond_layers`` in weight-norm form.
* A bare state_dict, or a state_dict stored as a dict under ``model``.
* Both torch serializations: the zip container (torch >= 1.6) and the older
  non-zip one.  Names in the state_dict may also be in modern
  ``parametrizations.weight.original0/1`` weight-norm form.

Canonical WaveGlow names follow the current NVIDIA/waveglow ``glow.py``:
weight norm is folded into plain ``.weight`` tensors, per-layer conditioning
convolutions are fused into ``WN.k.cond_layer``, and everything that is not a
weight of the network (cached ``W_inverse`` and the like) is dropped.

The voice's own settings
------------------------
A WaveGlow file may carry, beside its weights, a top-level entry
``tts_batch_voice`` (``VOICE_ENTRY``) of plain data: the voice's ``name``,
the ``sample_rate`` of the audio it makes and the ``denoiser_strength`` it
runs with, each optional (``VoiceInfo``; ``voice_entry`` writes one). It
travels with the file, so a copy under any name keeps it. NVIDIA's files
carry none.

Safety: files are read by safe_load.py, with torch's weights-only unpickler
and inert stand-ins for pickled modules: a hostile file cannot run code.
"""

from __future__ import annotations

import os
import re
import reprlib
import sys
from dataclasses import asdict, dataclass, fields

import torch

from tts_cli.errors import CheckpointError, option
from tts_cli.formats import SAMPLE_RATES
from tts_cli.safe_load import Inert, read_checkpoint

__all__ = [
    "CheckpointError",
    "load_tacotron2_weights",
    "load_waveglow_weights",
    "load_waveglow",
    "VOICE_ENTRY",
    "VoiceInfo",
    "read_voice_info",
    "voice_entry",
]


# --------------------------------------------------------------------------
# Finding the weights inside what was loaded


def _table(state: dict, name: str) -> dict:
    value = state.get(name)
    return value if isinstance(value, dict) else {}


def _module_tensors(root: Inert) -> dict:
    """Flatten a pickled module tree the way nn.Module.state_dict() names it."""
    out, seen, todo = {}, set(), [("", root)]
    while todo:  # a loop, not recursion: a crafted file may nest very deep
        prefix, module = todo.pop()
        if id(module) in seen:  # ... or make a module its own child
            continue
        seen.add(id(module))
        skip = module.state.get("_non_persistent_buffers_set")
        skip = {k for k in skip if isinstance(k, str)} if isinstance(skip, (set, frozenset, list, tuple)) else ()
        for table in ("_parameters", "_buffers"):
            for key, value in _table(module.state, table).items():
                if isinstance(key, str) and isinstance(value, torch.Tensor) and key not in skip:
                    out[f"{prefix}{key}"] = value
        for key, child in _table(module.state, "_modules").items():
            if isinstance(key, str) and isinstance(child, Inert):
                todo.append((f"{prefix}{key}.", child))
    return out


def _find_weights(obj, depth: int = 0) -> dict | None:
    """The name->tensor mapping in a loaded checkpoint, wherever it is kept."""
    if isinstance(obj, Inert):
        return _module_tensors(obj) or None
    if not isinstance(obj, dict) or depth > 3:
        return None
    for key in ("state_dict", "model"):
        if key in obj:
            found = _find_weights(obj[key], depth + 1)
            if found:
                return found
    tensors = {k: v for k, v in obj.items()
               if isinstance(k, str) and isinstance(v, torch.Tensor)}
    return tensors or None


def _strip_wrappers(weights: dict) -> dict:
    # DataParallel / DistributedDataParallel prefix every name with "module.".
    out = {}
    for key, value in weights.items():
        while key.startswith("module."):
            key = key[len("module."):]
        out[key] = value
    return out


def _kind(weights: dict) -> str | None:
    keys = weights.keys()
    if "embedding.weight" in keys and any(k.startswith("decoder.") for k in keys):
        return "tacotron2"
    if "upsample.weight" in keys and any(k.startswith("WN.0.") for k in keys):
        return "waveglow"
    return None


def _listing(names: list) -> str:
    more = f", ... ({len(names)} in all)" if len(names) > 6 else ""
    return ", ".join(str(n) for n in names[:6]) + more


def _describe(obj, weights: dict) -> str:
    if isinstance(obj, dict):
        found = f"top-level keys: {_listing(list(obj)) or 'none'}"
    elif isinstance(obj, Inert):
        found = f"a pickled {obj.pickled_as} object"
    else:
        found = f"a {type(obj).__name__} object at top level"
    if weights:
        found += f"; weights named {_listing(list(weights))}"
    return found


_OTHER = {"tacotron2": ("WaveGlow", "waveglow"),
          "waveglow": ("Tacotron2", "tacotron2")}


def _weights_for(name: str, obj, wanted: str) -> dict:
    """The prefix-free weights in ``obj`` (the file ``name``, read), checked to be `wanted`."""
    weights = _find_weights(obj)
    weights = _strip_wrappers(weights) if weights else {}
    kind = _kind(weights)
    if kind == wanted:
        return weights
    if kind is not None:
        other, setting = _OTHER[wanted]
        raise CheckpointError(f"{name}: looks like a {other} checkpoint; pass it as {option(setting)}")
    raise CheckpointError(
        f"{name}: holds neither Tacotron2 nor WaveGlow weights ({_describe(obj, weights)})")


def _as_float32(name: str, weights: dict) -> dict:
    out = {}
    for key, value in weights.items():
        if value.layout != torch.strided or not value.is_floating_point():
            raise CheckpointError(
                f"{name}: {key} is a {value.dtype} {value.layout} tensor, not real-valued weights")
        if value.device.type == "meta":
            raise CheckpointError(f"{name}: {key} holds no data (a meta tensor); download the file again")
        out[key] = value.detach().to(device="cpu", dtype=torch.float32).contiguous()
        if not torch.isfinite(out[key]).all():
            raise CheckpointError(f"{name}: {key} holds NaN or infinite values; the file is damaged, "
                                  f"download it again")
    return out


def _require(name: str, weights: dict, needed, model: str) -> None:
    missing = [k for k in needed if k not in weights]
    if missing:
        raise CheckpointError(
            f"{name}: {model} checkpoint is incomplete or of an unknown variant; "
            f"missing {_listing(missing)}")


# --------------------------------------------------------------------------
# Tacotron2

_TACOTRON2_PARTS = ("embedding.", "encoder.", "decoder.", "postnet.")
_TACOTRON2_NEEDED = (
    "embedding.weight",
    "encoder.convolutions.0.0.conv.weight",
    "encoder.lstm.weight_ih_l0",
    "decoder.attention_rnn.weight_ih",
    "decoder.decoder_rnn.weight_ih",
    "decoder.linear_projection.linear_layer.weight",
    "decoder.gate_layer.linear_layer.weight",
    "postnet.convolutions.0.0.conv.weight",
)


def load_tacotron2_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Canonical Tacotron2 weights (NVIDIA/tacotron2 model.py names) from `path`."""
    name = os.fspath(path)
    weights = _weights_for(name, read_checkpoint(name), "tacotron2")
    # BatchNorm's step counter is training state, not a weight.
    kept = {k: v for k, v in weights.items()
            if k.startswith(_TACOTRON2_PARTS) and not k.endswith("num_batches_tracked")}
    _require(name, kept, _TACOTRON2_NEEDED, "Tacotron2")
    return _as_float32(name, kept)


# --------------------------------------------------------------------------
# WaveGlow

_WAVEGLOW_KEY = re.compile(
    r"upsample\.(weight|bias)"
    r"|WN\.\d+\.(start|end|cond_layer)\.(weight|bias)"
    r"|WN\.\d+\.(in_layers|res_skip_layers)\.\d+\.(weight|bias)"
    r"|convinv\.\d+\.conv\.weight")
_FLOW_KEY = re.compile(r"WN\.(\d+)\.")
_PER_LAYER_COND = re.compile(r"(WN\.\d+)\.cond_layers\.(\d+)\.(weight|bias)")
_WEIGHT_NORM_PAIRS = ((".weight_g", ".weight_v", ".weight"),
                      (".parametrizations.weight.original0",
                       ".parametrizations.weight.original1", ".weight"))


def _fold(name: str, key: str, g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w = g * v / ||v||, the norm taken over every dim where g has size 1.

    That covers weight_norm's default dim=0 (g is [out, 1, 1]) as well as any
    other dim it was applied on.  The arithmetic is float64 (fp16 files lose
    no bits); writing straight into a float32 result keeps a float64 copy of
    each large tensor from being made.
    """
    if not (g.is_floating_point() and v.is_floating_point()) or g.dim() not in (
            0, v.dim()) or any(gs not in (1, vs) for gs, vs in zip(g.shape, v.shape)):
        raise CheckpointError(
            f"{name}: weight-norm tensors of {key} do not match "
            f"({tuple(g.shape)} vs {tuple(v.shape)})")
    v, g = v.detach(), g.detach().double()
    dims = [d for d in range(v.dim()) if g.dim() == 0 or g.shape[d] == 1]
    if dims:
        norm = torch.linalg.vector_norm(v, dim=dims, keepdim=True, dtype=torch.float64)
    else:  # g as large as v: every element is its own "row"
        norm = v.double().abs()
    return torch.mul(v, g / norm, out=torch.empty(v.shape, dtype=torch.float32))


def _fold_weight_norm(name: str, weights: dict) -> dict:
    out = dict(weights)
    for g_suffix, v_suffix, w_suffix in _WEIGHT_NORM_PAIRS:
        for key in [k for k in out if k.endswith(g_suffix)]:
            base = key[: -len(g_suffix)]
            if base + v_suffix in out:
                g, v = out.pop(key), out.pop(base + v_suffix)
                out[base + w_suffix] = _fold(name, base + w_suffix, g, v)
    return out


def _fuse_cond_layers(name: str, weights: dict) -> dict:
    """Turn per-layer WN.k.cond_layers.i into one WN.k.cond_layer.

    The fused layer's output rows 2C*i .. 2C*(i+1) belong to layer i, so the
    per-layer tensors stack along dim 0 in layer order.
    """
    parts: dict = {}
    out = {}
    for key, value in weights.items():
        m = _PER_LAYER_COND.fullmatch(key)
        if m:
            parts.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = value
        else:
            out[key] = value
    for (flow, what), layers in parts.items():
        if sorted(layers) != list(range(len(layers))):
            raise CheckpointError(
                f"{name}: {flow}.cond_layers has gaps (layers {sorted(layers)})")
        try:
            out[f"{flow}.cond_layer.{what}"] = torch.cat(
                [layers[i].float() for i in range(len(layers))], dim=0)
        except RuntimeError as exc:
            raise CheckpointError(
                f"{name}: {flow}.cond_layers have mismatched shapes") from exc
    return out


def _check_waveglow(name: str, weights: dict) -> None:
    if any(".res_layers." in k or ".skip_layers." in k for k in weights):
        raise CheckpointError(
            f"{name}: uses the early WaveGlow layout (res_layers/skip_layers); "
            "use waveglow_256channels_universal_v5.pt or newer")
    flows = sorted({int(m.group(1)) for m in map(_FLOW_KEY.match, weights) if m})
    needed = ["upsample.weight"]
    for k in flows:
        needed += [f"WN.{k}.start.weight", f"WN.{k}.end.weight",
                   f"WN.{k}.cond_layer.weight", f"WN.{k}.in_layers.0.weight",
                   f"WN.{k}.res_skip_layers.0.weight", f"convinv.{k}.conv.weight"]
    _require(name, weights, needed, "WaveGlow")


def load_waveglow_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Canonical WaveGlow weights (current NVIDIA/waveglow glow.py names) from `path`."""
    return load_waveglow(path)[0]


def load_waveglow(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], VoiceInfo]:
    """The canonical WaveGlow weights and the voice settings the file carries
    (``read_voice_info``), from one read of the file."""
    name = os.fspath(path)
    obj = read_checkpoint(name)
    info = _voice_info(name, obj)
    return _canonical_waveglow(name, _weights_for(name, obj, "waveglow")), info


def _canonical_waveglow(name: str, weights: dict) -> dict[str, torch.Tensor]:
    weights = _fold_weight_norm(name, weights)
    weights = _fuse_cond_layers(name, weights)
    _check_waveglow(name, weights)
    kept = {k: v for k, v in weights.items() if _WAVEGLOW_KEY.fullmatch(k)}
    return _as_float32(name, kept)


# --------------------------------------------------------------------------
# The voice's own settings, in its WaveGlow file

VOICE_ENTRY = "tts_batch_voice"
# Sample rates a voice may state, in Hz: those the files may be written at.
VOICE_SAMPLE_RATES = range(SAMPLE_RATES[0], SAMPLE_RATES[1] + 1)


@dataclass(frozen=True)
class VoiceInfo:
    """What a WaveGlow file's ``VOICE_ENTRY`` says; None: it does not say."""
    name: str | None = None                 # the voice's name, shown to the user
    sample_rate: int | None = None          # Hz of the audio the WaveGlow makes (the mels' rate)
    denoiser_strength: float | None = None  # what a run that sets none uses; 0: no denoiser


_VOICE_FIELDS = tuple(field.name for field in fields(VoiceInfo))


def read_voice_info(path: str | os.PathLike) -> VoiceInfo:
    """The voice settings that the file at ``path`` carries (an empty
    VoiceInfo when it has no ``VOICE_ENTRY``), read as safely as its
    weights; an entry of the wrong form is a CheckpointError."""
    name = os.fspath(path)
    return _voice_info(name, read_checkpoint(name))


def _voice_info(name: str, obj) -> VoiceInfo:
    entry = obj.get(VOICE_ENTRY) if isinstance(obj, dict) else None
    return VoiceInfo() if entry is None else _checked_voice_info(name, entry)


def voice_entry(info: VoiceInfo) -> dict:
    """``{VOICE_ENTRY: {...}}`` for ``info``'s stated fields, checked: what to
    add to a checkpoint's top-level dict before torch.save."""
    entry = {key: value for key, value in asdict(info).items() if value is not None}
    _checked_voice_info("the voice entry", entry)
    return {VOICE_ENTRY: entry}


def _checked_voice_info(name: str, entry) -> VoiceInfo:
    fix = f"fix or remove the file's {VOICE_ENTRY} entry (checkpoints/README.md)"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{name}: {VOICE_ENTRY} must be a mapping of {', '.join(_VOICE_FIELDS)}, "
                              f"not {_shown(entry)}; {fix}")
    unknown = [key for key in entry if key not in _VOICE_FIELDS]
    if unknown:
        raise CheckpointError(f"{name}: {VOICE_ENTRY} has unknown key(s) {_listing([_shown(k) for k in unknown])} "
                              f"(known: {', '.join(_VOICE_FIELDS)}); {fix}")
    problem = _voice_field_problem(entry)
    if problem:
        raise CheckpointError(f"{name}: {VOICE_ENTRY}: {problem}; {fix}")
    strength = entry.get("denoiser_strength")
    return VoiceInfo(**{**entry, "denoiser_strength": None if strength is None else float(strength)})


def _voice_field_problem(entry: dict) -> str | None:
    voice, rate, strength = entry.get("name"), entry.get("sample_rate"), entry.get("denoiser_strength")
    checks = [
        (voice is None or isinstance(voice, str) and 0 < len(voice.strip()) and len(voice) <= 100
         and voice.isprintable(),
         f"name must be a one-line string of 1 to 100 characters, not {_shown(voice)}"),
        (rate is None or _is_number(rate) and not isinstance(rate, float) and rate in VOICE_SAMPLE_RATES,
         f"sample_rate must be a whole number of Hz from {VOICE_SAMPLE_RATES.start} to "
         f"{VOICE_SAMPLE_RATES.stop - 1}, not {_shown(rate)}"),
        # a chain of comparisons: NaN, infinities and ints too large for a float all fail it
        (strength is None or _is_number(strength) and 0 <= strength <= sys.float_info.max,
         f"denoiser_strength must be a number >= 0 (0: no denoiser), not {_shown(strength)}"),
    ]
    return next((message for ok, message in checks if not ok), None)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value) -> str:
    """A value from a file, short and on one line."""
    return " ".join(reprlib.repr(value).split())
