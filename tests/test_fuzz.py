"""Bad input, fuzzed: any text into the front end, any bytes through the
corpus reader and line preparation; never an exception, one row per line."""
import re
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from test_corpus import _CORPUS_BYTES, physical_line_count
from tts_cli.config import Settings
from tts_cli.corpus import FORMATS, CorpusError, read_corpus
from tts_cli.planning import prepare_line
from tts_cli.text import SYMBOLS, UnsupportedTextError, is_speakable, normalize

# Pieces that reach the number, currency, abbreviation and ARPAbet rules,
# mixed with arbitrary Unicode.
_TEXT_PIECES = st.sampled_from([
    "$", "£", "1", "0", "9" * 40, ",", ".", "5th", "1,000", "$,5", "{", "}", "HH", "AW1", " ", "\n",
    "mr.", "Dr.", "e\u0301", "\u2028", "\x00", "ﬁ", "½", "-", "'", "#",
])
_TEXT = st.one_of(st.text(max_size=120), st.lists(_TEXT_PIECES, max_size=40).map("".join))


@settings(max_examples=500, deadline=None)
@given(text=_TEXT)
def test_the_front_end_takes_any_text_and_gives_ids_in_the_table(text):
    try:
        ids, shown = normalize(text)
    except UnsupportedTextError as error:
        assert str(error) and "\n" not in str(error)
        return
    assert all(0 < i < len(SYMBOLS) for i in ids)
    assert isinstance(shown, str)


@settings(max_examples=300, deadline=None)
@given(data=_CORPUS_BYTES, fmt=st.sampled_from(FORMATS), limit=st.sampled_from([0, 3, 180]))
def test_any_bytes_in_every_format_give_one_row_or_job_per_physical_line(data, fmt, limit):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "corpus.txt"
        path.write_bytes(data)
        try:
            utterances = read_corpus(path, fmt)
        except CorpusError as error:   # plain refuses only what is not text
            assert "\n" not in str(error)
            assert fmt != "plain" or re.search(r"not a text file|not valid UTF-8|a gzip file", str(error))
            return
    run = Settings(max_symbols_per_piece=limit)
    rows, jobs = {}, []
    for utterance in utterances:
        job = prepare_line(utterance, 1, rows, run)
        if job is not None:
            jobs.append(job)
    assert len(rows) + len(jobs) == len(utterances) == physical_line_count(data)
    assert not set(rows) & {job.utterance.line for job in jobs}
    for job in jobs:
        assert job.pieces and all(is_speakable(piece) for piece in job.pieces)
        assert len(job.seeds) == len(job.pieces)
