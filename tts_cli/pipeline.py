"""The whole job: corpus -> normalized ids -> length-sorted batches -> engine
-> WAV (and mel) files -> manifest, one row per corpus line in corpus order."""
from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tts_cli import text as frontend
from tts_cli.audio import write_mel, write_wav
from tts_cli.batching import length_sorted_batches
from tts_cli.checkpoints import CheckpointError, load_tacotron2_weights, load_waveglow_weights
from tts_cli.config import Settings
from tts_cli.corpus import NOTHING_TO_SAY, CorpusError, Utterance, read_corpus
from tts_cli.engine import Engine, Job, Result, SynthesisSettings, resolve_device, resolve_precision
from tts_cli.manifest import ManifestRow, summarize, write_manifest
from tts_cli.randomness import line_seed
from tts_cli.tacotron2 import DecodeSettings, Tacotron2
from tts_cli.waveglow import WaveGlow

PUBLISHED_FILES = {
    "tacotron2": "tacotron2_statedict.pt",
    "waveglow": "waveglow_256channels_universal_v5.pt",
}
WHERE_TO_GET = {
    "tacotron2": "the 'Inference demo' link of github.com/NVIDIA/tacotron2, or NGC's tacotron2 model",
    "waveglow": "the published-model link of github.com/NVIDIA/waveglow, or NGC's waveglow model",
}
MANIFEST_NAME = "manifest.jsonl"


class FatalError(Exception):
    """Stops the run before any synthesis; the message is one line."""


@dataclass(frozen=True)
class RunSummary:
    rows: list[ManifestRow]
    counts: dict[str, int]        # lines by status
    audio_seconds: float
    clipped_samples: int
    wall_seconds: float           # synthesis and writing, model loading excluded
    load_seconds: float
    seed: int
    notices: list[str]

    @property
    def speed(self) -> float:
        """Audio seconds per wall second."""
        return self.audio_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


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
    raise FatalError(f"no --{kind} given and no {name} in {checkpoint_dirs()[0]}: "
                     f"download it from {WHERE_TO_GET[kind]} into checkpoints/, "
                     f"or pass --{kind} PATH")


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
                         f"({_first_line(e)})") from None


def make_engine(settings: Settings, notices: list[str]) -> Engine:
    try:
        device = resolve_device(settings.device)
    except (ValueError, RuntimeError) as e:
        raise FatalError(str(e)) from None
    dtype, notice = resolve_precision(device, settings.precision)
    if notice:
        notices.append(notice)
    tacotron2, waveglow = load_models(settings)
    decode = DecodeSettings(max_decoder_steps=settings.max_decoder_steps,
                            gate_threshold=settings.gate_threshold,
                            prenet_dropout=settings.prenet_dropout)
    synthesis = SynthesisSettings(sigma=settings.sigma,
                                  denoiser_strength=settings.denoiser_strength, decode=decode)
    return Engine(tacotron2, waveglow, device, dtype, synthesis)


@dataclass
class _Pending:
    utterance: Utterance
    ids: list[int]
    normalized: str
    seed: int


def synthesize_corpus(settings: Settings, corpus: Path, out_dir: Path, on_notice=print,
                      engine: Engine | None = None,
                      frames_per_symbol: float | None = None) -> RunSummary:
    """Synthesize every line of ``corpus`` into ``out_dir``. Problems with single
    lines become manifest rows; problems with the whole run raise FatalError.

    The benchmark passes its own ``engine`` (random full-size weights) and
    ``frames_per_symbol``, which fixes each line's decode length instead of the
    stop gate's verdict (random weights never stop on their own)."""
    try:
        utterances = read_corpus(corpus, settings.format)
    except CorpusError as e:
        raise FatalError(str(e)) from None
    manifest_path = out_dir / MANIFEST_NAME
    if manifest_path.exists() and not settings.force:
        raise FatalError(f"{out_dir} already holds {MANIFEST_NAME}; pass --force to overwrite "
                         f"it, or choose another output directory")
    seed = settings.seed if settings.seed is not None else secrets.randbelow(2 ** 31)
    notices: list[str] = []
    started = time.perf_counter()
    engine = engine or make_engine(settings, notices)
    for notice in notices:
        on_notice(notice)
    load_seconds = time.perf_counter() - started
    rows: dict[int, ManifestRow] = {}
    pending = [p for p in (_prepare(u, seed, rows) for u in utterances) if p is not None]
    started = time.perf_counter()
    writer = _Writer(settings, out_dir, engine.hop_length, seed)
    try:
        _run_batches(engine, pending, settings, writer, rows, frames_per_symbol)
    finally:
        for p in pending:
            if p.utterance.line not in rows:
                rows[p.utterance.line] = _row(p.utterance, p.normalized, "error",
                                              "not synthesized: the run stopped first", seed)
        ordered = [rows[u.line] for u in utterances]
        out_dir.mkdir(parents=True, exist_ok=True)
        write_manifest(manifest_path, ordered)
    wall = time.perf_counter() - started
    totals = summarize(ordered)
    return RunSummary(rows=ordered, counts=totals["counts"], audio_seconds=totals["audio_seconds"],
                      clipped_samples=totals["clipped_samples"], wall_seconds=wall,
                      load_seconds=load_seconds, seed=seed, notices=notices)


def _prepare(u: Utterance, run_seed: int, rows: dict[int, ManifestRow]) -> _Pending | None:
    """Normalizes one line; lines that cannot be synthesized get their row now."""
    if u.problem is not None:
        status = "skipped" if u.problem in NOTHING_TO_SAY else "error"
        rows[u.line] = _row(u, "", status, u.problem, None)
        return None
    try:
        ids, normalized = frontend.normalize(u.text)
    except frontend.UnsupportedTextError as e:
        rows[u.line] = _row(u, "", "error", str(e), None)
        return None
    if not frontend.is_speakable(ids):
        rows[u.line] = _row(u, normalized, "skipped", "nothing speakable after cleaning", None)
        return None
    return _Pending(u, ids, normalized, line_seed(run_seed, u.id))


def _row(u: Utterance, normalized: str, status: str, reason: str | None,
         seed: int | None) -> ManifestRow:
    return ManifestRow(id=u.id, line=u.line, text=u.text, normalized_text=normalized,
                       audio_filepath=None, duration=0.0, num_samples=0, mel_frames=0,
                       status=status, reason=reason, seed=seed)


def _run_batches(engine: Engine, pending: list[_Pending], settings: Settings, writer: "_Writer",
                 rows: dict[int, ManifestRow], frames_per_symbol: float | None) -> None:
    """The GPU runs batches on its own thread; WAVs are encoded and written by
    a small pool meanwhile; rows are filled in as files land."""
    batches = [[pending[i] for i in batch]
               for batch in length_sorted_batches([len(p.ids) for p in pending], settings.batch_size)]
    jobs = ([_job(p, frames_per_symbol, settings) for p in items] for items in batches)
    started = time.perf_counter()
    audio_seconds = 0.0
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="tts-write") as pool, \
            tqdm(total=len(pending), unit="line", disable=settings.quiet, dynamic_ncols=True) as bar:
        for items, results in zip(batches, engine.synthesize_all(jobs)):
            if isinstance(results, Exception):
                reason = f"synthesis failed: {_first_line(results)}"
                for p in items:
                    rows[p.utterance.line] = _row(p.utterance, p.normalized, "error", reason,
                                                  writer.run_seed)
                bar.update(len(items))
                continue
            for p, row in zip(items, pool.map(writer.write, items, results)):
                rows[p.utterance.line] = row
                audio_seconds += row.duration
            bar.update(len(items))
            elapsed = time.perf_counter() - started
            bar.set_postfix(audio=f"{audio_seconds:.0f}s", speed=f"{audio_seconds / elapsed:.1f}x")


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _job(p: _Pending, frames_per_symbol: float | None, settings: Settings) -> Job:
    if frames_per_symbol is None:
        return Job(p.ids, p.seed)
    frames = min(round(frames_per_symbol * len(p.ids)), settings.max_decoder_steps)
    return Job(p.ids, p.seed, frames=max(frames, 1))


class _Writer:
    """Writes one line's files and makes its manifest row."""

    def __init__(self, settings: Settings, out_dir: Path, hop_length: int, run_seed: int):
        self.settings, self.out_dir, self.hop_length, self.run_seed = settings, out_dir, hop_length, run_seed
        (out_dir / "wavs").mkdir(parents=True, exist_ok=True)
        if settings.save_mels:
            (out_dir / "mels").mkdir(parents=True, exist_ok=True)

    def write(self, p: _Pending, result: Result) -> ManifestRow:
        u = p.utterance
        if not np.isfinite(result.audio).all():
            return _row(u, p.normalized, "error", "the model produced non-finite audio", self.run_seed)
        wav = f"wavs/{u.id}.wav"
        clipped = write_wav(self.out_dir / wav, result.audio, self.settings.sample_rate,
                            self.settings.sample_format)
        mel = None
        if self.settings.save_mels:
            mel = f"mels/{u.id}.npy"
            write_mel(self.out_dir / mel, result.mel)
        status, reason = ("truncated", f"reached max_decoder_steps ({self.settings.max_decoder_steps}) "
                          "without the stop gate firing") if result.truncated else ("ok", None)
        samples = int(result.audio.shape[0])
        return ManifestRow(id=u.id, line=u.line, text=u.text, normalized_text=p.normalized,
                           audio_filepath=wav, duration=samples / self.settings.sample_rate,
                           num_samples=samples, mel_frames=result.frames, status=status,
                           reason=reason, clipped_samples=clipped, seed=self.run_seed,
                           mel_filepath=mel)
