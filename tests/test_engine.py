"""The engine: device and precision policy, whole-batch synthesis independent of the batch."""
import contextlib
import threading
import time

import numpy as np
import pytest
import torch

from tts_cli import scheduler as engine_module
from tts_cli.engine import Engine, Job, resolve_device, resolve_precision
from tiny_models import HOP, engine_settings, force_lengths, tiny_tacotron2, tiny_waveglow


def make_engine(frames: dict[int, int] | None = None, **decode):
    """An engine on tiny models; ``frames``: each line's frames by its
    symbol count (``tiny_models.force_lengths``), else its gate decides."""
    settings = engine_settings(**{"max_decoder_steps": 30, **decode})
    tacotron2 = tiny_tacotron2(seed=2) if frames is None else force_lengths(tiny_tacotron2(seed=2), frames)
    return Engine(tacotron2, tiny_waveglow(seed=2), torch.device("cpu"), torch.float32, settings)


def test_cpu_runs_fp32_and_says_so():
    dtype, notice = resolve_precision(torch.device("cpu"), None)
    assert dtype == torch.float32 and "CPU" in notice
    dtype, notice = resolve_precision(torch.device("cpu"), "fp16")
    assert dtype == torch.float32 and "fp16" in notice


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")
    assert resolve_device(None).type == "cpu"


def test_a_lines_audio_and_mel_do_not_depend_on_its_batch():
    frames = {4: 6, 70: 30, 15: 17, 2: 3}
    engine = make_engine(frames)
    g = torch.Generator().manual_seed(0)
    jobs = [Job(torch.randint(12, 64, (n,), generator=g).tolist(), seed=10 + n) for n in frames]
    together = engine.synthesize(jobs)
    for job, result in zip(jobs, together):
        alone = engine.synthesize([job])[0]
        assert result.frames == alone.frames == frames[len(job.ids)]
        assert result.audio.shape == (result.frames * HOP,)
        assert result.mel.shape == (16, result.frames)
        np.testing.assert_allclose(result.mel, alone.mel, atol=1e-5)
        scale = np.abs(alone.audio).max()
        np.testing.assert_allclose(result.audio, alone.audio, atol=1e-5 * scale)


def test_waveglow_runs_each_slice_of_a_batch_over_its_own_longest_line_with_the_same_audio(monkeypatch):
    frames = {4: 6, 70: 30, 15: 17, 2: 3}
    engine = make_engine(frames)
    jobs = [Job(list(range(12, 12 + n)), seed=n) for n in frames]
    alone = [engine.synthesize([job])[0] for job in jobs]
    rows_per_frame = HOP // engine.waveglow.dims.n_group
    engine.max_waveglow_rows = 2 * 17 * rows_per_frame   # two lines of 17 frames, one of 30
    widths = []
    real_vocode = Engine._vocode
    monkeypatch.setattr(Engine, "_vocode", lambda self, mel, *rest: widths.append(mel.shape[2])
                        or real_vocode(self, mel, *rest))
    together = engine.synthesize(jobs)
    assert widths == [6, 30, 17]   # the batch is 30 frames wide: 6 and 17 + 3 ran without its padding
    for result, one in zip(together, alone):
        assert result.frames == one.frames
        np.testing.assert_allclose(result.audio, one.audio, atol=1e-5 * np.abs(one.audio).max())


def test_on_cpu_waveglow_runs_folded_and_gives_the_plain_models_audio():
    # The folded matrix-product WaveGlow (no Triton off CUDA) is faster on CPU
    # too; its audio must be the plain model's, as the reference computes it.
    engine = make_engine({5: 9, 2: 4})
    assert engine.fast_waveglow is not None and engine.graphed is None
    jobs = [Job([20, 31, 40, 12, 50], seed=3), Job([33, 21], seed=4)]
    for fast, plain in zip(engine.synthesize(jobs), engine.eager().synthesize(jobs)):
        scale = np.abs(plain.audio).max()
        np.testing.assert_allclose(fast.audio, plain.audio, atol=1e-5 * scale)


@pytest.mark.parametrize("failing", [None, 1])
def test_queueing_the_next_batch_early_changes_neither_results_nor_their_order(failing):
    # synthesize_all hands each batch on only after the next one is queued;
    # every batch must still come out once, in order, with the audio it gets
    # alone (synthesize, no threads), and a failed batch's error must stay
    # with that batch.
    engine = make_engine({5: 7, 9: 4})
    g = torch.Generator().manual_seed(4)
    batches = [[Job(torch.randint(12, 64, (n,), generator=g).tolist(), seed=n + 10 * b) for n in (5, 9)]
               for b in range(4)]
    if failing is not None:
        batches[failing] = [Job([], seed=1)]   # no symbols: the decoder fails on it
    threaded = list(engine.synthesize_all(batches))
    assert [jobs for jobs, _ in threaded] == batches
    for (jobs, out), batch in zip(threaded, batches, strict=True):
        if isinstance(out, Exception):
            assert isinstance(out, engine_module.SynthesisError) and str(out).startswith("synthesis failed")
            with pytest.raises(RuntimeError):
                engine.synthesize(batch)
            continue
        for a, b in zip(out, engine.synthesize(batch), strict=True):
            np.testing.assert_array_equal(a.audio, b.audio)
            np.testing.assert_array_equal(a.mel, b.mel)
    failed = [i for i, (_, out) in enumerate(threaded) if isinstance(out, Exception)]
    assert failed == ([] if failing is None else [failing])


def test_a_finished_run_leaves_none_of_its_threads_behind(monkeypatch):
    # Its stage threads are daemons; one still alive (tearing down its torch
    # state) when the interpreter exits aborted the process with status 134
    # in about one run of fifteen, after every file was written. Here the
    # vocode thread lingers a moment after its last result, as that teardown.
    vocode = Engine._vocode_stage

    def lingering(self, *args):
        vocode(self, *args)
        time.sleep(0.3)

    monkeypatch.setattr(Engine, "_vocode_stage", lingering)
    engine = make_engine({3: 5, 6: 5, 9: 5})
    batches = [[Job([12, 13, 14] * (1 + i), seed=i) for i in range(3)] for _ in range(3)]
    assert len(list(engine.synthesize_all(batches))) == 3
    assert not [t for t in threading.enumerate() if t.name.startswith("tts-") and t.is_alive()]


def test_without_save_mels_the_audio_is_the_same_and_no_mel_comes_back():
    # the pipeline asks for mels only with --save-mels; leaving them on the
    # device must not change a line's audio
    frames = {5: 6, 3: 4}
    with_mels = make_engine(frames)
    without = Engine(force_lengths(tiny_tacotron2(seed=2), frames), tiny_waveglow(seed=2), torch.device("cpu"),
                     torch.float32, engine_settings(max_decoder_steps=30, save_mels=False))
    jobs = [Job([20, 31, 42, 17, 9], seed=3), Job([12, 13, 14], seed=4)]
    for a, b in zip(with_mels.synthesize(jobs), without.synthesize(jobs), strict=True):
        assert b.mel is None and a.mel.shape == (16, a.frames)
        assert b.frames == a.frames
        np.testing.assert_array_equal(a.audio, b.audio)


def engine_threads():
    return [t for t in threading.enumerate() if t.name.startswith("tts-") and t.is_alive()]


# short_batches' lines: 2 to 4 symbols, 4 frames each
SHORT = {2: 4, 3: 4, 4: 4}


def short_batches(count, size=2):
    return [[Job([12, 13, 14, 15][: 2 + i % 3], seed=10 * b + i) for i in range(size)]
            for b in range(count)]


@pytest.mark.parametrize("when", ["while batch 1 decodes", "once batch 1 is decoded"])
def test_after_the_signal_no_batch_enters_the_decoder_and_what_was_decoded_is_written(monkeypatch, when):
    # Ctrl-C while WaveGlow works on batch 0. Batch 1, if decoded before the
    # signal, still comes out; if still in the decoder, it is dropped (WaveGlow
    # would take far longer over it than the decoder did). Batch 2 never enters
    # the decoder, which works at most one batch ahead of WaveGlow.
    engine, stop, signalled = make_engine(SHORT), threading.Event(), threading.Event()
    decoded, vocoded, waits = [], [], []
    decode, vocode, wait_until_taken = Engine.decode_only, Engine._vocode, engine_module._wait_until_taken

    def decoding(self, jobs):
        decoded.append(jobs)
        if len(decoded) == 2 and when == "while batch 1 decodes":
            stop.set()
            signalled.set()
        return decode(self, jobs)

    def waiting(out, halt):   # the decoder, before each batch: the one before was put
        waits.append(1)
        if len(waits) == 3 and when == "once batch 1 is decoded":
            signalled.set()
        wait_until_taken(out, halt)

    def vocoding(self, mel, *rest):
        assert signalled.wait(timeout=30)
        stop.set()
        vocoded.append(mel.shape[0])
        return vocode(self, mel, *rest)

    monkeypatch.setattr(Engine, "decode_only", decoding)
    monkeypatch.setattr(engine_module, "_wait_until_taken", waiting)
    monkeypatch.setattr(Engine, "_vocode", vocoding)
    batches = short_batches(6)
    out = list(engine.synthesize_all(batches, stop=stop))
    written = 2 if when == "once batch 1 is decoded" else 1
    assert [jobs for jobs, _ in out] == batches[:written] and vocoded == [2] * written
    assert decoded == batches[:2]
    assert not engine_threads()


@pytest.mark.parametrize("how", ["abort", "caller leaves", "caller fails", "stage fails"])
def test_every_way_out_of_a_run_stops_and_joins_the_engines_threads(monkeypatch, how):
    # A thread still running torch code when the interpreter exits aborts the
    # process (exit status 134), whatever ended the run.
    engine, abort = make_engine(SHORT), threading.Event()
    decode = Engine.decode_only

    def decoding(self, jobs):
        if how == "stage fails" and jobs[0].seed >= 20:
            raise ValueError("a bug in a stage")
        return decode(self, jobs)

    monkeypatch.setattr(Engine, "decode_only", decoding)
    batches = short_batches(8)
    run = engine.synthesize_all(batches, abort=abort)
    received = []
    with pytest.raises(ValueError) if how in ("caller fails", "stage fails") else contextlib.nullcontext():
        for jobs, _ in run:
            received.append(jobs)
            if how == "abort":
                abort.set()
            elif how == "caller leaves":
                run.close()
            elif how == "caller fails":
                raise ValueError("the caller's own error")
    if how == "caller fails":
        run.close()   # what contextlib.closing does for the pipeline
    assert received == batches[: 2 if how == "stage fails" else 1]
    assert not engine_threads()


# attempts: the batch of 4, its halves, their halves (WaveGlow: the batch
# queued early first, then the same batch on the halving path)
@pytest.mark.parametrize("stage, attempts", [("decode_only", 7), ("_vocode_launch", 8)])
def test_an_out_of_memory_attempt_lets_go_of_its_tensors_before_the_halves_are_tried(monkeypatch, stage,
                                                                                     attempts):
    # A failed attempt's frames hold its activations (on a GPU, the memory
    # the halves need): if the retry ran while the error (and its traceback)
    # was alive, every half failed too, down to single lines. Here each
    # attempt makes a tensor and fails; when the next attempt starts, and
    # while the errors of lines that failed alone are held, none is alive.
    import weakref
    engine = make_engine({3: 4})
    made, alive_at_retry = [], []
    original = getattr(Engine, stage)

    def failing(self, jobs, *args):
        alive_at_retry.append(sum(ref() is not None for ref in made))
        activations = torch.empty(1000)                   # what a frame of the attempt holds
        made.append(weakref.ref(activations))
        if len(jobs) > 1 or jobs[0].seed == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, jobs, *args)

    monkeypatch.setattr(Engine, stage, failing)
    batch = [Job([20 + i, 31, 40], seed=i) for i in range(4)]
    out = list(engine.synthesize_all([batch]))
    assert sorted(j.seed for jobs, _ in out for j in jobs) == [0, 1, 2, 3]
    errors = [(jobs, r) for jobs, r in out if isinstance(r, Exception)]
    assert [[j.seed for j in jobs] for jobs, _ in errors] == [[2]]
    assert alive_at_retry == [0] * attempts
    assert errors[0][1].__traceback__ is None and not any(ref() is not None for ref in made)


def test_a_batch_made_before_the_waveglow_stage_fails_still_comes_out(monkeypatch):
    """A bug in WaveGlow's stage at batch 1: batch 0, whose audio was made,
    comes out before the error, as it does when the decoder's stage fails."""
    engine, launches = make_engine(SHORT), []
    launch = Engine._vocode_launch

    def launching(self, jobs, *rest):
        launches.append(jobs)
        if len(launches) == 2:
            raise ValueError("a bug in WaveGlow's stage")
        return launch(self, jobs, *rest)

    monkeypatch.setattr(Engine, "_vocode_launch", launching)
    batches, received = short_batches(3), []
    with pytest.raises(ValueError, match="a bug in WaveGlow's stage"):
        for jobs, results in engine.synthesize_all(batches):
            received.append(jobs)
            assert not isinstance(results, Exception)
    assert received == batches[:1]
    assert not engine_threads()


def test_a_ctrl_c_while_the_threads_are_joined_waits_for_them_then_is_raised(monkeypatch):
    """A Python caller's second Ctrl-C arrives while the run joins its
    threads: they are still joined (a thread left running torch code as
    the interpreter exits aborts the process), then the interrupt is raised."""
    engine, joins = make_engine(SHORT), []
    join = threading.Thread.join

    def interrupted_join(self, timeout=None):
        joins.append(self.name)
        if len(joins) == 1:
            raise KeyboardInterrupt
        return join(self, timeout)

    run = engine.synthesize_all(short_batches(4))
    next(run)
    monkeypatch.setattr(threading.Thread, "join", interrupted_join)
    with pytest.raises(KeyboardInterrupt):
        run.close()
    monkeypatch.undo()
    assert joins[:2] == ["tts-_decode_stage"] * 2, "the interrupted join is tried again"
    assert not engine_threads()
