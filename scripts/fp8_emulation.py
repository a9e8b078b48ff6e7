"""FP8 (e4m3) WaveGlow products emulated on CPU on a trained WaveGlow: SNR against fp32.

    python scripts/fp8_emulation.py snapshot 6   # the recipe's trained WaveGlow, 6 lines
    python scripts/fp8_emulation.py demo 16      # the shipped (constructed) one

Weights: per output column scales; activations: per row (token) or per tensor
scales, cast to float8_e4m3fn and back, products accumulated in fp32. The gate
and the affine step stay fp32. Compared with eager fp16/bf16 against fp32."""
import copy, sys, torch
sys.path.insert(0, "tests")
from tts_cli.config import Settings
from tts_cli.loading import load_models
from tts_cli.voice import demo_voice
from tts_cli.quality import voice_mels, snr_db, waveglow_fidelity
from tts_cli import waveglow_fast as wf

LINES = [l.split("|", 1)[1] for l in open("recipes/demo-voice/data/ljspeech_12500.psv").read().splitlines()[100:116]]
WHICH = sys.argv[1] if len(sys.argv) > 1 else "demo"
COUNT = int(sys.argv[2]) if len(sys.argv) > 2 else 16
LINES = LINES[:COUNT]
E4M3 = torch.float8_e4m3fn
MAX = 448.0

def q_cols(w):      # (K, N): a scale per output column
    s = w.abs().amax(0, keepdim=True).clamp_min(1e-12) / MAX
    return (w / s).to(E4M3).float() * s

def q_rows(x, per_row=True):
    s = (x.abs().amax(-1, keepdim=True) if per_row else x.abs().amax()).clamp_min(1e-12) / MAX
    return (x / s).to(E4M3).float() * s

def run(mode):
    per_row = mode != "tensor"
    which = set(mode.split("+")[1:]) if "+" in mode else {"taps", "res", "skip", "cond", "start"}
    orig_linear, orig_addmm = wf._linear, torch.addmm
    class FP8(wf.FastWaveGlow):
        def coupling(self, w, a0, windows, keep):
            def lin(x, W, b, name):
                if name in which:
                    return wf._linear(q_rows(x, per_row), q_cols(W), b)
                return wf._linear(x, W, b)
            x = lin(a0.float(), w.start, w.start_bias, "start")
            b, t, c = x.shape
            acts = x.new_empty(b, t, len(w.taps) * c)
            for i, taps in enumerate(w.taps):
                xs = wf.shifted_taps(x * keep, 2 ** i)
                cond = w.cond[i].view(windows.shape[1], -1)
                if "cond" in which:
                    z = (q_rows(windows, per_row) @ q_cols(cond)).view(-1, 2 * c)
                else:
                    z = (windows @ cond).view(-1, 2 * c)
                X, T = (q_rows(xs.view(-1, 3 * c), per_row), q_cols(taps)) if "taps" in which else (xs.view(-1, 3 * c), taps)
                z = torch.addmm(z.add_(w.cond_bias[i]), X, T)
                acts[..., c * i: c * (i + 1)] = wf._gate(z).view(b, t, c)
                if i < len(w.res):
                    x = x + lin(acts[..., c * i: c * (i + 1)], w.res[i], w.res_bias[i], "res")
            return lin(acts, w.skip_end, w.skip_end_bias, "skip")
    return FP8

@torch.inference_mode()
def main():
    voice = demo_voice()
    tacotron2, waveglow = load_models(Settings(device="cpu"), voice)
    if WHICH == "snapshot":
        from tts_cli.checkpoints import load_waveglow
        from tts_cli.loading import _build
        from tts_cli.waveglow import WaveGlow
        waveglow = _build(WaveGlow, load_waveglow("recipes/demo-voice/snapshot/demo_waveglow.pt")[0], "snapshot")
    mel, frames, seeds = voice_mels(tacotron2, LINES, torch.device("cpu"))
    print("lines", len(LINES), "frames", frames.tolist())
    fid16 = waveglow_fidelity(waveglow, mel, frames, seeds, torch.float16)
    fidbf = waveglow_fidelity(waveglow, mel, frames, seeds, torch.bfloat16)
    print(f"fp16: fast {fid16.fast:.1f} eager {fid16.eager:.1f}; bf16: fast {fidbf.fast:.1f} eager {fidbf.eager:.1f}")
    ref_model = copy.deepcopy(waveglow).float().eval()
    inv = ref_model.inverse_weights()
    ref = ref_model.infer(mel.float(), frames, seeds, 0.666, inv)
    samples = frames * ref_model.dims.hop_length
    base = wf.FastWaveGlow(ref_model, torch.float32).infer(mel.float(), frames, seeds, 0.666)
    print(f"fast fp32 vs eager fp32: {snr_db(base, ref, samples):.1f} dB")
    modes = ["row", "tensor", "row+taps", "row+res", "row+skip", "row+cond", "row+start", "row+taps+res"]
    for mode in modes if WHICH == "demo" else ["row", "tensor", "row+taps", "row+taps+res", "row+cond", "row+skip"]:
        cls = run(mode)
        out = cls(ref_model, torch.float32).infer(mel.float(), frames, seeds, 0.666)
        print(f"fp8 {mode:>18}: {snr_db(out, ref, samples):.1f} dB against fp32", flush=True)
        torch.save(out, f"/tmp/sc/fp8_{WHICH}_{mode}.pt")
    torch.save((ref, samples), f"/tmp/sc/fp8_{WHICH}_ref.pt")

main()
