"""Alignment health: the measures, the checks' verdicts on models whose
attention is built to read well or to fail (aligned_models.py), retries
and what the manifest, the summary and the exit status say."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import soundfile as sf
import torch
from click.testing import CliRunner

from aligned_models import aligned_tacotron2
from checkpoint_files import write_nvidia_tacotron2, write_pickled_waveglow
from outputs import manifest
from tiny_models import canonical, tiny_waveglow
from tts_cli import bench
from tts_cli.alignment import Checked, Health, best, suspicion
from tts_cli.batching import pad_sequences
from tts_cli.cli import main
from tts_cli.config import Settings
from tts_cli.corpus import Utterance
from tts_cli.decoder_graph import GraphedDecoder
from tts_cli.engine import Engine, Job, measured
from tts_cli.planning import prepare_line, retry_seeds
from tts_cli.tacotron2 import AttentionPath, DecodeSettings, alignment_measures, decode

DEFAULTS = Settings()
STEPS = 600


def path_measures(path: list[int], frames: int | None = None, symbols: int | None = None) -> dict:
    positions = torch.tensor([path])
    symbols = symbols or max(path) + 1
    out = alignment_measures(AttentionPath(positions, torch.full(positions.shape, 0.9)),
                             torch.tensor([frames or len(path)]), torch.tensor([symbols]), symbols)
    return {k: float(v) for k, v in out.items()}


def test_the_measures_of_a_path_read_as_documented():
    reads = path_measures([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4])
    assert reads == {"coverage": 1.0, "focus": pytest.approx(0.9), "backward_jump": 0, "forward_jump": 1,
                     "symbols_left": 0, "frames_per_symbol": 3.0}
    # the peak wandering before the attention has a location, or leaving
    # for two frames and returning, is no jump
    wanders = path_measures([9, 7, 9, 0, 0, 1, 1, 1, 2, 9, 9, 3, 3, 3, 4, 4, 4], symbols=10)
    assert wanders["forward_jump"] == 1 and wanders["backward_jump"] == 0
    skips = path_measures([0, 0, 0, 1, 1, 1, 7, 7, 7, 8, 8, 8, 9, 9, 9])
    assert skips["forward_jump"] == 6 and skips["coverage"] == 0.5
    # a start never read is a jump ahead from the first symbol
    assert path_measures([5, 5, 5, 6, 6, 6, 7, 7, 7])["forward_jump"] == 5
    # going back, however gradually, is measured from the furthest symbol reached
    repeats = path_measures([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 2, 2, 1, 1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert repeats["backward_jump"] == 3 and repeats["coverage"] == 1.0 and repeats["forward_jump"] == 1
    # frames after the line's stop are not its own
    early = path_measures([0, 0, 1, 1, 2, 2, 9, 9], frames=6, symbols=10)
    assert early["symbols_left"] == 7 and early["coverage"] == pytest.approx(0.3) and early["forward_jump"] == 1


def lines(count: int, shortest: int, longest: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (count,), generator=g).tolist()
    return [torch.randint(1, 140, (n,), generator=g).tolist() for n in lengths]


def healths(model, seqs, graphed=False) -> list[Health]:
    """Each line's measures, decoded in batches of 16."""
    cfg = DecodeSettings(max_decoder_steps=STEPS)
    decoder = GraphedDecoder(model, cfg, steps_per_graph=16) if graphed else None
    out = []
    for i in range(0, len(seqs), 16):
        ids, lengths = pad_sequences(seqs[i: i + 16])
        seeds = torch.arange(i, i + len(lengths))
        with torch.inference_mode():
            d = decoder.decode(ids, lengths, seeds) if graphed else decode(model, ids, lengths, seeds, cfg)
        out += measured(d, lengths, ids.shape[1])
    return out


def flagged(model, seqs, thresholds=DEFAULTS, graphed=False) -> list[list[str]]:
    """Each line's failures under ``thresholds``."""
    return [health.failures(thresholds) for health in healths(model, seqs, graphed)]


GOOD = {"3 frames a symbol": dict(frames_per_symbol=3), "4 frames a symbol": dict(frames_per_symbol=4),
        "6 frames a symbol": dict(frames_per_symbol=6)}
# Each bad model, what it does to a line of n symbols (judged on its path,
# before the checks judge it), and the measure that must name it.
BAD = {
    "skips every other symbol": (dict(jump=2), lambda h, n: h.coverage <= 0.6, "coverage"),
    "skips two of three": (dict(jump=3), lambda h, n: h.coverage <= 0.45, "coverage"),
    "reads the line twice": (dict(repeat=True), lambda h, n: h.backward_jump >= n - 2, "back"),
    "never leaves the first symbol": (dict(stall=True), lambda h, n: h.symbols_left >= n - 2,
                                      "did not reach the end"),
    "babbles to the step limit": (dict(gate=False), lambda h, n: not h.gated, "the gate never fired"),
    "stops after 60 frames": (dict(stop_after=60), lambda h, n: h.symbols_left >= n // 4, "symbols left"),
}


def test_the_checks_flag_every_line_a_bad_model_misreads_and_no_line_a_good_one_reads():
    """The good models' 96 lines: none flagged. Each bad model's lines are
    first judged on their paths: those it misreads as its name says (at least
    a quarter; a skipping model also goes back for what it skipped on some
    lines, a stalling one may babble) must each be flagged, named by the
    measure that shows that misreading. A re-read is
    told only where it jumps back further than the backward bound, so that
    model reads lines of more than max_backward_jump + 2 symbols; the early
    stop, lines it leaves a quarter of. The counts are BENCHMARKS.md's."""
    seqs = lines(32, 6, 70)
    good = [f for kind in GOOD.values() for f in flagged(aligned_tacotron2(**kind), seqs)]
    assert [f for f in good if f] == [] and len(good) == 96
    report, caught, total = [], 0, 0
    for name, (kind, misreads, measure) in BAD.items():
        own = seqs
        if "stops" in name:
            own = [s for s in seqs if len(s) >= 20]
        if "twice" in name:
            own = [s for s in seqs if len(s) > DEFAULTS.max_backward_jump + 2]
        measures = healths(aligned_tacotron2(**kind), own)
        bad = [h for h, s in zip(measures, own) if misreads(h, len(s))]
        named = [h for h in bad if any(measure in f for f in h.failures(DEFAULTS))]
        report.append(f"{name}: misreads {len(bad)} of {len(own)}, {len(named)} named by '{measure}'")
        caught += sum(bool(h.failures(DEFAULTS)) for h in measures)
        total += len(own)
        assert len(bad) >= len(own) // 4, report[-1]
        assert len(named) == len(bad), report[-1]
    print("; ".join(report) + f"; all lines: {caught} of {total} flagged")
    # the two not flagged are lines the re-reading model read once and stopped on cleanly
    assert caught >= total - 2, report


def test_the_decoder_graphs_path_is_the_eager_decoders():
    # off CUDA the graphed decoder's static-buffer loop runs eagerly: its
    # path bookkeeping (steps copied once per graph, padding rows) is checked here
    seqs = lines(5, 6, 40, seed=3)
    for kind in (dict(frames_per_symbol=4), dict(repeat=True), dict(flaky=True)):
        model = aligned_tacotron2(**kind)
        assert flagged(model, seqs, graphed=True) == flagged(model, seqs)


def test_the_best_attempt_is_the_first_that_passes_else_the_one_failing_least():
    healthy = Health(0.95, 0.9, 1, 2, 0, True, 5.0)
    skips = Health(0.5, 0.9, 1, 9, 0, True, 5.0)
    babbles = Health(0.5, 0.3, 9, 9, 40, False, 20.0)
    assert best([skips, healthy, healthy], DEFAULTS) == 1
    assert best([babbles, skips], DEFAULTS) == 1
    assert best([skips, babbles, skips], DEFAULTS) == 0


def engine(model, checks: Settings | None = DEFAULTS) -> Engine:
    settings = dataclasses.replace(checks or Settings(check_alignment=False), max_decoder_steps=STEPS,
                                   save_mels=True)
    return Engine(model, tiny_waveglow(seed=1), torch.device("cpu"), torch.float32, settings)


def test_a_failing_line_is_retried_with_its_derived_seeds_and_keeps_the_audio_of_that_attempt():
    model = aligned_tacotron2(flaky=True)
    checked, unchecked = engine(model), engine(model, None)
    seqs = lines(24, 25, 40, seed=5)
    jobs = [Job(ids, seed=100 + n, retry_seeds=tuple(retry_seeds(7, f"line{n}", 4))) for n, ids in enumerate(seqs)]
    results = checked.synthesize(jobs)
    firsts = unchecked.synthesize(jobs)
    retried = [n for n, r in enumerate(results) if r.checked.attempt > 1]
    kept_first = [n for n, r in enumerate(results) if r.checked.attempt == 1]
    assert retried and kept_first
    for n in kept_first:        # a line that passes at once: the audio it makes unchecked
        assert not results[n].checked.failures and results[n].checked.attempts == 1
        assert np.array_equal(results[n].audio, firsts[n].audio)
    healed = 0
    for n in retried:           # the audio the line makes alone with the kept attempt's seed
        r = results[n]          # (to the rounding of products of another batch shape)
        assert firsts[n].checked is None and r.checked.attempts >= r.checked.attempt
        seed = jobs[n].retry_seeds[r.checked.attempt - 2]
        (alone,) = unchecked.synthesize([Job(seqs[n], seed=seed)])
        assert r.frames == alone.frames and np.allclose(r.audio, alone.audio, atol=1e-4)
        healed += not r.checked.failures
    assert healed >= len(retried) // 2, "most lines that stop early read to the end on a retry"


def test_the_bench_s_lines_are_checked_but_not_retried():
    # Its lines' lengths are forced (bench.force_lengths) and its run plans
    # no retries: a line that fails the checks keeps its one attempt.
    _, _, settings = bench._run_settings(bench.BenchSettings(device="cpu"))
    line = prepare_line(Utterance(line=1, id="a", text="Ten words or so, read by a voice."), 0, {}, settings)
    assert line.retry_seeds == [[]]
    model = aligned_tacotron2(gate=False)
    bench.force_lengths(model, 2.0)                       # 10 symbols, 20 frames: half of them read
    tts = Engine(model, tiny_waveglow(seed=1), torch.device("cpu"), torch.float32, settings)
    results = tts.synthesize([Job(lines(1, 10, 10)[0], seed=1, retry_seeds=tuple(line.retry_seeds[0]))])
    assert results[0].frames == 20
    assert results[0].checked.attempts == 1 and results[0].checked.failures


def test_checked_travels_as_plain_data():
    c = Checked(Health(0.8, 0.7, 1, 3, 0, True, 4.5), ("coverage 0.80 < 0.9",), 2, 3)
    assert Checked.from_plain(json.loads(json.dumps(c.plain()))) == c


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    """Checkpoint pairs: a Tacotron2 that reads well, one that stops early, and a flaky one."""
    folder = tmp_path_factory.mktemp("aligned")
    waveglow = folder / "waveglow.pt"
    write_pickled_waveglow(waveglow, canonical(tiny_waveglow(seed=3)))
    pairs = {}
    for name, kind in {"good": {}, "stops early": dict(stop_after=40), "flaky": dict(flaky=True)}.items():
        path = folder / f"{name}.pt"
        write_nvidia_tacotron2(path, canonical(aligned_tacotron2(**kind)))
        pairs[name] = (path, waveglow)
    return pairs


CORPUS = "".join(f"Line number {n}, which the tiny voice reads as it was built to read it.\n" for n in range(12))


def synth(tmp_path, pair, *options, out="out"):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    result = CliRunner().invoke(main, [str(corpus), "-o", str(tmp_path / out), "--tacotron2", str(pair[0]),
                                       "--waveglow", str(pair[1]), "--device", "cpu", "--seed", "3",
                                       "--max-decoder-steps", str(STEPS), *options])
    return result, manifest(tmp_path / out) if (tmp_path / out / "manifest.jsonl").exists() else []


def test_healthy_lines_are_ok_with_their_measures_in_the_manifest(tmp_path, voices):
    result, rows = synth(tmp_path, voices["good"])
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in rows] == ["ok"] * 12
    a = rows[0]["alignment"]
    assert a["coverage"] == 1.0 and a["reached_end"] and a["attempts"] == 1 and a["attempt"] == 1
    assert set(a) == {"coverage", "focus", "backward_jump", "forward_jump", "symbols_left", "reached_end",
                      "frames_per_symbol", "attempt", "attempts"}
    assert "retried" not in result.output
    # the checks change nothing of a healthy line's audio
    plain, plain_rows = synth(tmp_path, voices["good"], "--no-check-alignment", out="plain")
    assert plain.exit_code == 0 and all(r["alignment"] is None for r in plain_rows)
    for row in rows:
        assert np.array_equal(sf.read(tmp_path / "out" / row["audio_filepath"])[0],
                              sf.read(tmp_path / "plain" / row["audio_filepath"])[0])


def test_lines_that_fail_every_attempt_are_suspect_and_strict_makes_them_count(tmp_path, voices):
    result, rows = synth(tmp_path, voices["stops early"], "--retries", "1")
    assert result.exit_code == 0, result.output
    assert {r["status"] for r in rows} == {"suspect"}
    assert all(r["reason"].startswith("alignment: coverage") and "symbols left when the gate fired" in r["reason"]
               and r["reason"].endswith("(best of 2 attempts)") for r in rows)
    assert all(r["alignment"]["attempts"] == 2 for r in rows)
    assert "12 suspect" in result.output and "12 lines retried" in result.output
    strict, _ = synth(tmp_path, voices["stops early"], "--retries", "1", "--strict")
    assert strict.exit_code == 1 and "12 reused" in strict.output
    # looser thresholds: the same lines pass, and the keys change with them
    loose, rows = synth(tmp_path, voices["stops early"], "--retries", "1", "--min-coverage", "0",
                        "--end-margin", "500", "--strict")
    assert loose.exit_code == 0 and {r["status"] for r in rows} == {"ok"} and "0 reused" in loose.output


def test_retries_heal_lines_and_a_rerun_reuses_every_attempt(tmp_path, voices):
    result, rows = synth(tmp_path, voices["flaky"], "--retries", "4")
    assert result.exit_code == 0, result.output
    healed = [r for r in rows if r["status"] == "ok" and r["alignment"]["attempt"] > 1]
    assert len(healed) >= 3, "lines that stopped early read to the end on a retry"
    assert all(r["status"] == "suspect" and r["alignment"]["attempts"] == 5 for r in rows
               if r["status"] != "ok")
    again, again_rows = synth(tmp_path, voices["flaky"], "--retries", "4")
    assert "12 reused" in again.output and again_rows == rows
    fewer, _ = synth(tmp_path, voices["flaky"], "--retries", "3")
    assert "0 reused" in fewer.output, "the retry count is in the resume keys"


def test_a_cut_lines_alignment_is_given_per_piece(tmp_path, voices):
    result, rows = synth(tmp_path, voices["good"], "--max-symbols-per-piece", "40")
    assert result.exit_code == 0, result.output
    a = rows[0]["alignment"]
    assert rows[0]["pieces"] == len(a["pieces"]) >= 2
    assert a["coverage"] == min(p["coverage"] for p in a["pieces"])
    assert a["attempts"] == sum(p["attempts"] for p in a["pieces"])
    assert a["attempt"] == max(p["attempt"] for p in a["pieces"])


@pytest.mark.parametrize("option, value", [("--min-coverage", "1.5"), ("--retries", "-1"),
                                           ("--max-forward-jump", "0")])
def test_a_bad_threshold_is_refused_naming_it(tmp_path, voices, option, value):
    result, _ = synth(tmp_path, voices["good"], option, value)
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output
    recipe = tmp_path / "checks.yaml"
    recipe.write_text(f"{option[2:].replace('-', '_')}: {value}\n")
    result, _ = synth(tmp_path, voices["good"], "--recipe", str(recipe))
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert result.output.startswith(f"tts-batch: error: {recipe}: {option[2:].replace('-', '_')} must be")


# Each check pinned to its measure, at its threshold exactly. The jump bounds
# differ, so a check compared with the other's bound fails here.
PINNED = Settings(min_coverage=0.75, min_focus=0.5, max_forward_jump=8, max_backward_jump=5, end_margin=3,
                  max_frames_per_symbol=15.0)
HEALTHY = Health(coverage=0.9, focus=0.9, backward_jump=0, forward_jump=1, symbols_left=0, gated=True,
                 frames_per_symbol=5.0)
# measure: (the threshold's value, just past it, what the failure says, the threshold that would pass it)
AT_THE_THRESHOLD = {
    "coverage": (0.75, 0.74, "coverage 0.74 < 0.75", "min_coverage"),
    "focus": (0.5, 0.49, "focus 0.49 < 0.5", "min_focus"),
    "forward_jump": (8, 9, "jumped 9 symbols ahead (at most 8)", "max_forward_jump"),
    "backward_jump": (5, 6, "jumped 6 symbols back (at most 5)", "max_backward_jump"),
    "symbols_left": (3, 4, "did not reach the end: 4 symbols left when the gate fired (at most 3)", "end_margin"),
    "frames_per_symbol": (15.0, 15.1, "15.1 frames per symbol (at most 15)", "max_frames_per_symbol"),
}


@pytest.mark.parametrize("measure", AT_THE_THRESHOLD)
def test_each_check_passes_at_its_threshold_fails_just_past_it_naming_only_its_measure(measure):
    at, past, message, threshold = AT_THE_THRESHOLD[measure]
    assert HEALTHY.failures(PINNED) == []
    assert dataclasses.replace(HEALTHY, **{measure: at}).failures(PINNED) == []
    failing = dataclasses.replace(HEALTHY, **{measure: past})
    assert failing.failures(PINNED) == [message]
    assert failing.failures(dataclasses.replace(PINNED, **{threshold: past})) == [], "relaxing it alone passes"


def test_a_jump_back_between_the_two_bounds_is_judged_by_the_backward_one():
    assert dataclasses.replace(HEALTHY, backward_jump=7).failures(PINNED) == ["jumped 7 symbols back (at most 5)"]
    assert dataclasses.replace(HEALTHY, forward_jump=7).failures(PINNED) == []


def test_a_line_whose_gate_never_fired_did_not_reach_the_end_whatever_its_symbols_left():
    babbled = dataclasses.replace(HEALTHY, gated=False)
    assert babbled.failures(PINNED) == ["did not reach the end: the gate never fired"]
    assert not babbled.reached_end(dataclasses.replace(PINNED, end_margin=10 ** 6))


def test_the_manifest_gives_the_measures_to_four_places_and_frames_per_symbol_to_three():
    health = dataclasses.replace(HEALTHY, coverage=2 / 3, focus=1 / 7, frames_per_symbol=10 / 3)
    assert health.record(PINNED) == {"coverage": 0.6667, "focus": 0.1429, "backward_jump": 0, "forward_jump": 1,
                                     "symbols_left": 0, "reached_end": True, "frames_per_symbol": 3.333}


def kept(attempts: int, **measures) -> Checked:
    health = dataclasses.replace(HEALTHY, **measures)
    return Checked(health, tuple(health.failures(PINNED)), attempt=1, attempts=attempts)


def test_a_suspect_lines_reason_names_each_failing_measure_and_the_attempts_made():
    assert suspicion([kept(1)]) is None
    assert suspicion([kept(1, coverage=0.5, focus=0.25)]) == (
        "alignment: coverage 0.50 < 0.75, focus 0.25 < 0.5 (best of 1 attempt)")


def test_a_cut_lines_reason_names_the_failing_pieces_counting_from_one():
    pieces = [kept(1, coverage=0.5), kept(3), kept(2, forward_jump=9, backward_jump=6)]
    assert suspicion(pieces) == (
        "alignment: piece 1 of 3: coverage 0.50 < 0.75; "
        "piece 3 of 3: jumped 9 symbols ahead (at most 8), jumped 6 symbols back (at most 5) (best of 2 attempts)")
    assert suspicion(pieces[1:]) == ("alignment: piece 2 of 2: jumped 9 symbols ahead (at most 8), "
                                     "jumped 6 symbols back (at most 5) (best of 2 attempts)")
