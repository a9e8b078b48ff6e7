"""The whole job: corpus -> normalized ids -> length-sorted batches -> engine
-> WAV (and mel) files -> manifest, one row per corpus line in corpus order.

The plan (what is left to do, from the earlier manifest and the resume keys)
is made and told in one line before torch is imported; torch comes with the
models (loading.py), and only when there is work."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from tts_cli import output_lock, resume
from tts_cli.config import BATCH_SIZES, SHORTEST_FIRST, Settings
from tts_cli.coordination import Alone, Share, Together, coordinator
from tts_cli.corpus import Utterance
from tts_cli.formats import SHARD_SIZE, Layout
from tts_cli.devices import device_type, open_cuda_early
from tts_cli.errors import FatalError, OutputError, cannot_write, option
from tts_cli.export import refresh_saying
from tts_cli.planning import PendingLine, WindowReader, batch_plan, collector_paused, plan_lines
from tts_cli.journal import ManifestJournal
from tts_cli.tarshards import ONE_PROCESS, clashing_keys
from tts_cli.upkeep import prepare_output, report_orphans, report_superseded
from tts_cli.writing import LineWriter
from tts_cli.manifest import plural
from tts_cli.signals import StopOnSignals
from tts_cli.voice import Voice, resolve_voice

if TYPE_CHECKING:   # torch: imported once there is work (loading.py) or under torchrun
    from tts_cli.distributed import Group
    from tts_cli.engine import Engine, Job, Result

class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the files in flight were finished and the manifest
    (under torchrun: this process's partial manifest) saved at ``saved``,
    which holds ``done`` finished lines out of ``total``. A KeyboardInterrupt,
    so that a caller's ``except Exception`` does not swallow a Ctrl-C."""

    def __init__(self, signum: int, summary: "RunSummary", saved: Path, done: int, total: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.summary = signum, summary
        self.saved, self.done, self.total = saved, done, total


@dataclass(frozen=True)
class RunSummary:
    """What a run did; each line's row is in the manifest (not held here:
    a corpus of a million lines has a million)."""
    lines: int                    # corpus lines, one manifest row each
    counts: dict[str, int]        # lines by status
    audio_seconds: float
    clipped_samples: int
    wall_seconds: float           # synthesis and writing, model loading excluded
    load_seconds: float
    seed: int
    notices: list[str]
    reused: int = 0               # lines whose WAV an earlier run made and this one kept
    seed_source: str = "given"    # given, random, or "from the existing manifest"
    reused_seconds: float = 0.0   # audio of the reused lines, not made by this run
    processes: int = 1            # torchrun processes that shared the work
    made: int = 0                 # lines this run set out to synthesize (the whole job's)
    retried: int = 0              # lines this run made more than one attempt at (alignment.py)
    failed: dict[int, str] = field(default_factory=dict)   # corpus line -> reason, of the lines that failed
    # corpus line -> what its audio leaves unsaid (characters the voice cannot
    # say, letters of another script), of the lines with audio
    unsaid: dict[int, str] = field(default_factory=dict)

    @property
    def made_seconds(self) -> float:
        """Audio seconds made by this run (reused lines' not counted)."""
        return max(self.audio_seconds - self.reused_seconds, 0.0)

    @property
    def speed(self) -> float:
        """Audio seconds made by this run per wall second."""
        return self.made_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


def synthesize_corpus(settings: Settings, utterances: list[Utterance], out_dir: Path, on_notice=print,
                      engine: Engine | None = None,
                      group: Group | None = None,
                      signals: StopOnSignals | None = None,
                      voice: Voice | None = None) -> RunSummary:
    """Synthesize every line of a corpus (``corpus.read_corpus``) into
    ``out_dir``, reusing the WAVs an earlier run left there when their resume
    key matches. Problems with single lines become manifest rows; problems
    with the whole run raise FatalError; SIGINT/SIGTERM raise Interrupted
    once the manifest is saved.

    Under torchrun (``group``, see distributed.py) every process plans the
    whole corpus alike, synthesizes its share of the lines left to do, keeps
    its rows in its own partial manifest, and rank 0 merges them into the
    manifest at the end; only rank 0's summary covers the whole job.

    The benchmark passes its own ``engine`` (random full-size weights, each
    line's decode length fixed by it); a ``Synthesizer`` passes the engine it
    loaded with its ``voice``, loaded too (``voice.Voice``).

    ``signals``: the caller's handlers, already installed (the command
    installs them before anything else); without them the run installs its
    own for its duration (signals.py says what each signal does).

    A run that saves the manifest, done or stopped, writes again from it the
    exports ``tts-batch export`` wrote in ``out_dir`` (export.refresh_saying);
    a later signal stops that, and the next run finishes it."""
    interrupt_when_done = signals is None   # a library caller's: its handlers are the run's own
    with contextlib.nullcontext(signals) if signals else StopOnSignals() as signals:
        with output_lock.held(out_dir, group):
            return _synthesize(settings, utterances, out_dir, on_notice, engine, coordinator(group), signals, voice,
                               interrupt_when_done)


def _synthesize(settings: Settings, utterances: list[Utterance], out_dir: Path, on_notice,
                engine: Engine | None,
                together: Alone | Together, signals: StopOnSignals, voice: Voice | None = None,
                interrupt_when_done: bool = False) -> RunSummary:
    """``synthesize_corpus`` once the corpus is read and the output directory
    is this run's."""
    if settings.layout == "webdataset" and together.processes > 1:
        raise FatalError(ONE_PROCESS)
    if settings.layout == "webdataset" and (clash := clashing_keys(utterances)):
        raise FatalError(clash)
    manifest_path = out_dir / resume.MANIFEST_NAME
    with collector_paused():
        previous = resume.EarlierRows() if settings.force else resume.previous_rows(out_dir)
    if not utterances and len(previous):   # an empty stdin from a fetch that failed, most likely
        previous.close()
        raise FatalError(f"the corpus has no lines, and {manifest_path} holds {plural(len(previous), 'row')} that a "
                         f"run over it would drop; give the corpus, or pass {option('force', True)} to empty the "
                         "manifest")
    seed, seed_source = resume.run_seed(settings, previous)
    seed = together.agree_on_seed(seed)
    if engine is not None and voice is None:   # the bench's: no files behind it
        from tts_cli.loading import engine_voice
        voice, voiced = engine_voice(engine, settings)
    elif engine is not None:
        from tts_cli.loading import with_voice
        voiced = with_voice(settings, voice)
    else:   # torch is not imported until there is work (loading.py)
        voice, voiced = voice or resolve_voice(settings), None
    identity = resume.audio_identity(settings, voice)
    in_order = not previous.partial and list(previous) == [u.id for u in utterances]
    manifest = ManifestJournal(manifest_path, utterances, seed=seed)
    with contextlib.closing(previous):
        plan = plan_lines(utterances, settings, seed, identity, previous, out_dir, keep=manifest.keep)
    to_do = len(plan.pending) + sum(len(window) for window in plan.unread)
    unused = ([f"{option('shard_size')}: no effect with {option('layout', 'webdataset')}, whose tar shards hold about "
               "1 GB each"]
              if settings.layout == "webdataset" and settings.shard_size != SHARD_SIZE else [])
    notices: list[str] = [*voice.notices, *unused, _plan_line(utterances, to_do, plan.reused, voice)]
    for notice in notices:
        on_notice(notice)
    # nothing to make and every row as the manifest holds it, in its order: no need to write it again
    manifest.on_disk = not to_do and in_order and plan.as_written == len(utterances) and not settings.force
    device = device_type(voice.device)
    batch_size = settings.batch_size or BATCH_SIZES[device]
    share, checkpoint = _my_share(plan.pending, manifest, batch_size, device, together)
    # the first window of lines to read is read while the models load
    with contextlib.closing(manifest), contextlib.closing(checkpoint), \
            contextlib.closing(WindowReader(plan.unread, settings, seed, identity)) as reader:
        stop = signals.stop
        started = time.perf_counter()
        # An unwritable directory fails before loading models.
        prepare_output(out_dir, settings, remove_temp_files=together.removes_temp_files)
        if (share.batches or plan.unread) and not stop.is_set():   # a signal during the checks: no need to load
            if engine is None:
                if device == "cuda":
                    open_cuda_early(voice.device)
                from tts_cli.loading import load_engine
                engine, voiced, voice = load_engine(settings, voice)
            notices.extend(engine.notices)
            for notice in engine.notices:
                on_notice(notice)
        # the voice's sample rate and denoiser strength, once its models are loaded
        settings = voiced or settings
        load_seconds = time.perf_counter() - started
        started = time.perf_counter()
        layout = Layout.for_corpus(settings.audio_format, settings.shard_size,
                                   max((u.line for u in utterances), default=0))
        writer = LineWriter(settings, layout, out_dir, seed, voice.sample_rate)
        # before any save: a journal saved by a process whose take-over failed
        # would replace, unmerged, the earlier job's partial of the same name
        together.take_over(manifest)
        failed = False
        try:
            if (share.batches or plan.unread) and not stop.is_set():
                windows = _windows(share, reader, batch_size, device, manifest, checkpoint, together)
                mine = len(share.lines) + (to_do - len(plan.pending)) // together.processes
                _run_batches(engine, windows, mine, settings, writer, checkpoint, signals)
        except BaseException:
            failed = True
            raise
        finally:
            try:
                checkpoint.record_all(writer.close())   # the last shard's rows, once it has its name
            except OSError as e:
                failed = True
                raise OutputError(cannot_write(out_dir, e)) from None
            finally:
                if not (failed and checkpoint.untouched):   # failed before its first file: the folder as it was
                    checkpoint.save(final=True)
        done = together.finish(manifest, checkpoint, share, writer, signals)
        if together.removes_temp_files and signals.received is None:   # one process looks: rank 0, or alone
            report_orphans(out_dir, manifest.named, settings.prune, on_notice)
            if writer.shards is not None and (to_do or len(previous) or settings.prune):   # lines made again, or gone
                report_superseded(out_dir, manifest.named, writer.shards.written, settings.prune, on_notice)
        summary = RunSummary(lines=len(utterances), counts=manifest.counts(), audio_seconds=manifest.audio_seconds(),
                             clipped_samples=sum(manifest.clipped),
                             wall_seconds=time.perf_counter() - started, load_seconds=load_seconds,
                             seed=seed, notices=notices, reused=plan.reused, seed_source=seed_source,
                             reused_seconds=plan.reused_seconds, processes=together.processes,
                             made=to_do - reader.without_audio, retried=manifest.retried.count(1),
                             failed=manifest.lines_of(manifest.failed), unsaid=manifest.lines_of(manifest.unsaid))
        progress = checkpoint.progress()
        if together.wrote_manifest(done):   # the exports, where not made from this manifest; a later signal stops it
            refresh_saying(out_dir, on_notice, stop=signals.abort)
    # A signal after the last line stopped nothing: the command says so and
    # exits with its status; a library caller's program stops as a Ctrl-C stops it.
    if signals.received is not None and (not done or interrupt_when_done):
        raise Interrupted(signals.received, summary, checkpoint.path, *progress)
    return summary


def _plan_line(utterances: list[Utterance], to_do: int, reused: int, voice: Voice) -> str:
    """The run's first line: what it will do, with which voice, where. In a
    corpus read a window at a time (planning.READ_WINDOW), a line of a later
    window counts as to do until its window is read."""
    without = len(utterances) - to_do - reused
    others = f", {without:,} without audio (skipped or unreadable)" if without else ""
    return (f"{plural(len(utterances), 'line')}: {to_do:,} to do, {reused:,} reused from an "
            f"earlier run{others}; {voice.label} on {voice.device}, {voice.precision}")


def _windows(first: Share, reader: WindowReader, batch_size: int, device: str, manifest: ManifestJournal,
             checkpoint: ManifestJournal, together: Alone | Together):
    """This process's share of the lines read with the plan (``first``),
    then of each window ``reader`` reads. Of a window's lines, ``first``
    keeps those whose pieces more than one process makes (``Together.finish``
    writes them)."""
    yield first
    for rows, pending in reader:
        manifest.record_all(rows.values())
        share, _ = _my_share(pending, manifest, batch_size, device, together, checkpoint)
        first.lines.extend(p for p in share.lines if p in share.shared)
        first.shared |= share.shared
        del pending
        yield share


def _my_share(pending: list[PendingLine], manifest: ManifestJournal, batch_size: int, device: str,
              coordinator: Alone | Together, journal: ManifestJournal | None = None) -> tuple[Share, ManifestJournal]:
    """This process's share of the plan (or of a later window of it:
    ``journal``, the one the first share gave) and where it saves its rows
    (coordination.py)."""
    return coordinator.share(batch_plan(pending, batch_size, shortest_first=SHORTEST_FIRST[device]), pending,
                             manifest, journal)


def _run_batches(engine: Engine, shares: Iterable[Share], lines: int, settings: Settings, writer: "LineWriter",
                 checkpoint: ManifestJournal, signals: StopOnSignals) -> None:
    """The GPU runs batches of pieces on its own threads, a window of the
    plan at a time (``shares``, about ``lines`` lines in all); a line's WAV
    is written by a small pool once all its pieces are back (a shared
    line's pieces go to files instead); the manifest is saved as rows come
    in. A write that fails (no space, permissions, an I/O error) ends the
    run: the work in flight is dropped, the rows of the lines written are
    saved."""
    failure: OSError | None = None
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="tts-write") as pool, \
            _Progress(lines, settings.quiet) as progress:
        for share in shares:
            if signals.stop.is_set():
                break
            if share.batches:
                failure = _run_window(engine, share, writer, checkpoint, signals, pool, progress)
            if failure is not None:
                break
    if failure is not None:
        checkpoint.save(final=True)
        raise OutputError(cannot_write(writer.out_dir, failure))


def _run_window(engine: Engine, share: Share, writer: "LineWriter", checkpoint: ManifestJournal,
                signals: StopOnSignals, pool: ThreadPoolExecutor, progress: "_Progress") -> OSError | None:
    """``_run_batches`` for one window; the first write that failed, if one did."""
    checkpoint.expect((p.utterance, p.normalized, p.dropped) for p in share.lines)
    job_batches, work = jobs_of(share.batches)
    failure: OSError | None = None
    results = engine.synthesize_all(job_batches, stop=signals.stop, abort=signals.abort)
    # closing: whatever ends this loop, the engine's threads are joined here
    with contextlib.closing(results):
        for jobs, made in results:
            done, handed = collect(jobs, made, work, share.shared)
            del made
            writes = ([(p, pool.submit(writer.write, p)) for p in done]
                      + [(None, pool.submit(writer.write_piece, p, i)) for p, i in handed])
            rows = []
            for p, future in writes:
                try:
                    row = future.result()
                    if p is not None:
                        rows.append(row)
                except OSError as e:
                    failure = failure or e
            checkpoint.record_all(writer.whole(rows))
            # Written (or failed): let go of the audio. On CUDA each batch's
            # audio is one pinned host block; kept to the end of the run,
            # 2,000 lines held 33 of them and none could be reused.
            for p in done:
                p.results.clear()
            for p, i in handed:
                p.results[i] = None
            progress.update(len(done), sum(row.duration for row in rows))
            if failure is not None:
                break
            checkpoint.save()
    return failure


def jobs_of(batches: list[list[tuple[PendingLine, int]]]) -> tuple[list[list[Job]], list[tuple[PendingLine, int]]]:
    """The engine's jobs for the plan's batches of (line, piece), and the
    (line, piece) each job's ``index`` stands for."""
    from tts_cli.engine import Job   # loaded with the models
    work = [item for batch in batches for item in batch]
    job_batches, n = [], 0
    for batch in batches:
        job_batches.append([Job(p.pieces[i], p.seeds[i], index=n + k, retry_seeds=tuple(p.retry_seeds[i]))
                            for k, (p, i) in enumerate(batch)])
        n += len(batch)
    return job_batches, work


def collect(jobs: list[Job], results: list[Result] | Exception, work: list[tuple[PendingLine, int]],
             shared: set[PendingLine]) -> tuple[list[PendingLine], list[tuple[PendingLine, int]]]:
    """Hand each piece's result to its line: the lines now complete, and
    the pieces of shared lines (to hand on through files)."""
    done, handed = [], []
    for n, job in enumerate(jobs):
        p, i = work[job.index]
        p.results[i] = results if isinstance(results, Exception) else results[n]
        if p in shared:
            handed.append((p, i))
        elif p.complete and p not in done:
            done.append(p)
    return done, handed


# The terminal's size where it reports none (0 x 0: a pty nobody sized).
# tqdm would take 0 for the size and draw no bar at all.
FALLBACK_SIZE = os.terminal_size((80, 24))


def bar_size(stream) -> tuple[int | None, int | None]:
    """(columns, rows) for a bar on ``stream``: its terminal's, each of
    them FALLBACK_SIZE's where the terminal reports 0, less one (the last
    column and row stay free, as tqdm leaves them); (None, None), tqdm's
    own layout, when ``stream`` is not a terminal."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None, None
    return ((size.columns or FALLBACK_SIZE.columns) - 1, (size.lines or FALLBACK_SIZE.lines) - 1)


class _Progress:
    """The progress bar on stderr: lines, audio seconds, speed. Its size
    follows the terminal's at every update (bar_size)."""

    def __init__(self, total: int, quiet: bool):
        columns, rows = bar_size(sys.stderr)
        self.bar = tqdm(total=total, unit="line", disable=quiet, file=sys.stderr, ncols=columns, nrows=rows)
        self.started, self.audio_seconds = time.perf_counter(), 0.0

    def update(self, lines: int, audio_seconds: float) -> None:
        self.audio_seconds += audio_seconds
        self.bar.ncols, self.bar.nrows = bar_size(sys.stderr)
        self.bar.update(lines)
        elapsed = time.perf_counter() - self.started
        self.bar.set_postfix(audio=f"{self.audio_seconds:.0f}s",
                             speed=f"{self.audio_seconds / max(elapsed, 1e-9):.1f}x")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()
        return False
