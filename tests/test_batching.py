"""Lines sorted by length into batches, and padded ids."""
import pytest
import torch

from tts_cli.batching import length_sorted_batches, pad_sequences


def test_batches_take_the_longest_lines_first_and_cover_every_line_once():
    lengths = [5, 40, 12, 40, 3, 27, 12]
    batches = length_sorted_batches(lengths, batch_size=3)
    assert [len(b) for b in batches] == [3, 3, 1]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths, reverse=True)          # similar lengths share a batch


def test_equal_lengths_keep_corpus_order_so_the_batching_is_the_same_every_run():
    assert length_sorted_batches([7, 9, 7, 9, 7], batch_size=2) == [[1, 3], [0, 2], [4]]


def test_a_batch_size_below_one_is_refused_and_an_empty_corpus_has_no_batches():
    with pytest.raises(ValueError, match="at least 1"):
        length_sorted_batches([3, 4], batch_size=0)
    assert length_sorted_batches([], batch_size=4) == []


def test_padding_keeps_each_line_s_ids_and_records_its_length():
    ids, lengths = pad_sequences([[12, 13, 14], [15], [16, 17]], pad=0)
    assert ids.dtype == torch.long and lengths.dtype == torch.long
    assert ids.tolist() == [[12, 13, 14], [15, 0, 0], [16, 17, 0]]
    assert lengths.tolist() == [3, 1, 2]
    ids, _ = pad_sequences([[20], [21, 22]], pad=9)
    assert ids.tolist() == [[20, 9], [21, 22]]


def test_planning_a_run_needs_no_torch():
    # Planning (normalizing, cutting, seeding, batching the lines) runs before
    # the models load; importing torch there costs seconds on every run,
    # even one that only reports a bad corpus or has nothing left to do.
    import subprocess
    import sys
    code = "import sys, tts_cli.planning, tts_cli.journal; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_shortest_first_runs_the_same_batches_in_the_opposite_order():
    from tts_cli.corpus import Utterance
    from tts_cli.planning import PendingLine, batch_plan
    pending = [PendingLine(Utterance(n, f"{n:06d}", "x"), "x", [[5] * length], [0], results=[None])
               for n, length in enumerate([3, 9, 1, 7, 5, 2, 8], start=1)]
    longest_first = batch_plan(pending, 3)
    shortest_first = batch_plan(pending, 3, shortest_first=True)
    assert shortest_first == longest_first[::-1]
    assert [[len(p.pieces[i]) for p, i in batch] for batch in shortest_first] == [[1], [5, 3, 2], [9, 8, 7]]


# --- planning each line ---------------------------------------------------------------------------

def plan(text, problem=None, **settings):
    """prepare_line's verdict on corpus line 4, id "a": (its pending line or
    None, the manifest row it got now or None)."""
    from tts_cli.config import Settings
    from tts_cli.corpus import Utterance
    from tts_cli.planning import prepare_line
    rows = {}
    pending = prepare_line(Utterance(4, "a", text, problem), 7, rows, Settings(**settings))
    return pending, rows.get(4)


@pytest.mark.parametrize("problem, status", [("empty line", "skipped"), ("empty text", "skipped"),
                                             ("line is not valid UTF-8 (byte 0xff at column 1)", "error")])
def test_a_line_the_corpus_could_not_give_is_skipped_when_empty_else_an_error(problem, status):
    pending, row = plan("", problem)
    assert pending is None
    assert (row.id, row.line, row.text, row.normalized_text) == ("a", 4, "", "")
    assert (row.status, row.reason, row.seed, row.audio_filepath, row.pieces) == (status, problem, None, None, 0)
    assert (row.duration, row.num_samples, row.mel_frames) == (0.0, 0, 0)


def test_a_line_the_front_end_cannot_read_is_an_error_saying_why():
    pending, row = plan("It cost $,5.")
    assert pending is None
    assert (row.id, row.line, row.text, row.normalized_text, row.status) == ("a", 4, "It cost $,5.", "", "error")
    assert row.reason == "cannot read dollar amount $',5'"


def test_a_line_of_punctuation_only_is_skipped_with_its_normalized_text():
    pending, row = plan("...!?")
    assert pending is None
    assert (row.normalized_text, row.status, row.reason) == ("...!?", "skipped", "nothing speakable after cleaning")


def test_a_line_to_say_gets_its_ids_and_seeds_and_retry_seeds_only_when_checked():
    from tts_cli.planning import line_seed, retry_seeds
    pending, row = plan("Hi.")
    assert row is None
    assert (pending.normalized, pending.pieces, pending.seeds) == ("hi.", [normalize_ids("Hi.")], [line_seed(7, "a")])
    assert pending.retry_seeds == [retry_seeds(7, "a", 2)] and len(set(pending.retry_seeds[0])) == 2
    assert pending.results == [None] and not pending.complete
    assert plan("Hi.", check_alignment=False)[0].retry_seeds == [[]]


def test_every_seed_of_a_line_follows_the_run_seed():
    from tts_cli.corpus import Utterance
    from tts_cli.config import Settings
    from tts_cli.planning import prepare_line
    line = lambda seed: prepare_line(Utterance(4, "a", "Hi."), seed, {}, Settings(retries=2))
    one, other = line(7), line(8)
    assert not set(one.seeds + one.retry_seeds[0]) & set(other.seeds + other.retry_seeds[0])


def test_a_cut_line_has_a_seed_per_piece_named_after_it():
    from tts_cli.planning import line_seed, retry_seeds
    pending, _ = plan("One two three. Four five six.", max_symbols_per_piece=16, retries=1)
    assert pending.pieces == [normalize_ids("One two three."), normalize_ids("Four five six.")]
    assert pending.seeds == [line_seed(7, "a/0"), line_seed(7, "a/1")]
    assert pending.retry_seeds == [retry_seeds(7, "a/0", 1), retry_seeds(7, "a/1", 1)]
    assert pending.results == [None, None]


def normalize_ids(text):
    from tts_cli.text import normalize
    return normalize(text)[0]


@pytest.mark.parametrize("limit", [180, len(" Hi. ")])   # well within it, and at it exactly
def test_a_line_within_the_limit_is_read_whole_with_the_spaces_at_its_ends(limit):
    # as the reference reads it: only a line that is cut loses them
    pending, _ = plan(" Hi.  ", max_symbols_per_piece=limit)
    assert pending.pieces == [normalize_ids(" Hi.  ")] and len(pending.pieces[0]) == len(" Hi. ")


def test_a_line_is_read_by_the_runs_normalization_and_names_what_it_left_unsaid():
    from tts_cli.text import text_to_sequence
    pending, _ = plan("Up 12% at 7:05.", text_normalization="extended")
    assert pending.normalized == "up twelve percent at seven oh five." and pending.dropped is None
    assert pending.pieces == [text_to_sequence("up twelve percent at seven oh five.")]
    assert pending.caution is None
    pending, _ = plan("Up 12% at 7:05.", text_normalization="reference")
    assert pending.normalized == "up twelve at seven:five." and pending.dropped == "%"
    assert pending.caution == "characters the voice cannot say, left out: '%'"


def test_a_line_in_another_script_is_made_with_a_caution_naming_its_letters_and_reading():
    pending, _ = plan("\u65e5\u672c\u8a9e \u2014 50\u2030 #tag", text_normalization="reference")
    assert pending.caution == (
        "letters of another script the voice cannot say ('\u65e5\u672c\u8a9e'), read as their Latin "
        f"transliteration: {pending.normalized[:40]!r}; characters the voice cannot say, left out: "
        f"{pending.dropped[:12]!r}")
    assert "#" in pending.dropped


def test_braces_holding_what_is_no_phone_make_the_line_suspect_and_a_latin_letter_s_other_forms_do_not():
    """Lower-case or misspelt ARPAbet is left out as the reference leaves it
    out, so the row must say so; full-width or mathematical Latin letters
    are read as the letters they are."""
    pending, _ = plan("Say {hh aw1 s} and {HH AW1 S} or {XX HH} now.")
    assert pending.caution == ("braces holding what is no ARPAbet phone (those are upper case: {HH AW1 S}), left "
                               "out: 'hh aw1 s XX'")
    pending, _ = plan("\uff26\uff55\uff4c\uff4c width and \U0001d401old.")
    assert pending.normalized == "full width and bold." and pending.caution is None
    pending, _ = plan("Next\x85line", text_normalization="extended")
    assert pending.normalized == "next line", "a next-line control is a space, not nothing"
    pending, _ = plan("Next\x85line", text_normalization="reference")
    assert pending.normalized == "nextline", "as NVIDIA's cleaners read it"


def test_a_line_with_nothing_to_say_keeps_what_it_left_unsaid_in_its_row():
    pending, row = plan("%%% ###", text_normalization="reference")
    assert pending is None and (row.status, row.dropped) == ("skipped", "%#")


def test_a_cut_lines_pieces_are_read_by_the_runs_normalization():
    # each piece as the whole line would read: "12%" is "twelve percent", not "twelve"
    pending, _ = plan("Up 12% today. Down 5% tomorrow.", max_symbols_per_piece=30, text_normalization="extended")
    assert pending.normalized == "up twelve percent today. down five percent tomorrow."
    assert pending.pieces == [normalize_ids("up twelve percent today."), normalize_ids("down five percent tomorrow.")]


def test_a_caution_names_at_most_12_characters_and_40_of_the_reading():
    greek = "\u03b1\u03b2\u03b3\u03b4\u03b5\u03b6\u03b7\u03b8\u03b9\u03ba\u03bb\u03bc\u03bd"   # 13 letters
    pending, _ = plan(f"Forty characters of plain English to read, then {greek}.")
    assert pending.caution == ("letters of another script the voice cannot say ('\u03b1\u03b2\u03b3\u03b4\u03b5"
                               "\u03b6\u03b7\u03b8\u03b9\u03ba\u03bb\u03bc'), read as their Latin "
                               "transliteration: 'forty characters of plain english to rea'")
    emoji = "".join(chr(0x1F600 + k) for k in range(13))
    pending, _ = plan(f"Hi {emoji}")
    assert pending.caution == f"characters the voice cannot say, left out: {emoji[:12]!r}"
