"""Write Tacotron2 / WaveGlow checkpoint files in every published layout.

Each writer takes a canonical weight dict (what ``tts_cli.checkpoints`` returns:
NVIDIA names, weight norm folded, WaveGlow conditioning fused) and writes a
file the way the publisher's code would have, so any test can turn weights of
a real tiny model into a "downloaded" checkpoint:

* ``write_nvidia_tacotron2``   NVIDIA/tacotron2 ``tacotron2_statedict.pt``
* ``write_ngc_tacotron2``      DeepLearningExamples / NGC (``module.``, fp16 opt.)
* ``write_pickled_waveglow``   NVIDIA/waveglow: a pickled ``glow.WaveGlow`` module
* ``write_ngc_waveglow``       DeepLearningExamples / NGC WaveGlow
* ``write_bare_state_dict``    just the state_dict, no wrapper
* ``write_state_dict_under_model``  ``{"model": state_dict, ...}``

Like the published files, those of NVIDIA and NGC record their tensors as
saved on "cuda:0"; they load on a CPU-only machine only through a loader that
remaps them, as ``tts_cli.checkpoints`` does.

``random_tacotron2_state_dict`` / ``random_waveglow_state_dict`` make small
canonical dicts of random tensors for tests that only move weights around;
``weight_norm_pair`` and ``waveglow_weight_norm_state_dict`` give the
weight-norm form of canonical weights.
"""
from __future__ import annotations

import sys
import types
import warnings
from collections import OrderedDict
from unittest import mock

import torch
from torch import nn

from tts_cli.checkpoints import VOICE_ENTRY

# --------------------------------------------------------------------------
# Small canonical dicts


def random_tacotron2_state_dict(seed: int = 0, n_symbols: int = 10, emb: int = 8,
                                n_mel: int = 4, enc_convs: int = 2, kernel: int = 3,
                                prenet: int = 6, att_rnn: int = 12, dec_rnn: int = 12,
                                att_dim: int = 5, loc_filters: int = 3,
                                post_convs: int = 3, post_dim: int = 6) -> dict:
    """Random tensors under every canonical Tacotron2 name, shapes consistent."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict = {}

    def put(name, *shape):
        sd[name] = torch.randn(*shape, generator=gen)

    def conv_bn(prefix, c_out, c_in):
        put(f"{prefix}.0.conv.weight", c_out, c_in, kernel)
        put(f"{prefix}.0.conv.bias", c_out)
        for part in ("weight", "bias", "running_mean"):
            put(f"{prefix}.1.{part}", c_out)
        sd[f"{prefix}.1.running_var"] = torch.rand(c_out, generator=gen) + 0.5

    def lstm(prefix, hidden, n_in, suffix=""):
        put(f"{prefix}.weight_ih{suffix}", 4 * hidden, n_in)
        put(f"{prefix}.weight_hh{suffix}", 4 * hidden, hidden)
        put(f"{prefix}.bias_ih{suffix}", 4 * hidden)
        put(f"{prefix}.bias_hh{suffix}", 4 * hidden)

    put("embedding.weight", n_symbols, emb)
    for i in range(enc_convs):
        conv_bn(f"encoder.convolutions.{i}", emb, emb)
    for suffix in ("_l0", "_l0_reverse"):
        lstm("encoder.lstm", emb // 2, emb, suffix)
    d = "decoder"
    put(f"{d}.prenet.layers.0.linear_layer.weight", prenet, n_mel)
    put(f"{d}.prenet.layers.1.linear_layer.weight", prenet, prenet)
    lstm(f"{d}.attention_rnn", att_rnn, prenet + emb)
    a = f"{d}.attention_layer"
    put(f"{a}.query_layer.linear_layer.weight", att_dim, att_rnn)
    put(f"{a}.memory_layer.linear_layer.weight", att_dim, emb)
    put(f"{a}.v.linear_layer.weight", 1, att_dim)
    put(f"{a}.location_layer.location_conv.conv.weight", loc_filters, 2, kernel)
    put(f"{a}.location_layer.location_dense.linear_layer.weight", att_dim, loc_filters)
    lstm(f"{d}.decoder_rnn", dec_rnn, att_rnn + emb)
    put(f"{d}.linear_projection.linear_layer.weight", n_mel, dec_rnn + emb)
    put(f"{d}.linear_projection.linear_layer.bias", n_mel)
    put(f"{d}.gate_layer.linear_layer.weight", 1, dec_rnn + emb)
    put(f"{d}.gate_layer.linear_layer.bias", 1)
    sizes = [n_mel] + [post_dim] * (post_convs - 1) + [n_mel]
    for i in range(post_convs):
        conv_bn(f"postnet.convolutions.{i}", sizes[i + 1], sizes[i])
    return sd


def random_waveglow_state_dict(seed: int = 0, n_mel: int = 4, n_group: int = 4,
                               n_flows: int = 2, n_layers: int = 2, n_channels: int = 8,
                               kernel: int = 3, upsample_kernel: int = 8) -> dict:
    """Random tensors under every canonical WaveGlow name (no early outputs)."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict = {}

    def put(name, *shape):
        sd[name] = torch.randn(*shape, generator=gen)

    put("upsample.weight", n_mel, n_mel, upsample_kernel)
    put("upsample.bias", n_mel)
    half, cond_in = n_group // 2, n_mel * n_group
    for k in range(n_flows):
        w = f"WN.{k}"
        put(f"{w}.start.weight", n_channels, half, 1)
        put(f"{w}.start.bias", n_channels)
        put(f"{w}.end.weight", 2 * half, n_channels, 1)
        put(f"{w}.end.bias", 2 * half)
        put(f"{w}.cond_layer.weight", 2 * n_channels * n_layers, cond_in, 1)
        put(f"{w}.cond_layer.bias", 2 * n_channels * n_layers)
        for i in range(n_layers):
            res_skip = 2 * n_channels if i < n_layers - 1 else n_channels
            put(f"{w}.in_layers.{i}.weight", 2 * n_channels, n_channels, kernel)
            put(f"{w}.in_layers.{i}.bias", 2 * n_channels)
            put(f"{w}.res_skip_layers.{i}.weight", res_skip, n_channels, 1)
            put(f"{w}.res_skip_layers.{i}.bias", res_skip)
        put(f"convinv.{k}.conv.weight", n_group, n_group, 1)
    return sd


# --------------------------------------------------------------------------
# Shared pieces


def weight_norm_pair(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, v) with g * v / ||v|| == w (norm over all dims but 0, as weight_norm).

    v is w scaled by a different positive factor per output channel, so a
    reader that took v for the weight, or forgot g, gets visibly wrong values.
    """
    shape = (-1,) + (1,) * (w.dim() - 1)
    g = w.double().flatten(1).norm(dim=1).view(shape).to(w.dtype)
    scale = torch.linspace(0.5, 2.0, w.shape[0], dtype=w.dtype).view(shape)
    return g, w * scale


def _n_layers(sd: dict, flow: int) -> int:
    prefix = f"WN.{flow}.in_layers."
    return len({k[len(prefix):].split(".")[0] for k in sd if k.startswith(prefix)})


def _n_flows(sd: dict) -> int:
    return len({k.split(".")[1] for k in sd if k.startswith("WN.")})


def _split_cond(sd: dict, flow: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (weight, bias) of a fused cond_layer: 2C rows per layer."""
    w, b = sd[f"WN.{flow}.cond_layer.weight"], sd[f"WN.{flow}.cond_layer.bias"]
    rows = 2 * sd[f"WN.{flow}.start.weight"].shape[0]
    return [(w[i * rows:(i + 1) * rows], b[i * rows:(i + 1) * rows])
            for i in range(_n_layers(sd, flow))]


def _is_weight_normed(key: str) -> bool:
    """Which canonical WaveGlow weights NVIDIA keeps in weight-norm form."""
    parts = key.split(".")
    return parts[0] == "WN" and parts[-1] == "weight" and parts[2] in (
        "start", "cond_layer", "cond_layers", "in_layers", "res_skip_layers")


def waveglow_weight_norm_state_dict(sd: dict, per_layer_cond: bool) -> dict:
    """The state_dict a weight-normed WaveGlow module would have for `sd`."""
    out: dict = OrderedDict()
    for key, value in sd.items():
        flow = key.split(".")[1] if key.startswith("WN.") else None
        if per_layer_cond and key.endswith(".cond_layer.weight"):
            for i, (w, b) in enumerate(_split_cond(sd, int(flow))):
                out[f"WN.{flow}.cond_layers.{i}.bias"] = b.clone()
                out[f"WN.{flow}.cond_layers.{i}.weight_g"], \
                    out[f"WN.{flow}.cond_layers.{i}.weight_v"] = weight_norm_pair(w)
        elif per_layer_cond and key.endswith(".cond_layer.bias"):
            continue  # written with the weights above
        elif _is_weight_normed(key):
            base = key[: -len(".weight")]
            out[base + ".weight_g"], out[base + ".weight_v"] = weight_norm_pair(value)
        else:
            out[key] = value.clone()
    return out


def _save(obj, path, legacy: bool = False, device: str = "cuda:0") -> None:
    """torch.save, with every tensor recorded as living on `device`.

    The published files were saved from GPUs, so their tensors say "cuda:0"
    and only load on a CPU-only machine when the loader remaps them.
    """
    with mock.patch.object(torch.serialization, "location_tag", lambda _storage: device):
        torch.save(obj, path, _use_new_zipfile_serialization=not legacy)


def _maybe_half(sd: dict, fp16: bool) -> dict:
    return OrderedDict((k, v.half() if fp16 and v.is_floating_point() else v)
                       for k, v in sd.items())


def _fake_optimizer(sd: dict) -> dict:
    """An Adam state_dict shaped like the real one (tensors, ints, tuples)."""
    first = next(iter(sd.values()))
    return {"state": {0: {"step": torch.tensor(10.0), "exp_avg": torch.zeros_like(first),
                          "exp_avg_sq": torch.zeros_like(first)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                              "weight_decay": 1e-6, "amsgrad": False,
                              "params": list(range(len(sd)))}]}


# --------------------------------------------------------------------------
# Tacotron2 writers


def _with_batchnorm_counters(sd: dict) -> dict:
    """torch >= 0.4.1 state_dicts carry num_batches_tracked beside BN stats."""
    out: dict = OrderedDict()
    for key, value in sd.items():
        out[key] = value
        if key.endswith(".running_var"):
            out[key[: -len("running_var")] + "num_batches_tracked"] = torch.tensor(1000)
    return out


def write_nvidia_tacotron2(path, sd: dict, legacy: bool = False) -> None:
    """NVIDIA/tacotron2 train.py layout; legacy=True: pre-1.6 non-zip file."""
    _save({"iteration": 188000, "state_dict": _with_batchnorm_counters(sd),
           "optimizer": _fake_optimizer(sd), "learning_rate": 1e-3}, path, legacy)


def _tacotron2_config(sd: dict) -> dict:
    n_symbols, emb = sd["embedding.weight"].shape
    return {"mask_padding": False, "n_mel_channels": sd[
        "decoder.linear_projection.linear_layer.weight"].shape[0],
        "n_symbols": n_symbols, "symbols_embedding_dim": emb,
        "encoder_embedding_dim": emb, "n_frames_per_step": 1,
        "max_decoder_steps": 2000, "gate_threshold": 0.5}


def write_ngc_tacotron2(path, sd: dict, fp16: bool = False) -> None:
    """DeepLearningExamples / NGC layout: epoch, config, module.-prefixed state_dict."""
    state = _maybe_half(_with_batchnorm_counters(sd), fp16)
    _save({"epoch": 1500, "config": _tacotron2_config(sd),
           "state_dict": OrderedDict(("module." + k, v) for k, v in state.items())}, path)


# --------------------------------------------------------------------------
# Generic writers


def write_bare_state_dict(path, sd: dict, legacy: bool = False, voice=None) -> None:
    """torch.save(model.state_dict()) with nothing around it (saved on CPU);
    ``voice``: a voice entry (VOICE_ENTRY) beside the tensors."""
    _save(OrderedDict(sd, **_voice(voice)), path, legacy, device="cpu")


def _voice(entry) -> dict:
    return {} if entry is None else {VOICE_ENTRY: entry}


def write_state_dict_under_model(path, sd: dict) -> None:
    """A state_dict kept as a plain dict under "model" (some forks save this)."""
    _save({"model": OrderedDict(sd), "iteration": 10, "optimizer": None}, path)


# --------------------------------------------------------------------------
# WaveGlow writers


def write_ngc_waveglow(path, sd: dict, fp16: bool = False, voice=None) -> None:
    """DeepLearningExamples / NGC WaveGlow: per-layer cond_layers, weight norm,
    module.; ``voice``: a voice entry (VOICE_ENTRY), as the demo voice's recipe writes."""
    state = _maybe_half(waveglow_weight_norm_state_dict(sd, per_layer_cond=True), fp16)
    n_group = sd["convinv.0.conv.weight"].shape[0]
    config = {"n_mel_channels": sd["upsample.weight"].shape[0], "n_flows": _n_flows(sd),
              "n_group": n_group, "n_early_every": 4, "n_early_size": 2,
              "WN_config": {"n_layers": _n_layers(sd, 0), "kernel_size":
                            sd["WN.0.in_layers.0.weight"].shape[2],
                            "n_channels": sd["WN.0.start.weight"].shape[0]}}
    _save({"epoch": 1000, "config": config,
           "state_dict": OrderedDict(("module." + k, v) for k, v in state.items()), **_voice(voice)}, path)


class _OldTorchBackend:
    """Pickles like the ``_backend`` attribute torch < 1.4 put on every module."""

    def __reduce__(self):
        import torch.nn.backends.thnn as thnn
        return (thnn._get_thnn_function_backend, ())


def _conv(w: torch.Tensor, b: torch.Tensor | None, transposed: bool = False) -> nn.Module:
    if transposed:  # ConvTranspose1d weight is [in, out, k]
        conv = nn.ConvTranspose1d(w.shape[0], w.shape[1], w.shape[2], bias=b is not None)
    else:
        conv = nn.Conv1d(w.shape[1], w.shape[0], w.shape[2], bias=b is not None)
    with torch.no_grad():
        conv.weight.copy_(w)
        if b is not None:
            conv.bias.copy_(b)
    return conv


def _weight_normed_conv(w: torch.Tensor, b: torch.Tensor) -> nn.Module:
    conv = nn.Conv1d(w.shape[1], w.shape[0], w.shape[2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.x deprecates this weight_norm
        conv = nn.utils.weight_norm(conv)
    # The module's plain `weight` attribute stays the one computed from the
    # random init, as in real checkpoints, where it lags the last optimizer
    # step; only weight_g / weight_v carry the trained weight.
    g, v = weight_norm_pair(w)
    with torch.no_grad():
        conv.weight_g.copy_(g)
        conv.weight_v.copy_(v)
        conv.bias.copy_(b)
    return conv


class _GlowWN(nn.Module):
    __module__, __qualname__ = "glow", "WN"

    def __init__(self, sd: dict, flow: int, per_layer_cond: bool):
        super().__init__()
        p = f"WN.{flow}."
        self.n_layers = _n_layers(sd, flow)
        self.n_channels = sd[p + "start.weight"].shape[0]
        self.in_layers, self.res_skip_layers = nn.ModuleList(), nn.ModuleList()
        if per_layer_cond:
            self.cond_layers = nn.ModuleList(
                _weight_normed_conv(w, b) for w, b in _split_cond(sd, flow))
        self.start = _weight_normed_conv(sd[p + "start.weight"], sd[p + "start.bias"])
        self.end = _conv(sd[p + "end.weight"], sd[p + "end.bias"])
        if not per_layer_cond:
            self.cond_layer = _weight_normed_conv(sd[p + "cond_layer.weight"],
                                                  sd[p + "cond_layer.bias"])
        for i in range(self.n_layers):
            for name in ("in_layers", "res_skip_layers"):
                getattr(self, name).append(_weight_normed_conv(
                    sd[f"{p}{name}.{i}.weight"], sd[f"{p}{name}.{i}.bias"]))


class _GlowInvertible1x1Conv(nn.Module):
    __module__, __qualname__ = "glow", "Invertible1x1Conv"

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.conv = _conv(w, None)
        # Inference caches the inverse as a plain attribute; saved files can
        # carry it, and it is not a weight.
        self.W_inverse = torch.linalg.inv(w.squeeze(-1).double()).float()[..., None]


class _GlowWaveGlow(nn.Module):
    __module__, __qualname__ = "glow", "WaveGlow"

    def __init__(self, sd: dict, per_layer_cond: bool):
        super().__init__()
        self.upsample = _conv(sd["upsample.weight"], sd["upsample.bias"], transposed=True)
        self.n_flows = _n_flows(sd)
        self.n_group = sd["convinv.0.conv.weight"].shape[0]
        self.WN = nn.ModuleList(_GlowWN(sd, k, per_layer_cond) for k in range(self.n_flows))
        self.convinv = nn.ModuleList(_GlowInvertible1x1Conv(sd[f"convinv.{k}.conv.weight"])
                                     for k in range(self.n_flows))


_GLOW_CLASSES = {"WaveGlow": _GlowWaveGlow, "WN": _GlowWN,
                 "Invertible1x1Conv": _GlowInvertible1x1Conv}


def write_pickled_waveglow(path, sd: dict, per_layer_cond: bool = False,
                           legacy: bool = False) -> None:
    """NVIDIA/waveglow layout: {"model": <glow.WaveGlow module>, ...}.

    per_layer_cond: WN.k.cond_layers.i as in releases before Aug 2019.
    legacy: pre-1.6 non-zip serialization, and modules carrying the
    ``_backend`` attribute that torch < 1.4 pickled (as the 2018-19 files do).
    A ``glow`` module exists in sys.modules only while the file is written.
    """
    if "glow" in sys.modules:
        raise RuntimeError("a real 'glow' module is imported; refusing to shadow it")
    glow = types.ModuleType("glow")
    for name, cls in _GLOW_CLASSES.items():
        setattr(glow, name, cls)
    model = _GlowWaveGlow(sd, per_layer_cond)
    if legacy:
        for module in model.modules():
            module._backend = _OldTorchBackend()
    sys.modules["glow"] = glow
    try:
        with warnings.catch_warnings():
            # The non-zip format tries to store each module class's source.
            warnings.filterwarnings("ignore", message="Couldn't retrieve source")
            _save({"model": model, "iteration": 580000, "optimizer": None,
                   "learning_rate": 1e-4}, path, legacy)
    finally:
        del sys.modules["glow"]
