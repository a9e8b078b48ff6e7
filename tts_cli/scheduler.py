"""The scheduler: many batches through the decoder and WaveGlow on two
threads, so the GPU keeps working while the caller writes files.

On CUDA each thread has a stream of its own, so the decoder's work (graphs,
small kernels) fills the gaps in WaveGlow's (large products). The threads
and the caller pass typed messages over queues: the decoder puts
``_Decoded`` batches, WaveGlow's thread ``_Vocoded`` ones, either a
``_Failed`` batch; a thread ended by an unexpected exception puts
``_Crash``, and each ends its queue with ``_DONE``. Out of memory, either
stage goes on in halves of the batch (``Scheduling._in_halves``).
"""
from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from tts_cli.decoding import DecodedBatch, Job
from tts_cli.errors import first_line
from tts_cli.vocoding import Launched, Result, record_event

_DONE = object()   # end-of-stream marker between pipeline threads
# How often a pipeline thread waiting on a queue looks whether the run was
# halted (a get or put returns at once when the other side is ready).
_POLL_SECONDS = 0.05


class SynthesisError(Exception):
    """Why a batch (or, out of memory, a single line) came back without
    audio, as one line for its manifest rows. It holds no traceback: the
    failed attempt's frames hold its tensors, GPU memory included, for as
    long as their traceback is kept (a retry inside the except clause, or a
    line's error handed on), and out of memory the retries then fail too."""

    def __init__(self, reason: str, out_of_memory: bool = False):
        super().__init__(reason)
        self.out_of_memory = out_of_memory


def _failure(error: Exception) -> SynthesisError:
    """``error`` as the SynthesisError that goes out instead (traceback left behind)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return SynthesisError(f"out of GPU memory even in a batch of one: {first_line(error)}", True)
    return SynthesisError(f"synthesis failed: {first_line(error)}")


@dataclass(frozen=True)
class _Decoded:
    """The decoder to WaveGlow: a decoded batch."""
    batch: DecodedBatch
    ready: object | None    # CUDA event recorded after its decoding; None off CUDA


@dataclass(frozen=True)
class _Vocoded:
    """WaveGlow to the caller: a batch's results, in the order of its jobs."""
    jobs: list[Job]
    results: list[Result]


@dataclass(frozen=True)
class _Failed:
    """Either stage onwards: a batch (or, out of memory, a single line) that failed."""
    jobs: list[Job]
    error: SynthesisError


@dataclass(frozen=True)
class _Crash:
    """An unexpected exception that ended a pipeline thread; re-raised downstream."""
    error: BaseException


def _start(stage, sink: queue.Queue, halt: threading.Event, *args) -> threading.Thread:
    """``stage(*args, sink, halt)`` on a thread of its own, on the engine's device."""
    def run():
        try:
            with stage.__self__.on_device():
                stage(*args, sink, halt)
        except BaseException as e:  # noqa: BLE001 - handed to the consuming thread
            _put(sink, _Crash(e), halt)
    # Daemon as a last resort only: synthesize_all joins its stages on every
    # way out, since a thread still running torch code when the interpreter
    # exits aborts the process ("terminate called without an active
    # exception", exit status 134).
    thread = threading.Thread(target=run, daemon=True, name=f"tts-{stage.__name__}")
    thread.start()
    return thread


def _join(threads: list[threading.Thread]) -> None:
    """Join every thread however many KeyboardInterrupts come meanwhile (a
    Python caller's Ctrl-C; the command's signals raise none), then raise
    the first: a thread left running torch code as the interpreter exits
    aborts the process. A stage ends at its next slice or batch."""
    interrupted = None
    for thread in threads:
        while thread.is_alive():
            try:
                thread.join()
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
    if interrupted is not None:
        raise interrupted


def _put(q: queue.Queue, item, halt: threading.Event) -> bool:
    """Put ``item`` unless the run is halted first (its consumer may be gone
    and never make room); whether it was put."""
    while not halt.is_set():
        try:
            q.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            pass
    return False


def _get(q: queue.Queue, halt: threading.Event):
    """The next item, or ``_DONE`` once the run is halted."""
    while not halt.is_set():
        try:
            return q.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            pass
    return _DONE


def _wait_until_taken(q: queue.Queue, halt: threading.Event) -> None:
    """Until the consumer has taken (``task_done``) everything put on ``q``,
    or the run is halted."""
    with q.all_tasks_done:
        while q.unfinished_tasks and not halt.is_set():
            q.all_tasks_done.wait(_POLL_SECONDS)


def _wait_for(event, tensors, device: torch.device) -> None:
    """Make the current stream wait for tensors produced on another stream."""
    if event is None:
        return
    stream = torch.cuda.current_stream(device)
    stream.wait_event(event)
    for tensor in tensors:
        tensor.record_stream(stream)


class Scheduling:
    """Engine methods that schedule: ``synthesize_all`` and its two stages.
    They read the engine's ``device``, ``graphed`` and ``compiled``, and run
    its decoding (``decode_checked``) and vocoding (``_vocode_launch``,
    ``_vocode_and_finish``, ``_finish``)."""

    def synthesize_all(self, batches: Iterable[list[Job]], depth: int = 2,
                       stop: threading.Event | None = None, abort: threading.Event | None = None
                       ) -> Iterator[tuple[list[Job], list[Result] | Exception]]:
        """``synthesize`` over many batches, run ahead on background threads so
        the GPU keeps working while the caller writes files. On CUDA, Tacotron2
        (decoder graphs, small kernels) and WaveGlow (large products) run on two
        threads and two streams, so the decoder's work fills WaveGlow's gaps.

        Yields ``(jobs, results)`` in batch order, where ``results`` is the
        jobs' results or the SynthesisError that failed them. A batch that runs out
        of GPU memory is split in halves and retried, down to single jobs, so
        one batch may come back as several smaller ones (on CPU a batch also
        comes back in the slices WaveGlow runs at once); only a job that fails
        alone comes back with the error.

        The decoder works at most one batch ahead of WaveGlow. Once ``stop``
        is set no batch enters the decoder, and one that finishes decoding
        after it is dropped; the batches decoded before it still come out.
        Once ``abort`` is set, or the caller stops iterating (close the
        generator: ``contextlib.closing``), nothing more comes out and the
        work in flight is dropped at its next slice. On every way out the
        two threads are stopped and joined before this returns."""
        batches = list(batches)
        # A decoder graph captured while the other thread launches WaveGlow's
        # work can fail (CUDA forbids some calls from any thread during a
        # capture), so a capture after this start-up (a shape met only when
        # a batch is split, or every shape if out of memory here) runs with
        # the GPU to the decoder alone: WaveGlow's thread holds this lock
        # while it works.
        gpu_alone, capture_later = threading.RLock(), False
        if self.graphed is not None:
            try:
                with self.on_device():
                    self.graphed.prepare({(len(jobs), max(len(j.ids) for j in jobs)) for jobs in batches})
            except torch.cuda.OutOfMemoryError:
                self._release_memory()
                capture_later = True
        stop, abort, halt = stop or threading.Event(), abort or threading.Event(), threading.Event()
        decoded: queue.Queue = queue.Queue()
        results: queue.Queue = queue.Queue(maxsize=depth)
        stages = [_start(self._decode_stage, decoded, halt, batches, stop, gpu_alone, capture_later),
                  _start(self._vocode_stage, results, halt, decoded, gpu_alone)]
        try:
            while (message := _get(results, abort)) is not _DONE:
                if isinstance(message, _Crash):
                    raise message.error
                if isinstance(message, _Failed):
                    yield message.jobs, message.error
                    continue
                if self.compiled is not None:
                    self.compiled.remember()
                    self.compiled = None
                yield message.jobs, message.results
        finally:
            halt.set()
            _join(stages)

    def _stream(self):
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return torch.cuda.stream(torch.cuda.Stream(self.device))

    def _release_memory(self) -> None:
        """Hand cached blocks back before retrying smaller: the failed batch's
        allocations are free now but still held by the caching allocator."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _in_halves(self, jobs: list[Job], attempt, out: queue.Queue, halt: threading.Event,
                   alone=contextlib.nullcontext(), rows: slice = slice(None)) -> None:
        """Put on ``out`` the message ``attempt(rows)`` makes of the lines
        ``jobs[rows]`` (None: nothing to put). Out of GPU memory, each half
        of those lines the same way, with ``alone`` held, down to single
        lines; a line that fails alone, or lines that fail otherwise, go out
        as ``_Failed``. The one out-of-memory halving of both stages."""
        try:
            message = attempt(rows)
        except torch.cuda.OutOfMemoryError as e:
            error = _failure(e)
        except RuntimeError as e:
            _put(out, _Failed(jobs[rows], _failure(e)), halt)
            return
        else:
            if message is not None:
                _put(out, message, halt)
            return
        # Retried here, outside the except clause, where the failed attempt's
        # frames and the activations they held are gone.
        start, end, _ = rows.indices(len(jobs))
        if end - start == 1:
            _put(out, _Failed(jobs[rows], error), halt)
            return
        middle = start + (end - start + 1) // 2
        with alone:
            self._release_memory()
            for half in (slice(start, middle), slice(middle, end)):
                if halt.is_set():
                    return
                self._in_halves(jobs, attempt, out, halt, alone, half)

    @torch.inference_mode()
    def _decode_stage(self, batches: list[list[Job]], stop: threading.Event, gpu_alone: threading.RLock,
                      capture_later: bool, out: queue.Queue, halt: threading.Event) -> None:
        with self._stream():
            for jobs in batches:
                # One batch decoded ahead of WaveGlow keeps both busy; more
                # only lengthens what a stop leaves to finish.
                _wait_until_taken(out, halt)
                if stop.is_set() or halt.is_set():
                    break
                with gpu_alone if capture_later else contextlib.nullcontext():
                    self._decode_split(jobs, out, stop, halt, gpu_alone)
        _put(out, _DONE, halt)

    def _decode_split(self, jobs: list[Job], out: queue.Queue, stop: threading.Event,
                      halt: threading.Event, gpu_alone: threading.RLock) -> None:
        """Decode ``jobs``; out of memory, in halves (``_in_halves``), whose
        shapes may need graphs captured with the GPU to the decoder alone. A
        batch whose decoding ends after ``stop`` was set is dropped: WaveGlow
        would take far longer over it than the decoder did."""
        def attempt(rows: slice) -> _Decoded | None:
            # frames and verdicts read on this stream, not behind WaveGlow's queue
            batch = self.decode_checked(jobs[rows], self._alone_for_new_shapes(gpu_alone))
            return None if stop.is_set() else _Decoded(batch, record_event(self.device))
        self._in_halves(jobs, attempt, out, halt, gpu_alone)

    def _alone_for_new_shapes(self, gpu_alone: threading.RLock):
        """``decode_checked``'s ``alone``: a retry batch whose decoder graph
        is not captured yet is decoded with the GPU to the decoder alone
        (see ``synthesize_all``)."""
        @contextlib.contextmanager
        def alone(batch: int, symbols: int):
            if self.graphed is not None and not self.graphed.captured(batch, symbols):
                with gpu_alone:
                    yield
            else:
                yield
        return alone

    @torch.inference_mode()
    def _vocode_stage(self, decoded: queue.Queue, gpu_alone: threading.RLock, out: queue.Queue,
                      halt: threading.Event) -> None:
        """Vocode each decoded batch, results in batch order; the next
        batch's GPU work is queued before the previous batch is waited for
        and handed on (``_vocode_item``)."""
        pending = None
        with self._stream():
            while (message := _get(decoded, halt)) is not _DONE:
                decoded.task_done()
                with gpu_alone:
                    if isinstance(message, _Crash):
                        self._hand_on(pending, out, halt)
                        _put(out, message, halt)
                        return
                    pending = self._vocode_item(message, pending, out, halt)
            with gpu_alone:
                self._hand_on(pending, out, halt)
        _put(out, _DONE, halt)

    def _vocode_item(self, message: _Decoded | _Failed, pending: Launched | None, out: queue.Queue,
                     halt: threading.Event) -> Launched | None:
        """One decoded batch (or the failure in its place) through WaveGlow;
        the batch launched last, whose results are still to be handed on."""
        if isinstance(message, _Failed):
            self._hand_on(pending, out, halt)
            _put(out, message, halt)
            return None
        batch = message.batch
        try:
            _wait_for(message.ready, (batch.mel, batch.frames, batch.truncated), self.device)
            for part in self._waveglow_parts(batch):
                if halt.is_set():
                    break
                # Queued before the previous batch is waited for and handed on,
                # so WaveGlow's stream does not idle while this thread turns a
                # finished batch into host arrays.
                try:
                    launched = self._vocode_launch(part.jobs, part.mel, part.frames, part.truncated,
                                                   part.counts, part.cut)
                except RuntimeError:
                    launched = None   # out of memory among them: the halving path below, in order
                self._hand_on(pending, out, halt)
                pending = launched
                if launched is None:
                    self._vocode_split(part, out, halt)
        except BaseException:
            self._hand_on(pending, out, halt)   # made before the crash: its lines are written
            raise
        return pending

    def _waveglow_parts(self, batch: DecodedBatch) -> list[DecodedBatch]:
        """A decoded batch as WaveGlow runs it: on CUDA whole; on CPU, where a
        batch can take WaveGlow minutes, in the slices of whole lines that
        ``vocode`` would run one after another anyway (same shapes, same
        audio), each on its own, so that a halted run waits for one slice."""
        if self.device.type == "cuda":
            return [batch]
        return [batch.rows(rows) for rows in self.waveglow_slices(batch.counts)]

    def _hand_on(self, launched: Launched | None, out: queue.Queue, halt: threading.Event) -> None:
        """Wait for a launched batch and put its results out (None: nothing)."""
        if launched is None:
            return
        try:
            _put(out, _Vocoded(launched.jobs, self._finish(launched)), halt)
        except RuntimeError as e:
            _put(out, _Failed(launched.jobs, _failure(e)), halt)

    def _vocode_split(self, batch: DecodedBatch, out: queue.Queue, halt: threading.Event) -> None:
        """Vocode one decoded batch; out of memory, in halves (``_in_halves``),
        each half's mel cut to its own longest line."""
        def attempt(rows: slice) -> _Vocoded:
            jobs, mel, frames = batch.jobs[rows], batch.mel[rows], batch.frames[rows]
            if rows != slice(None):   # a half: its mel cut to its own longest line
                mel = mel[:, :, :int(frames.max())]
            return _Vocoded(jobs, self._vocode_and_finish(jobs, mel, frames, batch.truncated[rows]))
        self._in_halves(batch.jobs, attempt, out, halt)
