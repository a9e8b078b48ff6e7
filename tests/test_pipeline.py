"""The corpus pipeline around the engine: what it holds on to while it runs."""
import json
import weakref

import numpy as np
import pytest
import torch

from tts_cli.bench import force_lengths
from tts_cli.config import Settings
from tts_cli.corpus import read_corpus
from tts_cli.engine import Engine
from tts_cli.manifest import ManifestRow
from tts_cli.pipeline import synthesize_corpus
from tts_cli.writing import verdict
from tiny_models import engine_settings, tiny_tacotron2, tiny_waveglow


def test_a_run_lets_go_of_each_lines_audio_once_it_is_written(tmp_path):
    # A run that kept every line's audio to its end would grow with the
    # corpus: on CUDA each batch's audio is a pinned host block, which no
    # later batch could reuse (BENCHMARKS.md, what each step bought).
    engine = Engine(tiny_tacotron2(seed=2), tiny_waveglow(seed=2), torch.device("cpu"), torch.float32,
                    engine_settings(max_decoder_steps=20))
    force_lengths(engine.tacotron2, 0.5)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Line number {n} of the corpus.\n" for n in range(8)))
    earlier: list[weakref.ref] = []
    still_held = []
    run_batches = engine.synthesize_all

    def watched(batches, **options):
        for jobs, results in run_batches(batches, **options):
            still_held.append(sum(ref() is not None for ref in earlier))
            earlier.extend(weakref.ref(r.audio) for r in results)
            yield jobs, results
    engine.synthesize_all = watched

    summary = synthesize_corpus(Settings(batch_size=2, quiet=True), read_corpus(corpus), tmp_path / "out",
                                on_notice=lambda m: None, engine=engine)
    assert summary.counts["ok"] == 8 and len(still_held) == 4
    # when a batch comes out, only the one before it may still be in hand
    assert max(still_held) <= 2, still_held


def test_without_a_batch_size_cpu_runs_batches_of_16_shortest_first(tmp_path):
    # 128, the GPU's default, made a batch that WaveGlow takes most of a
    # minute over on a CPU, and that much work for one Ctrl-C to wait for.
    engine = Engine(tiny_tacotron2(seed=2), tiny_waveglow(seed=2), torch.device("cpu"), torch.float32,
                    engine_settings(max_decoder_steps=4))
    force_lengths(engine.tacotron2, 0.1)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Line number {n} of the corpus.\n" for n in range(40)))
    sizes = []
    run_batches = engine.synthesize_all

    def watched(batches, **options):
        sizes.extend(len(jobs) for jobs in batches)
        return run_batches(batches, **options)
    engine.synthesize_all = watched
    summary = synthesize_corpus(Settings(quiet=True, device="cpu"), read_corpus(corpus), tmp_path / "out",
                                on_notice=lambda m: None, engine=engine)
    assert summary.counts["ok"] == 40 and sizes == [8, 16, 16], "the shortest batch first on CPU"


def _made(frames: int, checked: bool = True, truncated: bool = False):
    """A piece as the engine hands it back, its alignment passing (or unchecked)."""
    from tts_cli.alignment import Checked, Health
    from tts_cli.engine import Result
    health = Health(coverage=1.0, focus=0.9, backward_jump=0, forward_jump=1, symbols_left=0, gated=True,
                    frames_per_symbol=5.0)
    return Result(audio=np.zeros(frames * 256, np.float32), mel=None, frames=frames, truncated=truncated,
                  checked=Checked(health, (), 1, 1) if checked else None)


def test_a_piece_too_short_to_be_heard_makes_its_line_suspect():
    assert verdict([_made(5)], 1000) == ("ok", None)
    assert verdict([_made(4)], 1000) == ("suspect", "no audible speech: the stop gate fired after 4 frames "
                                                    "(fewer than 5)")
    assert verdict([_made(40), _made(2)], 1000) == (
        "suspect", "no audible speech: the stop gate fired after 2 frames (fewer than 5) (piece 2 of 2)")
    # the text's own caution comes first; a cut piece is truncated, whatever its length
    assert verdict([_made(1)], 1000, "characters the voice cannot say, left out: '%'") == (
        "suspect", "characters the voice cannot say, left out: '%'; no audible speech: the stop gate fired "
                   "after 1 frame (fewer than 5)")
    assert verdict([_made(3, truncated=True)], 3)[0] == "truncated"


def test_a_run_that_checks_nothing_judges_no_length():
    """--no-check-alignment: what the decoder made is not judged at all."""
    assert verdict([_made(1, checked=False)], 1000) == ("ok", None)


def test_a_line_that_failed_still_names_the_characters_its_text_left_unsaid(tmp_path):
    from tts_cli.config import Settings
    from tts_cli.corpus import Utterance
    from tts_cli.formats import Layout
    from tts_cli.planning import PendingLine
    from tts_cli.writing import LineWriter
    line = PendingLine(Utterance(line=1, id="a", text="50% off"), "fifty off", [[5, 6]], [1],
                       results=[RuntimeError("out of memory")], dropped="%")
    row = LineWriter(Settings(), Layout("wav"), tmp_path, 1, 22050).write(line)
    assert (row.status, row.dropped, row.audio_filepath) == ("error", "%", None)


def test_a_process_whose_take_over_fails_leaves_the_earlier_jobs_partial_manifest_as_it_was(tmp_path,
                                                                                         monkeypatch):
    """A torchrun re-run whose rank 0 dies before it has merged what the
    killed job left: another rank's journal has the name of that job's
    partial manifest (same rank and size), and saving it would replace the
    rows it holds, unmerged, with none."""
    from tts_cli import coordination, pipeline
    from tts_cli.errors import FatalError
    from tts_cli.journal import ManifestJournal
    from tts_cli.signals import StopOnSignals

    out = tmp_path / "out"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Line one.\nLine two.\n")
    engine = Engine(tiny_tacotron2(seed=2), tiny_waveglow(seed=2), torch.device("cpu"), torch.float32,
                    engine_settings(max_decoder_steps=8))
    assert synthesize_corpus(Settings(quiet=True, seed=1), read_corpus(corpus), out, on_notice=lambda m: None,
                             engine=engine).counts["ok"] == 2
    partial = out / "manifest.rank-1-of-2.jsonl"
    partial.write_bytes((out / "manifest.jsonl").read_bytes().splitlines(keepends=True)[1])
    (out / "manifest.jsonl").unlink()   # as a killed torchrun job leaves it: rows in partial manifests
    earlier = partial.read_bytes()

    class RankOneOfTwo(coordination.Alone):
        def share(self, batches, pending, manifest, journal=None):
            return coordination.Share(batches, pending), ManifestJournal(partial, manifest.utterances,
                                                                          seed=manifest.seed, only=set())

        def take_over(self, manifest):
            raise FatalError("rank 1 of 2: another process of this job stopped; run the same command again")

    monkeypatch.setattr(pipeline, "coordinator", lambda group: RankOneOfTwo())
    with StopOnSignals() as signals, pytest.raises(FatalError, match="another process of this job stopped"):
        synthesize_corpus(Settings(quiet=True, seed=1), read_corpus(corpus), out, on_notice=lambda m: None,
                          engine=engine, signals=signals)
    assert partial.read_bytes() == earlier


def test_a_stopped_process_writes_the_shared_lines_whose_pieces_were_all_made(tmp_path):
    """Under torchrun a line cut in pieces that two processes made is
    written once every process is done; a process stopped before then (a
    signal, or torchrun stopping it when another died) still writes those
    whose pieces are all there, so a re-run does not make them again."""
    from tts_cli import coordination
    from tts_cli.corpus import Utterance
    from tts_cli.formats import Layout
    from tts_cli.journal import ManifestJournal
    from tts_cli.planning import PendingLine
    from tts_cli.signals import StopOnSignals
    from tts_cli.vocoding import Result
    from tts_cli.writing import LineWriter

    out = tmp_path / "out"
    (out / "wavs").mkdir(parents=True)
    settings = Settings(sample_rate=22050, denoiser_strength=0.0, check_alignment=False)
    lines = [PendingLine(Utterance(line=n, id=f"{n:06d}", text=f"Line {n}."), f"line {n}.", [[20, 21], [22, 23]],
                         [n, n + 10], results=[None, None]) for n in (1, 2)]
    writer = LineWriter(settings, Layout.for_corpus("wav", 0, 2), out, 1, 22050)
    for p in lines:
        p.results[0] = Result(audio=np.full(256, 0.1, np.float32), mel=None, frames=1, truncated=False)
        writer.write_piece(p, 0)
    lines[0].results[1] = Result(audio=np.full(256, 0.2, np.float32), mel=None, frames=1, truncated=False)
    writer.write_piece(lines[0], 1)   # line 2's second piece was never made
    mine = ManifestJournal(out / "manifest.rank-0-of-2.jsonl", [p.utterance for p in lines], seed=1, only={1, 2})
    together = object.__new__(coordination.Together)
    with StopOnSignals() as signals:
        signals.stop.set()
        done = together.finish(None, mine, coordination.Share([], lines, set(lines)), writer, signals)
    assert done is False
    rows = {row.id: row for row in map(lambda line: ManifestRow(**json.loads(line)),
                                       mine.path.read_text().splitlines())}
    assert list(rows) == ["000001"] and rows["000001"].status == "ok" and rows["000001"].pieces == 2
    assert (out / rows["000001"].audio_filepath).is_file()
    assert writer.pieces_made(lines[1]) is False and not writer.pieces_made(lines[0]), "line 1's pieces went"


def test_a_signal_after_the_last_line_is_written_stops_nothing_and_is_no_interruption(tmp_path, monkeypatch):
    """The job is done when the signal comes: the run returns its summary
    (no "run the same command again to finish" naming a manifest)."""
    import os
    import signal as signals_module
    from tts_cli import coordination
    from tts_cli.signals import StopOnSignals

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Line one.\nLine two.\n")
    engine = Engine(tiny_tacotron2(seed=2), tiny_waveglow(seed=2), torch.device("cpu"), torch.float32,
                    engine_settings(max_decoder_steps=8))
    finish = coordination.Alone.finish

    def signalled_late(self, *args):
        os.kill(os.getpid(), signals_module.SIGTERM)
        return finish(self, *args)

    monkeypatch.setattr(coordination.Alone, "finish", signalled_late)
    with StopOnSignals() as signals:
        summary = synthesize_corpus(Settings(quiet=True, seed=1), read_corpus(corpus), tmp_path / "out",
                                    on_notice=lambda m: None, engine=engine, signals=signals)
        assert signals.received == signals_module.SIGTERM
    assert summary.counts["ok"] == 2
