"""The corpus pipeline around the engine: what it holds on to while it runs."""
import weakref

import numpy as np
import torch

from tts_cli.bench import force_lengths
from tts_cli.config import Settings
from tts_cli.corpus import read_corpus
from tts_cli.engine import Engine
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
