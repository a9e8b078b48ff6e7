"""Make the reference goldens in this folder with NVIDIA's own code.

Small random Tacotron2 and WaveGlow models are built by NVIDIA's classes,
saved in NVIDIA's file formats, read back the way NVIDIA's inference reads
them, and run by NVIDIA's ``Tacotron2.inference`` and ``WaveGlow.infer`` on
CPU in float32, batch of one, eval mode. tests/test_reference_goldens.py
compares tts_cli's outputs with what this script stores. README.md here says
what each file is and the command that remakes them.

Randomness: NVIDIA's prenet dropout (on at inference) and WaveGlow's noise
are drawn from torch's global generator, tts_cli's from a counter-based
generator keyed by a line's seed (tts_cli/randomness.py). So that both runs
see the same draws, NVIDIA's draws are replaced, at run time, by the ones
tts_cli makes for the case's seed: its ``F.dropout`` (inside model.py) by
the keep masks tts_cli's prenet uses at that step and layer, its
``torch.cuda.FloatTensor(...).normal_()`` (inside glow.py, which also needs
it on CPU) by tts_cli's noise for that draw. Nothing else of NVIDIA's code
is changed, and none of its files is edited.

Not run by the tests; it needs NVIDIA's checkouts at the pinned commits
(checked here by the git blob ids of the files used) and nothing else beyond
tts_cli's own dependencies: the audio-feature modules NVIDIA's files import
but inference never calls (scipy, librosa) are stand-ins that raise if used.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import sys
import types
import warnings
from pathlib import Path
from unittest import mock

import torch

from tts_cli import randomness

TACOTRON2_COMMIT = "185cd24e046cc1304b4f8e564734d2498c6e2e6f"   # NVIDIA/tacotron2 master, 2020-06-11
WAVEGLOW_COMMIT = "8afb643df59265016af6bd255c7516309d675168"    # NVIDIA/waveglow master, 2020-09-02
# NVIDIA/waveglow 2019-05-31, the last commit before conditioning was fused
# into one layer per flow (883651d, 2019-08-27): the older release format.
WAVEGLOW_2019_COMMIT = "6188a1d106a1060336040db82f464d6441f39e21"

# git blob ids of the files this script runs, at the commits above
TACOTRON2_FILES = {
    "model.py": "ec0e9cea43e1b23f89934d85298b8f9d1883d13f",
    "layers.py": "615a64a4394cb7482cc19bd0bd26f842d38d9b3d",
    "utils.py": "43952018447c94684b3821b759aa50e001c0bd1b",
    "text/__init__.py": "02ecf0e741145fe0d6c1ede752acd7027b934af6",
    "text/cleaners.py": "e2e35c1a8cc4c628c5d05802677142c9a2122d2b",
    "text/numbers.py": "0d5f7fa818a45ecf132627d240afac653e148070",
    "text/symbols.py": "1be47bfc75cda0f78aa2bd2bb8e45ff5cdc64336",
    "text/cmudict.py": "62bfef745c30a56f7b6605d9e3becfbc40edb50d",
}
WAVEGLOW_FILES = {"glow.py": "7a7696403d505afdf0f1606f8220801b0f46152f"}
WAVEGLOW_2019_FILES = {"glow.py": "a04afedb8bac86c1722a13f53f303578cd250c8e"}

TEXTS = [
    "Dr. Smith paid $3.50 for 2 tickets on May 2nd, 1995.",
    "The caf\u00e9's \u201cbest\u201d cr\u00eape costs \u00a35\u2014really?",
    "Turn left on {HH AW1 S} street, then 1,000 yards.",
    "Hello, world!",
]

N_MEL = 6
HPARAMS = dict(   # the fields NVIDIA's model.py reads from its hparams
    mask_padding=False, fp16_run=False, n_mel_channels=N_MEL, n_frames_per_step=1,
    n_symbols=148, symbols_embedding_dim=32, encoder_embedding_dim=32,
    encoder_kernel_size=5, encoder_n_convolutions=3,
    prenet_dim=16, attention_rnn_dim=32, decoder_rnn_dim=32, attention_dim=16,
    attention_location_n_filters=4, attention_location_kernel_size=7,
    postnet_embedding_dim=16, postnet_kernel_size=5, postnet_n_convolutions=3,
    max_decoder_steps=200, gate_threshold=0.5, p_attention_dropout=0.1, p_decoder_dropout=0.1)
PRENET_LAYERS = 2          # NVIDIA's Prenet: two layers of prenet_dim
PRENET_P = 0.5             # NVIDIA's Prenet: p fixed at 0.5
STOP_RANGE = (20, 80)      # the gate is set so that every line stops within these frames,
GATE_MARGIN = 1e-3         # its logit this far from the threshold at every step up to the stop
GATE_TRIALS = 64
# NVIDIA's initialisation lets the decoder's state settle within ~20 frames,
# after which frames differ only by prenet dropout; with the decoder's LSTM
# weights this many times larger its state keeps moving, and the frames
# test more of the recurrence.
DECODER_RNN_SCALE = 4.0

WAVEGLOW = dict(n_mel_channels=N_MEL, n_flows=4, n_group=8, n_early_every=2, n_early_size=2,
                WN_config=dict(n_layers=2, n_channels=8, kernel_size=3))
SIGMA = 0.666              # NVIDIA's inference notebook's

# (text, seed or None for dropout off): each decoded by NVIDIA's Tacotron2
TACOTRON2_CASES = [(0, 11), (1, 12), (2, 13), (3, 14), (3, None)]
# (file, Tacotron2 case whose NVIDIA mel it vocodes, seed)
WAVEGLOW_CASES = [("nvidia_waveglow.pt", 3, 14), ("nvidia_waveglow.pt", 4, 21),
                  ("nvidia_waveglow_2019.pt", 3, 14)]
NOISE_HEAD = 32            # values of each case's first noise draw kept, to tell changed draws from changed models


def git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_checkout(root: Path, files: dict[str, str], commit: str) -> None:
    for name, blob in files.items():
        if not (root / name).is_file() or git_blob_id(root / name) != blob:
            sys.exit(f"{root / name} is not the file at commit {commit}; check that commit out there")


def stand_in_modules() -> None:
    """scipy and librosa, as NVIDIA's tacotron2 files import them at the top,
    where they are not installed: inference calls none of these names."""
    def unavailable(*_args, **_kwargs):
        raise RuntimeError("a stand-in of make_goldens.py was called; inference should not need it")
    names = {"scipy": [], "scipy.io": [], "scipy.io.wavfile": ["read"], "scipy.signal": ["get_window"],
             "librosa": [], "librosa.filters": ["mel"], "librosa.util": ["pad_center", "tiny"]}
    installed = {top: importlib.util.find_spec(top) is not None for top in ("scipy", "librosa")}
    for name, attributes in names.items():
        if installed[name.split(".")[0]]:
            continue
        module = types.ModuleType(name)
        for attribute in attributes:
            setattr(module, attribute, unavailable)
        sys.modules[name] = module
    for name in names:
        if "." in name and name in sys.modules:
            parent, child = name.rsplit(".", 1)
            setattr(sys.modules[parent], child, sys.modules[name])


def import_glow(root: Path) -> types.ModuleType:
    """``glow`` from one checkout, under its own name (files pickle its classes as ``glow.*``)."""
    spec = importlib.util.spec_from_file_location("glow", root / "glow.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["glow"] = module
    spec.loader.exec_module(module)
    return module


class SeededPrenetDropout:
    """torch.nn.functional as NVIDIA's model.py sees it while one line is
    decoded: every name as torch's, except that active dropout (only the
    prenet's: ``training=True`` at inference) multiplies by tts_cli's keep
    mask for this line's seed, decoder step and prenet layer, or does
    nothing when the seed is None (dropout off)."""

    def __init__(self, seed: int | None):
        self.seed, self.calls = seed, 0

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    def dropout(self, x, p=0.5, training=True, inplace=False):
        if not training:
            return x
        assert p == PRENET_P and x.shape[0] == 1
        step, layer = divmod(self.calls, PRENET_LAYERS)
        self.calls += 1
        if self.seed is None:
            return x
        keep = randomness.dropout_keep(torch.tensor([self.seed]), torch.tensor([step]),
                                       stream=1 + layer, width=x.shape[1], p=p)
        return x * keep


def prenet_mask_head(seed: int, steps: int = 4) -> torch.Tensor:
    """The first steps' keep masks of both prenet layers for ``seed``, (steps, 2*prenet_dim)."""
    rows = []
    for step in range(steps):
        rows.append(torch.cat([randomness.dropout_keep(torch.tensor([seed]), torch.tensor([step]), 1 + layer,
                                                      HPARAMS["prenet_dim"], PRENET_P)[0]
                               for layer in range(PRENET_LAYERS)]))
    return torch.stack(rows)


class SeededNoise:
    """``torch.cuda.FloatTensor`` as glow.py's ``infer`` calls it for one
    line: ``FloatTensor(B, C, T).normal_()`` gives tts_cli's noise for the
    line's seed, draw by draw in the order infer makes them (the last flow's
    channels first, then each early output from the last flow backwards)."""

    def __init__(self, seed: int, n_flows: int, every: int):
        self.seed = seed
        self.streams = [randomness.NOISE_STREAM] + [randomness.NOISE_STREAM + 16 * k
                                                    for k in reversed(range(1, n_flows)) if k % every == 0]
        self.draws: list[torch.Tensor] = []

    def __call__(self, batch, channels, length):
        assert batch == 1, "one line at a time"
        noise = randomness.normal(torch.tensor([self.seed]), self.streams[len(self.draws)], channels, length)
        self.draws.append(noise)
        return types.SimpleNamespace(normal_=lambda: noise.clone())


def save_as_from_gpu(obj, path: Path, legacy: bool = False) -> None:
    """torch.save with each tensor recorded on "cuda:0", as in NVIDIA's
    published files, which were saved from a GPU."""
    with mock.patch.object(torch.serialization, "location_tag", lambda _storage: "cuda:0"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the non-zip format notes each module's missing source
        torch.save(obj, path, _use_new_zipfile_serialization=not legacy)


# --------------------------------------------------------------------------
# Tacotron2


def build_tacotron2(nv_model, hparams) -> torch.nn.Module:
    """NVIDIA's Tacotron2 with its own initialisation (seeded), BatchNorm
    statistics and affine parameters made non-trivial (a loader that dropped
    them would show), the decoder's LSTM weights scaled by DECODER_RNN_SCALE."""
    torch.manual_seed(37)
    model = nv_model.Tacotron2(hparams)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.normal_(0.0, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.7, 1.3)
            m.bias.data.normal_(0.0, 0.1)
            m.num_batches_tracked.fill_(1000)
    for name, parameter in model.decoder.named_parameters():
        if name.startswith(("attention_rnn.weight", "decoder_rnn.weight")):
            parameter.data.mul_(DECODER_RNN_SCALE)
    return model


def nvidia_decode(nv_model, model, ids: list[int], seed: int | None):
    """NVIDIA's Tacotron2.inference on one line: (postnet mel (n_mel, F), gate logits (F,), alignments (F, T))."""
    with mock.patch.object(nv_model, "F", SeededPrenetDropout(seed)), torch.no_grad():
        _, mel, gate, alignments = model.inference(torch.tensor([ids], dtype=torch.long))
    return mel[0], gate[0, :, 0], alignments[0]


def set_gate_for_stops(nv_model, model, sequences: list[list[int]]) -> None:
    """Gate weights and bias with which each case stops within STOP_RANGE,
    with its logit at least GATE_MARGIN from the threshold at every step up
    to the stop, so rounding cannot move a stop. The gate feeds nothing
    back: the mels are the same whatever it is, so its input at each step
    (decoder state and attention context) is recorded once, and gates are
    tried on it: GATE_TRIALS random weight vectors, each with the best bias
    between the one that stops no case early and the one that stops every
    case in time; the one with the largest margin is kept."""
    gate = model.decoder.gate_layer.linear_layer
    inputs: list[torch.Tensor] = []
    hook = model.decoder.gate_layer.register_forward_hook(lambda _m, given, _out: inputs.append(given[0][0]))
    gate.bias.data.fill_(-1e4)                # never stops: each case's every step
    features = []
    for text, seed in TACOTRON2_CASES:
        nvidia_decode(nv_model, model, sequences[text], seed)
        features.append(torch.stack(inputs))       # (steps, decoder_rnn_dim + embedding_dim)
        inputs.clear()
    hook.remove()
    early, late = STOP_RANGE

    def margin(traces: list[torch.Tensor], level: float) -> float:
        return min(float((t[: int(torch.nonzero(t > level)[0]) + 1] - level).abs().min()) for t in traces)

    generator = torch.Generator().manual_seed(37)
    best = (0.0, None, None)
    for _ in range(GATE_TRIALS):
        weight = torch.randn(features[0].shape[1], generator=generator) * 0.3
        traces = [f @ weight for f in features]
        low = max(float(t[:early].max()) for t in traces)     # at or above: none stops before `early`
        high = min(float(t[:late].max()) for t in traces)     # below: each stops before `late`
        for level in (low + (high - low) * i / 64 for i in range(64) if high > low):
            if margin(traces, level) > best[0]:
                best = (margin(traces, level), weight, level)
    if best[0] < GATE_MARGIN:
        sys.exit(f"no gate stops every case within {STOP_RANGE}; change the seeds in build_tacotron2")
    gate.weight.data.copy_(best[1][None, :])
    gate.bias.data.fill_(-best[2])


def make_tacotron2(tacotron2_root: Path, out: Path) -> tuple[dict, list]:
    sys.path.insert(0, str(tacotron2_root))
    nv_model = importlib.import_module("model")
    nv_text = importlib.import_module("text")
    hparams = types.SimpleNamespace(**HPARAMS)
    sequences = [nv_text.text_to_sequence(t, ["english_cleaners"]) for t in TEXTS]

    model = build_tacotron2(nv_model, hparams).eval()
    set_gate_for_stops(nv_model, model, sequences)
    # NVIDIA/tacotron2 train.py's checkpoint: iteration, state_dict, optimizer, learning_rate
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6)
    save_as_from_gpu({"iteration": 1000, "state_dict": model.state_dict(),
                      "optimizer": optimizer.state_dict(), "learning_rate": 1e-3},
                     out / "nvidia_tacotron2.pt")

    # as NVIDIA's inference notebook: a fresh model, the file's state_dict, eval
    torch.manual_seed(0)
    reference = nv_model.Tacotron2(hparams)
    reference.load_state_dict(torch.load(out / "nvidia_tacotron2.pt", map_location="cpu")["state_dict"])
    reference.eval()
    cases = []
    for text, seed in TACOTRON2_CASES:
        mel, gate, alignments = nvidia_decode(nv_model, reference, sequences[text], seed)
        stop = torch.sigmoid(gate) > hparams.gate_threshold
        assert bool(stop[-1]) and not bool(stop[:-1].any()), "stopped by the gate, at its first firing"
        peak, position = alignments.max(1)
        cases.append({"text": text, "seed": seed, "prenet_dropout": PRENET_P if seed is not None else 0.0,
                      "mel": mel.clone(), "frames": mel.shape[1], "attention_peak": peak.clone(),
                      "attention_position": position.clone(),
                      "prenet_mask_head": prenet_mask_head(seed) if seed is not None else None})
    sys.path.remove(str(tacotron2_root))
    settings = {"max_decoder_steps": hparams.max_decoder_steps, "gate_threshold": hparams.gate_threshold}
    return {"texts": TEXTS, "ids": sequences, "decode": settings, "cases": cases}, cases


# --------------------------------------------------------------------------
# WaveGlow


def build_waveglow(glow: types.ModuleType, seed: int) -> torch.nn.Module:
    """NVIDIA's WaveGlow with its own initialisation (seeded), except that
    each flow's ``end`` layer, which NVIDIA starts at zero, is random, and
    each weight-norm magnitude g differs from ||v|| (a loader that took v
    for the weight would show)."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch.nn.utils.weight_norm is deprecated
        model = glow.WaveGlow(**WAVEGLOW)
    for name, parameter in model.named_parameters():
        if ".end." in name:
            parameter.data.normal_(0.0, 0.05)
        elif name.endswith("weight_g"):
            parameter.data.mul_(torch.empty_like(parameter).uniform_(0.5, 1.5))
    return model


def nvidia_vocode(glow: types.ModuleType, path: Path, mel: torch.Tensor, seed: int) -> tuple[torch.Tensor, SeededNoise]:
    """As NVIDIA's inference.py: the file's ``model``, weight norm removed,
    eval, ``infer(mel, sigma)``; its noise tts_cli's for ``seed``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        waveglow = torch.load(path, map_location="cpu", weights_only=False)["model"]
        waveglow = glow.WaveGlow.remove_weightnorm(waveglow)
    waveglow.eval()
    noise = SeededNoise(seed, WAVEGLOW["n_flows"], WAVEGLOW["n_early_every"])
    with mock.patch.object(torch.cuda, "FloatTensor", noise), torch.no_grad():
        audio = waveglow.infer(mel[None], sigma=SIGMA)
    return audio[0], noise


def make_waveglow(roots: dict[str, Path], out: Path, mels: list) -> list:
    files = {"nvidia_waveglow.pt": (roots["current"], 3712, False),
             "nvidia_waveglow_2019.pt": (roots["2019"], 2019, True)}
    cases = []
    for name, (root, seed, legacy) in files.items():
        glow = import_glow(root)
        # NVIDIA/waveglow train.py's checkpoint: the pickled module, iteration, optimizer, learning_rate
        save_as_from_gpu({"model": build_waveglow(glow, seed), "iteration": 1000, "optimizer": None,
                          "learning_rate": 1e-4}, out / name, legacy=legacy)
        for file, mel_of, line_seed in WAVEGLOW_CASES:
            if file != name:
                continue
            audio, noise = nvidia_vocode(glow, out / name, mels[mel_of]["mel"], line_seed)
            cases.append({"file": name, "mel_of": mel_of, "seed": line_seed, "sigma": SIGMA,
                          "audio": audio.clone(), "noise_shape": list(noise.draws[0].shape[1:]),
                          "noise_head": noise.draws[0].flatten()[:NOISE_HEAD].clone()})
        del sys.modules["glow"]
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tacotron2", type=Path, required=True, help=f"NVIDIA/tacotron2 at {TACOTRON2_COMMIT}")
    parser.add_argument("--waveglow", type=Path, required=True, help=f"NVIDIA/waveglow at {WAVEGLOW_COMMIT}")
    parser.add_argument("--waveglow-2019", type=Path, required=True,
                        help=f"NVIDIA/waveglow at {WAVEGLOW_2019_COMMIT}")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    check_checkout(args.tacotron2, TACOTRON2_FILES, TACOTRON2_COMMIT)
    check_checkout(args.waveglow, WAVEGLOW_FILES, WAVEGLOW_COMMIT)
    check_checkout(args.waveglow_2019, WAVEGLOW_2019_FILES, WAVEGLOW_2019_COMMIT)
    if "glow" in sys.modules:
        sys.exit("a 'glow' module is already imported; run this script in a fresh interpreter")
    stand_in_modules()
    torch.set_num_threads(1)

    tacotron2, cases = make_tacotron2(args.tacotron2, args.out)
    waveglow = make_waveglow({"current": args.waveglow, "2019": args.waveglow_2019}, args.out, cases)
    goldens = {"commits": {"NVIDIA/tacotron2": TACOTRON2_COMMIT, "NVIDIA/waveglow": WAVEGLOW_COMMIT,
                           "NVIDIA/waveglow (2019)": WAVEGLOW_2019_COMMIT},
               "torch": str(torch.__version__), "tacotron2": tacotron2, "waveglow": waveglow}
    torch.save(goldens, args.out / "nvidia_goldens.pt")
    for case in cases:
        print(f"tacotron2 text {case['text']} seed {case['seed']}: {case['frames']} frames, "
              f"|mel| max {case['mel'].abs().max():.3f}")
    for case in waveglow:
        print(f"{case['file']} mel {case['mel_of']} seed {case['seed']}: {case['audio'].numel()} samples, "
              f"|audio| max {case['audio'].abs().max():.3f}")


if __name__ == "__main__":
    main()
