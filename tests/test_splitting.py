"""Cutting long lines: gentlest boundary first, nothing lost, pieces fit."""
import re
import unicodedata

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from tts_cli.splitting import split_text
from tts_cli.text import UnsupportedTextError, normalize


def symbols(text: str) -> int:
    return len(normalize(text)[0])


def test_a_line_within_the_limit_is_not_cut():
    line = "Short enough, by far."
    assert split_text(line, 180, symbols) == [line]
    assert split_text(line * 20, 0, symbols) == [line * 20], "0 disables cutting"


def test_sentences_are_kept_whole_and_packed_before_clauses_are_cut():
    line = "One two three. Four five six. Seven eight nine, ten eleven."
    assert split_text(line, 30, symbols) == ["One two three. Four five six.", "Seven eight nine, ten eleven."]
    assert split_text(line, 20, symbols) == ["One two three.", "Four five six.", "Seven eight nine,",
                                             "ten eleven."]


def test_a_sentence_too_long_even_per_clause_is_cut_between_words_not_glued_to_the_next():
    line = "aaaa bbbb cccc dddd eeee ffff gggg. Next sentence."
    assert split_text(line, 15, symbols) == ["aaaa bbbb cccc", "dddd eeee ffff", "gggg.", "Next sentence."]


def test_limits_count_normalized_symbols_and_arpabet_stays_whole():
    # "$3.50" reads "three dollars, fifty cents": 26 symbols from 5 characters.
    assert split_text("Pay $3.50 now.", 12, symbols) == ["Pay", "$3.50", "now."]
    assert "{HH AW1 S}" in split_text("a very long {HH AW1 S} word list here", 6, symbols)


_WORDS = st.lists(st.sampled_from(["word", "longer", "a", "$12", "1963", "Mr.", "x,", "end.", "so;",
                                   "{HH AW1 S}", "it's", "\u00e9t\u00e9", "--"]), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(words=_WORDS, limit=st.integers(min_value=1, max_value=80))
def test_no_word_is_lost_and_every_piece_fits_unless_it_is_one_word(words, limit):
    line = " ".join(words)
    try:
        pieces = split_text(line, limit, symbols)
    except UnsupportedTextError:
        return
    assert " ".join(pieces).split() == line.split()
    for piece in pieces:
        assert symbols(piece) <= limit or len(re.findall(r"\{[^}]*\}?|\S+", piece)) == 1


# Each mark pinned: a short first part, then one that just fits the limit,
# so that cutting between words instead would pack differently.
TAIL = "Four five six seven."


@pytest.mark.parametrize("mark", [".", "!", "?"])
@pytest.mark.parametrize("closer", ["", '"', "'", ")", "]"])
def test_each_sentence_end_and_a_closing_quote_or_bracket_after_it_is_a_cut(mark, closer):
    first = f"Yes{mark}{closer}"
    assert split_text(f"{first} {TAIL}", len(TAIL), len) == [first, TAIL]


@pytest.mark.parametrize("mark", [",", ";", ":"])
def test_each_clause_mark_is_a_cut(mark):
    tail = TAIL.lower()
    assert split_text(f"Yes{mark} {tail}", len(tail), len) == [f"Yes{mark}", tail]


@pytest.mark.parametrize("word", ["Yes -", "Yes --", "(Yes", "Yes'"])
def test_a_dash_an_opening_bracket_or_a_bare_quote_is_no_cut(word):
    # not cut there, so the words are packed: the first piece takes words of the tail
    tail = TAIL.lower()
    assert split_text(f"{word} {tail}", len(tail), len)[0].startswith(f"{word} four")


def test_a_line_exactly_at_the_limit_comes_back_as_it_is():
    line = "Yes.  No, maybe."
    assert split_text(line, len(line), len) == [line]


def test_neighbours_that_together_reach_the_limit_exactly_share_a_piece():
    # each cut is a pause in the audio: parts that fit together are not cut apart
    line = "Yes. No. Maybe."
    assert split_text(line, len("Yes. No."), len) == ["Yes. No.", "Maybe."]
    assert split_text(line, len("Yes. No.") - 1, len) == ["Yes.", "No.", "Maybe."]


def test_no_cut_after_a_title():
    # cut after "Mr." the first piece would pack "He met Mr." (34 symbols)
    line = "An opening sentence. He met Mr. Smith."
    assert split_text(line, 36, symbols) == ["An opening sentence.", "He met Mr. Smith."]


def test_a_cut_line_says_each_spoken_form_as_the_whole_line_does():
    """A long line is cut after the extended normalization has written its
    spoken forms out, so "$3.5 million" is not cut into "three dollars, five
    cents" and "million", and the pieces together say what the manifest's
    normalized text says."""
    from tts_cli.config import Settings
    from tts_cli.corpus import Utterance
    from tts_cli.planning import prepare_line
    from tts_cli.text import sequence_to_text
    text = ("Councillors said that the new budget of $3.5 million would be approved at 14:25 Dec. 24 by "
            "Mr. Smith, who is reported to have said, in a long and winding statement that went on, that "
            "0.05 mg was enough.")
    line = prepare_line(Utterance(line=1, id="a", text=text), 0, {}, Settings(max_symbols_per_piece=60))
    pieces = [sequence_to_text(ids) for ids in line.pieces]
    assert len(pieces) > 2
    assert re.sub(r"\s+", " ", " ".join(pieces)) == line.normalized
    said = " ".join(pieces)
    assert "three point five million dollars" in said and "fourteen twenty-five december twenty-fourth" in said
    assert "zero point zero five milligrams" in said and "cents" not in said
    assert not any(piece.endswith("mister") for piece in pieces)


def test_ideographs_are_cut_at_their_full_stops_and_commas_then_between_characters():
    """Chinese or Japanese has no spaces: uncut, a long line ran into the
    decoder's step limit and came out truncated."""
    sentence = "中华人民共和国是工人阶级领导的国家。"
    pieces = split_text(sentence * 6, 180, symbols)
    assert pieces == [f"{sentence} {sentence}"] * 3, "cut at 。 (a space between sentences reads alike)"
    assert split_text("今日は、とても良い天気ですね", symbols("とても良い天気ですね"), symbols) == [
        "今日は、", "とても良い天気ですね"]
    unbroken = sentence.rstrip("。") * 6
    pieces = split_text(unbroken, 180, symbols)
    assert "".join(pieces) == unbroken and len(pieces) == 3, "between characters, joined with nothing"
    assert all(symbols(piece) <= 180 for piece in pieces)


def test_a_thai_letter_keeps_its_vowel_signs_and_tone_marks_when_cut():
    line = "สวัสดีครับผมชื่อสมชาย" * 8
    pieces = split_text(line, 60, symbols)
    assert "".join(pieces) == line and len(pieces) > 1
    assert all(symbols(piece) <= 60 for piece in pieces)
    assert not any(unicodedata.category(piece[0]).startswith("M") for piece in pieces)


def test_a_latin_word_longer_than_a_piece_stays_whole():
    word = "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3
    assert split_text(f"Say {word} now", 40, symbols) == ["Say", word, "now"]
