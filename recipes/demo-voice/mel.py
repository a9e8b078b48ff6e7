"""Mel spectrograms exactly as NVIDIA Tacotron2's ``TacotronSTFT`` makes them.

The demo voice's Tacotron2 must predict, and its WaveGlow must read, the same
features the published models use, so that either half can later be swapped
for a published one. The reference (NVIDIA/tacotron2 ``layers.py``,
``stft.py``, ``audio_processing.py``, ``hparams.py``) does:

* audio as int16 / 32768 (``max_wav_value``), so full scale is +-1;
* an STFT of 1024 points, hop 256, a periodic Hann window of 1024, the signal
  reflect-padded by 512 on both sides (so ``samples // 256 + 1`` frames);
* the magnitude (not power) spectrum;
* librosa's mel filterbank (Slaney mel scale, Slaney area normalisation),
  80 bands from 0 to 8000 Hz at 22050 Hz;
* ``log(clamp(mel, min=1e-5))``.

The filterbank is written out here rather than taken from librosa, which the
project does not otherwise need. Run as a script it caches every utterance's
mel of a data folder made by ``make_data.py`` (see README.md).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor


@dataclass(frozen=True)
class MelSettings:
    sampling_rate: int = 22050
    filter_length: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mel: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    max_wav_value: float = 32768.0
    log_floor: float = 1e-5


# Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz at
# 200/3 Hz per mel, logarithmic above with 27 mels per factor 6.4.
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(hz: Tensor) -> Tensor:
    hz = hz.double()
    log_part = _MIN_LOG_MEL + torch.log(hz.clamp(min=_MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return torch.where(hz >= _MIN_LOG_HZ, log_part, hz / _F_SP)


def mel_to_hz(mel: Tensor) -> Tensor:
    mel = mel.double()
    log_part = _MIN_LOG_HZ * torch.exp(_LOGSTEP * (mel - _MIN_LOG_MEL))
    return torch.where(mel >= _MIN_LOG_MEL, log_part, mel * _F_SP)


def band_edges(s: MelSettings = MelSettings()) -> Tensor:
    """The n_mel + 2 band edges in Hz (float64), equally spaced in mel from
    fmin to fmax: band i rises from edge i, peaks at i + 1, ends at i + 2."""
    return mel_to_hz(torch.linspace(float(hz_to_mel(torch.tensor(s.fmin))),
                                    float(hz_to_mel(torch.tensor(s.fmax))),
                                    s.n_mel + 2, dtype=torch.float64))


def mel_filterbank(s: MelSettings = MelSettings()) -> Tensor:
    """(n_mel, filter_length // 2 + 1) float32 triangles, Slaney-normalised.

    Band i rises from edge i to peak i+1 and falls to edge i+2, the n_mel + 2
    edges equally spaced in mel between fmin and fmax; each triangle is then
    scaled by 2 / (its width in Hz), so every band has the same area.
    """
    fft_hz = torch.linspace(0.0, s.sampling_rate / 2, s.filter_length // 2 + 1, dtype=torch.float64)
    edges = band_edges(s)
    widths = edges[1:] - edges[:-1]
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    bank = torch.minimum(rising, falling).clamp(min=0.0)
    bank *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return bank.float()


class MelExtractor(torch.nn.Module):
    """audio (B, N) or (N,) float in [-1, 1] -> log mel (B, n_mel, N // hop + 1)."""

    def __init__(self, s: MelSettings = MelSettings()):
        super().__init__()
        self.settings = s
        self.register_buffer("bank", mel_filterbank(s), persistent=False)
        # scipy's get_window('hann', fftbins=True) is the periodic window.
        self.register_buffer("window", torch.hann_window(s.win_length, periodic=True), persistent=False)

    def forward(self, audio: Tensor) -> Tensor:
        s = self.settings
        single = audio.dim() == 1
        audio = audio[None] if single else audio
        spec = torch.stft(audio.float(), s.filter_length, s.hop_length, s.win_length, self.window,
                          center=True, pad_mode="reflect", return_complex=True)
        mel = torch.matmul(self.bank, spec.abs())
        mel = torch.log(mel.clamp(min=s.log_floor))
        return mel[0] if single else mel


def read_wav(path: str | Path, s: MelSettings = MelSettings()) -> Tensor:
    """A mono PCM16 WAV as float32 in [-1, 1], as the reference scales it."""
    import soundfile
    data, rate = soundfile.read(str(path), dtype="int16", always_2d=False)
    if rate != s.sampling_rate:
        raise ValueError(f"{path}: {rate} Hz, expected {s.sampling_rate}")
    if data.ndim != 1:
        raise ValueError(f"{path}: {data.shape[1]} channels, expected mono")
    return torch.from_numpy(data.astype("float32")) / s.max_wav_value


def read_filelist(path: str | Path) -> list[tuple[str, str]]:
    """(id, text) rows of an ``id|text`` file."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            uid, text = line.split("|", 1)
            rows.append((uid, text.split("|")[0]))
    return rows


def cache_mels(data: Path, device: str, readers: int = 8) -> Path:
    """Write ``data/mels.pt``: {id: fp16 (n_mel, frames)} for every listed WAV.

    fp16 keeps the cache small (the log mel spans about -11.5..+3, where fp16
    rounds by at most 0.002, far below what Tacotron2 can model).
    """
    extract = MelExtractor().to(device)
    ids = [uid for name in ("train.psv", "heldout.psv") for uid, _ in read_filelist(data / name)]
    # WAVs are read ahead by a few threads (soundfile releases the GIL), 256
    # at a time (all 12,500 at once would hold 7 GB of audio), and the mels
    # stay on the device until all are made: one line at a time with a copy
    # back each took 61-74 s for 12,500 lines on an H200 machine.
    made = []
    with ThreadPoolExecutor(readers) as pool, torch.inference_mode():
        for start in range(0, len(ids), 256):
            read = pool.map(lambda uid: read_wav(data / "wavs" / f"{uid}.wav"), ids[start:start + 256])
            made += [extract(audio.to(device)).half() for audio in read]
    mels = {uid: mel.cpu() for uid, mel in zip(ids, made)}
    out = data / "mels.pt"
    tmp = out.with_suffix(".tmp")
    torch.save(mels, tmp)
    tmp.replace(out)  # never leave a half-written cache under the real name
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder made by make_data.py")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    start = time.time()
    out = cache_mels(args.data, args.device)
    print(f"wrote {out} in {time.time() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
