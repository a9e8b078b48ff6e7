"""The way in for Python: a voice loaded once, text in, audio out.

    from tts_cli import Synthesizer

    s = Synthesizer.load(device="cpu")                   # the CLI's defaults and voice choice
    audio = s.synthesize(["Hello there.", "A second line."], seed=1)   # float32 arrays
    summary = s.synthesize_to_dir("corpus.txt", "out/")  # what `tts-batch corpus.txt -o out/` does

``synthesize`` runs the CLI's path in memory: the same normalization, long
lines cut into pieces, length-sorted batches, alignment checks and retries;
with the same seed a text's audio is the one `tts-batch` writes for it as the
same line of a plain corpus. ``synthesize_to_dir`` is the CLI's job itself,
resume and manifest included; the command is a thin layer over it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tts_cli.config import (BATCH_SIZES, DEFAULT_RECIPE, MODEL_SETTINGS, SHORTEST_FIRST, Settings, check_names,
                            load_settings)
from tts_cli.corpus import Utterance, format_hint, read_corpus, utterances_from_texts
from tts_cli.errors import FatalError, OutputNotice, option, speaking_to
from tts_cli.resume import run_seed as run_seed_of
from tts_cli.voice import Voice, resolve_voice


def _to_python(method):
    """``method``'s messages speak to a Python caller (``force=True``, not
    ``--force``), unless the command called it."""
    @functools.wraps(method)
    def speaking_python(*args, **kwargs):
        with speaking_to("python"):
            return method(*args, **kwargs)
    return speaking_python


class Synthesizer:
    """Tacotron2 + WaveGlow on a device, with the settings they were loaded
    with. ``load`` makes one; ``settings`` may be given unloaded (the
    command's way: the models load only once a run has work)."""

    def __init__(self, settings: Settings):
        self.settings = settings          # as set: None where the voice decides (the resume keys hold these)
        self._voice: Voice | None = None   # resolved, then loaded
        self._engine = None
        self._voiced: Settings | None = None   # with the voice's sample rate and denoiser strength
        self.last_seed: int | None = None   # the run seed of the last ``synthesize``, given or drawn

    def __repr__(self) -> str:
        voice = self._voice
        if voice is None or self._engine is None:
            return f"Synthesizer(not loaded, device={self.settings.device!r})"
        return (f"Synthesizer({voice.label}, {voice.name or 'unnamed voice'}, {voice.device}, {voice.precision}, "
                f"{self.sample_rate} Hz)")

    @classmethod
    @_to_python
    def load(cls, tacotron2: str | os.PathLike | None = None, waveglow: str | os.PathLike | None = None,
             device: str | None = None, precision: str | None = None, recipe: str = DEFAULT_RECIPE,
             **options) -> "Synthesizer":
        """The voice's models, loaded now: the two files given, else the
        CLI's choice (NVIDIA's in ./checkpoints, else the demo voice), on
        ``device`` (default: CUDA where there is a GPU) in ``precision``;
        ``options`` are the command's, by their setting names
        (``sigma=0.5``, ``max_decoder_steps=800``, ``check_alignment=False``).
        A bad option raises ``config.ConfigError``, a missing or damaged
        file ``errors.FatalError``, each one line naming what is wrong."""
        paths = {kind: os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else path
                 for kind, path in (("tacotron2", tacotron2), ("waveglow", waveglow))}   # else: the settings refuse it
        settings = load_settings(recipe, {**paths, "device": device, "precision": precision, **options})
        check_files(settings)
        synthesizer = cls(settings)
        for notice in (*synthesizer.resolved_voice.notices, *synthesizer.engine.notices):   # loads
            if isinstance(notice, OutputNotice):   # what the command says even under --quiet
                warnings.warn(notice, stacklevel=3)   # the caller, past _to_python
        return synthesizer

    @classmethod
    def around(cls, engine, settings: Settings) -> "Synthesizer":
        """A synthesizer over an engine the caller built (the bench's random
        full-size models): no files behind it, the reference's sample rate."""
        from tts_cli.loading import engine_voice
        synthesizer = cls(settings)
        synthesizer._voice, synthesizer._voiced = engine_voice(engine, settings)
        synthesizer._engine = engine
        return synthesizer

    @property
    def engine(self):
        """The models on their device (``engine.Engine``), loaded on first use."""
        if self._engine is None:
            from tts_cli.loading import load_engine
            self._engine, self._voiced, self._voice = load_engine(self.settings, self.resolved_voice)
        return self._engine

    @property
    def resolved_voice(self) -> Voice:
        """The voice's files, their fingerprint and the device and precision
        (what the resume keys hold), resolved once; loaded once the models are."""
        if self._voice is None:
            self._voice = resolve_voice(self.settings)
        return self._voice

    @property
    def voice(self) -> Voice:
        """The voice, loaded: its files, name, sample rate and denoiser strength."""
        self.engine
        return self._voice

    @property
    def sample_rate(self) -> int:
        """The rate of the audio it returns and writes: ``sample_rate`` as
        loaded, else the voice's (``voice.sample_rate``, what its WaveGlow makes)."""
        self.engine
        return self._voiced.sample_rate

    @_to_python
    def synthesize(self, texts: Iterable[str], seed: int | None = None) -> list[np.ndarray]:
        """One float32 array per text (mono, ``sample_rate``), in the order
        given; ``seed`` None: the one given to ``load``, else a new draw
        (``last_seed`` holds the one used, to make the same audio again).
        A text with nothing to say gives an empty array; one the text
        front end cannot read (a number too large to speak) raises
        ValueError naming it before anything is synthesized. A text whose
        audio is suspect or truncated comes back with a warning saying why,
        as the manifest would; one that fails raises ``engine.SynthesisError``."""
        from tts_cli.pipeline import collect, jobs_of
        from tts_cli.writing import failure_reason, joined_audio, verdict
        from tts_cli.planning import batch_plan, prepare_line

        utterances = utterances_from_texts(_texts(texts))
        seeded = self.settings if seed is None else dataclasses.replace(self.settings, seed=seed)
        run_seed, _ = run_seed_of(seeded, {})   # the command's draw
        self.last_seed = run_seed
        rows = {}
        pending = [prepare_line(u, run_seed, rows, self.settings) for u in utterances]
        for u in utterances:
            if u.line in rows and rows[u.line].status == "error":
                raise ValueError(f"text {u.line - 1} ({u.text[:40]!r}): {rows[u.line].reason}")
        engine, s = self.engine, self._voiced
        device = engine.device.type
        batches = batch_plan([p for p in pending if p is not None], s.batch_size or BATCH_SIZES[device],
                             shortest_first=SHORTEST_FIRST[device])
        job_batches, work = jobs_of(batches)
        with contextlib.closing(engine.synthesize_all(job_batches)) as results:
            for jobs, made in results:
                collect(jobs, made, work, set())
        audio = []
        for n, p in enumerate(pending):
            if p is None:
                audio.append(np.zeros(0, np.float32))
                continue
            failed = [r for r in p.results if isinstance(r, Exception)]
            if failed:
                from tts_cli.engine import SynthesisError
                raise SynthesisError(f"text {n}: {failure_reason(failed[0])}") from failed[0]
            status, reason = verdict(p.results, s.max_decoder_steps, p.caution)
            if reason is not None:
                warnings.warn(f"text {n} is {status}: {reason}", stacklevel=3)   # the caller, past _to_python
            audio.append(joined_audio([r.audio for r in p.results], s, self._voice.sample_rate))
        return audio

    @_to_python
    def synthesize_to_dir(self, corpus_or_texts: str | os.PathLike | Iterable[str], out_dir: str | os.PathLike,
                          on_notice=None, *, signals=None, group=None, **options):
        """The command's job: every line of a corpus file (or every text
        given, as the lines of a plain corpus; or ``corpus.Utterance``s
        already read) into ``out_dir/wavs/<id>.wav`` and
        ``out_dir/manifest.jsonl``, reusing what an earlier run with the same
        settings made there. ``options`` are the run's own (``format``,
        ``seed``, ``batch_size``, ``sample_format``, ``max_symbols_per_piece``,
        ``piece_pause``, ``retries``, ``strict``, ``force``, ``quiet``); those
        that change what the models make (``sigma``, ``max_decoder_steps``,
        the alignment thresholds, ``save_mels``, ...: ``config.MODEL_SETTINGS``)
        are fixed by ``load``; one given as None is not given (the one
        ``load`` had stands). Returns the run's ``pipeline.RunSummary``;
        notices go to ``on_notice`` (default: none), and a progress bar to
        stderr unless ``quiet=True``. A SIGINT or SIGTERM during the run
        finishes the files in flight, saves the manifest and raises
        ``pipeline.Interrupted`` (a KeyboardInterrupt); the same call again
        makes the rest. ``signals`` and ``group`` are the command's: its
        signal handlers and its torchrun group (``pipeline.synthesize_corpus``)."""
        from tts_cli.pipeline import synthesize_corpus

        check_names(options)
        options = {name: value for name, value in options.items() if value is not None}
        fixed = sorted(name for name in set(options) & MODEL_SETTINGS if options[name] != getattr(self.settings, name))
        if fixed and self._engine is not None:
            raise ValueError(f"{', '.join(fixed)}: fixed when the models load; pass to Synthesizer.load")
        settings = dataclasses.replace(self.settings, **options)
        check_output(out_dir)
        on_notice = on_notice or (lambda line: None)
        if isinstance(corpus_or_texts, (str, bytes, os.PathLike)):
            path = os.fsdecode(corpus_or_texts)
            utterances = read_corpus(path, settings.format)
            hint = format_hint(path, utterances, settings.format)
            if hint is not None:   # the ids would be spoken
                on_notice(OutputNotice(hint))
        else:
            given = list(corpus_or_texts)
            utterances = (given if given and all(isinstance(u, Utterance) for u in given)
                          else utterances_from_texts(_texts(given)))
        return synthesize_corpus(settings, utterances, Path(out_dir), on_notice=on_notice,
                                 engine=self._engine, group=group, signals=signals, voice=self._voice)


def _texts(texts: Iterable[str]) -> list[str]:
    """``texts`` as a list, or a TypeError for one string (which would be
    spoken a character at a time) or an item that is no string."""
    if isinstance(texts, str):
        raise TypeError("texts: give a list of strings (one string would be read as one text per character)")
    texts = list(texts)
    for n, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {n}: a string, not {type(text).__name__}")
    return texts


def check_output(out_dir: str | os.PathLike) -> None:
    """One line for an output directory that is a file, before anything runs."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise FatalError(f"{option('out_dir')} {out_dir}: is a file; give a directory for the WAVs and the manifest")


def check_files(settings: Settings) -> None:
    """One line for a checkpoint path that is not a file, before anything loads."""
    for kind in ("tacotron2", "waveglow"):
        path = getattr(settings, kind)
        if path is not None and not Path(path).is_file():
            problem = "is a directory; give the checkpoint file" if Path(path).is_dir() else "no such file"
            raise FatalError(f"{kind} checkpoint {path}: {problem}")
