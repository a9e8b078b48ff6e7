"""Tests for tts_cli.corpus: one utterance per physical line, in every format."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_cli.corpus import FORMATS, CorpusError, Utterance, format_hint, read_corpus, utterances_from_texts


def write_corpus(tmp_path: Path, data: bytes, name: str = "corpus.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def physical_line_count(data: bytes) -> int:
    """Independent oracle: lines as an editor counts them (LF, CRLF, CR; BOM ignored)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data:
        return 0
    unified = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return unified.count(b"\n") + (0 if unified.endswith(b"\n") else 1)


# --- plain ---------------------------------------------------------------------------------

def test_plain_numbers_ids_from_line_and_keeps_text_as_read(tmp_path):
    path = write_corpus(tmp_path, "Hello world.\n  Spaces kept, \"quotes\" too.  \nÜmlaut café.\n".encode())
    assert read_corpus(path) == [
        Utterance(1, "000001", "Hello world."),
        Utterance(2, "000002", '  Spaces kept, "quotes" too.  '),
        Utterance(3, "000003", "Ümlaut café."),
    ]


def test_bom_and_crlf_are_not_part_of_the_text(tmp_path):
    path = write_corpus(tmp_path, b"\xef\xbb\xbfFirst.\r\nSecond.\r\n")
    rows = read_corpus(path)
    assert [row.text for row in rows] == ["First.", "Second."]
    assert all(row.problem is None for row in rows)


def test_files_with_boms_joined_read_as_each_file_alone(tmp_path):
    """``cat *.tsv | tts-batch - --format tsv``: files saved with a BOM
    (Notepad, Excel) each start with one, mid-stream once they are joined."""
    one = b"\xef\xbb\xbfa\tHello.\r\nb\tWorld.\r\n"
    path = write_corpus(tmp_path, one + one.replace(b"a\t", b"c\t").replace(b"b\t", b"d\t"))
    rows = read_corpus(path, "tsv")
    assert [(row.id, row.text, row.problem) for row in rows] == [
        ("a", "Hello.", None), ("b", "World.", None), ("c", "Hello.", None), ("d", "World.", None)]
    inside = write_corpus(tmp_path, "Zero\ufeffwidth.\n".encode())
    assert [row.text for row in read_corpus(inside)] == ["Zero\ufeffwidth."], "inside a line it is text"


def test_old_mac_cr_line_endings_split_lines(tmp_path):
    path = write_corpus(tmp_path, b"one\rtwo\rthree")
    assert [row.text for row in read_corpus(path)] == ["one", "two", "three"]


def test_last_line_without_newline_is_kept(tmp_path):
    path = write_corpus(tmp_path, b"first\nlast without newline")
    rows = read_corpus(path)
    assert [row.text for row in rows] == ["first", "last without newline"]


def test_trailing_newline_does_not_add_an_empty_row(tmp_path):
    path = write_corpus(tmp_path, b"first\nsecond\n")
    assert len(read_corpus(path)) == 2


def test_empty_file_has_no_rows(tmp_path):
    assert read_corpus(write_corpus(tmp_path, b"")) == []


def test_empty_and_whitespace_lines_are_kept_with_a_problem(tmp_path):
    path = write_corpus(tmp_path, b"one\n\n \t \ntwo\n\n")
    rows = read_corpus(path)
    assert [(row.line, row.problem) for row in rows] == [
        (1, None), (2, "empty line"), (3, "empty line"), (4, None), (5, "empty line"),
    ]
    # Later lines keep their own numbers: nothing shifted.
    assert rows[3].id == "000004" and rows[3].text == "two"


def test_unicode_line_separators_inside_a_line_do_not_split_it(tmp_path):
    # str.splitlines() would break on these; the corpus has 2 physical lines.
    path = write_corpus(tmp_path, "a\u2028b\x85c\x0cd\nnext\n".encode())
    rows = read_corpus(path)
    assert [row.text for row in rows] == ["a\u2028b\x85c\x0cd", "next"]


def test_invalid_utf8_line_in_the_middle_keeps_its_row_and_neighbours(tmp_path):
    path = write_corpus(tmp_path, b"Good one.\nCaf\xe9 au lait.\nGood two.\n")
    rows = read_corpus(path)
    assert len(rows) == 3
    assert rows[0] == Utterance(1, "000001", "Good one.")
    assert rows[2] == Utterance(3, "000003", "Good two.")
    bad = rows[1]
    assert (bad.line, bad.id, bad.text) == (2, "000002", "")
    assert "not valid UTF-8" in bad.problem
    assert "0xe9" in bad.problem and "column 4" in bad.problem


# --- ljspeech / tsv --------------------------------------------------------------------------

def test_ljspeech_reads_id_and_raw_text_and_ignores_normalized_column(tmp_path):
    path = write_corpus(
        tmp_path,
        b"LJ001-0001|Printing, in the only sense|Printing, in the only sense\n"
        b"LJ001-0002|in 1490.|in fourteen ninety.\n"
        b"LJ001-0003|two columns only\n",
        "metadata.csv",
    )
    assert read_corpus(path, "ljspeech") == [
        Utterance(1, "LJ001-0001", "Printing, in the only sense"),
        Utterance(2, "LJ001-0002", "in 1490."),
        Utterance(3, "LJ001-0003", "two columns only"),
    ]


def test_tsv_reads_id_and_text_and_ignores_extra_columns(tmp_path):
    path = write_corpus(tmp_path, b"utt_a\tHello there.\tspeaker1\t0.9\r\nutt.b\tPipes | stay text.\r\n")
    assert read_corpus(path, "tsv") == [
        Utterance(1, "utt_a", "Hello there."),
        Utterance(2, "utt.b", "Pipes | stay text."),
    ]


def test_ljspeech_with_bom_and_crlf(tmp_path):
    path = write_corpus(tmp_path, b"\xef\xbb\xbfLJ1|One.\r\nLJ2|Two.\r\n")
    rows = read_corpus(path, "ljspeech")
    assert [(row.id, row.text) for row in rows] == [("LJ1", "One."), ("LJ2", "Two.")]


@pytest.mark.parametrize("fmt, separator", [("ljspeech", b"|"), ("tsv", b"\t")])
def test_separated_formats_flag_bad_lines_with_placeholder_ids(tmp_path, fmt, separator):
    lines = [
        b"a1" + separator + b"fine",
        b"no separator here",
        separator + b"text without id",
        b"a2" + separator + b"   ",
        b"",
        b"a3" + separator + b"caf\xe9",
        b"b\xffd" + separator + b"readable text",
        b"a4" + separator + b"fine too" + separator + b"\xff ignored column is never decoded",
    ]
    rows = read_corpus(write_corpus(tmp_path, b"\n".join(lines) + b"\n"), fmt)
    assert [row.line for row in rows] == list(range(1, 9))
    assert [row.id for row in rows] == [
        "a1", "line-000002", "line-000003", "a2", "line-000005", "a3", "line-000007", "a4",
    ]
    assert rows[0].problem is None and rows[7].problem is None
    assert rows[7].text == "fine too"
    assert "separator" in rows[1].problem and rows[1].text == "no separator here"
    assert "empty id" in rows[2].problem and rows[2].text == "text without id"
    assert rows[3].problem == "empty text"
    assert rows[4].problem == "empty line"
    # Bad text: the real id is kept so the manifest names the right utterance.
    assert rows[5].text == "" and "not valid UTF-8" in rows[5].problem and "column 7" in rows[5].problem
    # Bad id: placeholder id, but the readable text is still shown.
    assert rows[6].text == "readable text" and "0xff at column 2" in rows[6].problem


# --- a plain corpus that looks like ids and text -------------------------------------------------

IDS_AND_TEXT = [b"LJ001-0001{}Printing, in the only sense.", b"LJ001-0002{}It cost $3.50.", b"",
                b"LJ001-0003{}Hi.", b"spk_2.take-7{}A line with a | in it.", b"x{}Short.",
                b"A line a hand added without an id."]


def hint(tmp_path, lines, fmt="plain"):
    path = write_corpus(tmp_path, b"\n".join(lines) + b"\n")
    return format_hint(path, read_corpus(path, fmt), fmt)


@pytest.mark.parametrize("separator, fmt", [(b"|", "ljspeech"), (b"\t", "tsv")])
def test_a_plain_corpus_mostly_of_ids_and_text_gets_one_line_naming_its_format(tmp_path, separator, fmt):
    lines = [line.replace(b"{}", separator) for line in IDS_AND_TEXT]
    found = hint(tmp_path, lines)     # 5 of the 6 lines with text: over 80 %
    assert found is not None and "\n" not in found
    assert str(tmp_path / "corpus.txt") in found and "5 of its 6 lines" in found and f"--format {fmt}" in found
    assert hint(tmp_path, lines[:2] + [b"A line without an id.", b"Another one."]) is None   # 2 of 4
    assert "4 of its 5 lines" in hint(tmp_path, lines[:5] + [b"A line without an id."])    # 80 % exactly


@pytest.mark.parametrize("lines", [
    [b"Either this|or that, said the sign.", b"Nothing to see here.", b"Or here."],
    [b"He said | she said.", b"We said | they said."],                  # no id has a space
    [b"Name\tAge\tTown", b"\tAn indented line.", b"Plain prose again."],
    [b"LJ001-0001|The only line."],                                    # one line is no pattern
    [b"a|", b"b|  "],                                                   # ids, but no text after them
])
def test_prose_with_an_occasional_separator_gets_no_hint(tmp_path, lines):
    assert hint(tmp_path, lines) is None


def test_a_hint_takes_ids_of_up_to_64_characters(tmp_path):
    lines = [b"a" * 63 + bytes([c]) + b"|Some text." for c in b"xyz"]
    assert "3 of its 3 lines" in hint(tmp_path, lines)
    assert hint(tmp_path, [b"b" + line for line in lines]) is None


def test_the_separated_formats_themselves_get_no_hint(tmp_path):
    assert hint(tmp_path, [line.replace(b"{}", b"|") for line in IDS_AND_TEXT], "ljspeech") is None
    assert hint(tmp_path, [line.replace(b"{}", b"\t") for line in IDS_AND_TEXT], "tsv") is None


# --- ids that would break the output folder ------------------------------------------------

def test_duplicate_id_names_file_and_both_lines(tmp_path):
    path = write_corpus(tmp_path, b"LJ001-0001|a\nLJ001-0002|b\nLJ001-0001|c\n", "corpus.psv")
    with pytest.raises(CorpusError) as error:
        read_corpus(path, "ljspeech")
    message = str(error.value)
    assert message == f"{path}:3: duplicate id 'LJ001-0001' (first on line 1); ids must be unique"
    assert "\n" not in message


def test_ids_differing_only_in_case_clash(tmp_path):
    # On macOS/Windows both would write the same WAV file.
    path = write_corpus(tmp_path, b"Utt1\ta\nutt1\tb\n")
    with pytest.raises(CorpusError, match=r":2: id 'utt1' differs only in case from 'Utt1' on line 1"):
        read_corpus(path, "tsv")


@pytest.mark.parametrize("bad_id", ["a/b", "../escape", ".hidden", "-rf", "with space", "tab\x0bid", "é", "a" * 129])
def test_unsafe_id_names_file_and_line(tmp_path, bad_id):
    path = write_corpus(tmp_path, b"ok|fine\n" + bad_id.encode() + b"|text\n", "corpus.psv")
    with pytest.raises(CorpusError) as error:
        read_corpus(path, "ljspeech")
    message = str(error.value)
    assert message.startswith(f"{path}:2: id ")
    assert "\n" not in message


def test_unsafe_id_message_says_what_to_use(tmp_path):
    path = write_corpus(tmp_path, b"ok|fine\nx|y\nz|w\n\na/b|text\n", "corpus.psv")
    with pytest.raises(CorpusError) as error:
        read_corpus(path, "ljspeech")
    assert str(error.value) == (
        f"{path}:5: id 'a/b' is not a safe file name "
        "(use letters, digits, '.', '_' and '-', starting with a letter or digit)"
    )


def test_longest_allowed_id_is_accepted(tmp_path):
    long_id = "a" * 128
    rows = read_corpus(write_corpus(tmp_path, long_id.encode() + b"\ttext\n"), "tsv")
    assert rows[0].id == long_id


def test_real_id_equal_to_a_placeholder_is_reported_on_the_real_line(tmp_path):
    path = write_corpus(tmp_path, b"line-000002|text\nno separator\n")
    with pytest.raises(CorpusError, match=r":1: id 'line-000002' is the placeholder id of line 2"):
        read_corpus(path, "ljspeech")



@pytest.mark.parametrize("unreadable", [b"   ", b"|text without id", b"b\xffd|readable text", b"no separator"])
def test_a_line_whose_id_cannot_be_read_lends_its_placeholder_to_no_later_line(tmp_path, unreadable):
    path = write_corpus(tmp_path, unreadable + b"\nline-000001|text\n")
    with pytest.raises(CorpusError) as error:
        read_corpus(path, "ljspeech")
    assert str(error.value) == (f"{path}:2: id 'line-000001' is the placeholder id of line 1, "
                                "which has no readable id; rename it")


@pytest.mark.parametrize("text", [b"   ", b"caf\xe9"])
def test_an_unsafe_id_is_refused_even_on_a_line_with_nothing_to_say(tmp_path, text):
    # among readable lines: a file mostly not UTF-8 is refused as not text first
    path = write_corpus(tmp_path, b"../escape|" + text + b"\nLJ1|Fine.\nLJ2|Fine too.\n")
    with pytest.raises(CorpusError, match=r":1: id '../escape' is not a safe file name"):
        read_corpus(path, "ljspeech")


def test_a_too_long_id_is_shown_cut_to_40_characters(tmp_path):
    long_id = "".join(chr(ord("a") + i % 26) for i in range(129))
    path = write_corpus(tmp_path, long_id.encode() + b"|text\n")
    with pytest.raises(CorpusError) as error:
        read_corpus(path, "ljspeech")
    assert str(error.value) == f"{path}:1: id {long_id[:40]!r}... is 129 characters long; use at most 128"


def test_lines_without_text_keep_what_was_there(tmp_path):
    rows = read_corpus(write_corpus(tmp_path, b"a1|  \n \t \nno separator, caf\xe9\n"), "ljspeech")
    assert [(row.text, row.problem) for row in rows[:2]] == [("  ", "empty text"), ("", "empty line")]
    assert rows[2].text == "" and "byte 0xe9 at column 18" in rows[2].problem


def test_standard_input_is_named_stdin_in_messages(tmp_path, monkeypatch):
    import io
    import sys
    from types import SimpleNamespace
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(b"a|one\na|two\n")))
    with pytest.raises(CorpusError, match=r"^<stdin>:2: duplicate id 'a'"):
        read_corpus("-", "ljspeech")
    lines = [line.replace(b"{}", b"|") for line in IDS_AND_TEXT]
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(b"\n".join(lines))))
    assert format_hint("-", read_corpus("-"), "plain").startswith("<stdin>: 5 of its 6 lines")


# --- file-level errors -----------------------------------------------------------------------

def test_missing_file_is_a_one_line_corpus_error(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(CorpusError) as error:
        read_corpus(missing)
    assert str(error.value) == f"{missing}: no such file; check the corpus path"


def test_directory_is_a_one_line_corpus_error(tmp_path):
    with pytest.raises(CorpusError) as error:
        read_corpus(tmp_path)
    assert str(error.value).startswith(f"{tmp_path}: is a directory")
    assert "\n" not in str(error.value)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file_is_a_one_line_corpus_error(tmp_path):
    path = write_corpus(tmp_path, b"text\n")
    path.chmod(0)
    with pytest.raises(CorpusError, match="permission denied"):
        read_corpus(path)


@pytest.mark.parametrize("error, message", [
    (PermissionError(13, "Permission denied"), "permission denied; make the file readable"),
    (OSError(5, "Input/output error"), "cannot read (Input/output error); check the file"),
])
def test_a_corpus_that_cannot_be_read_is_one_line_naming_it(tmp_path, monkeypatch, error, message):
    # as root no file is unreadable, so the failure is the disk's, made here
    from tts_cli import corpus

    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(corpus, "open", fail, raising=False)
    path = tmp_path / "corpus.txt"
    with pytest.raises(CorpusError) as raised:
        read_corpus(path)
    assert str(raised.value) == f"{path}: {message}"


def test_unknown_format_lists_the_formats(tmp_path):
    path = write_corpus(tmp_path, b"text\n")
    with pytest.raises(ValueError) as error:
        read_corpus(path, "csv")
    for fmt in FORMATS:
        assert fmt in str(error.value)
    assert str(error.value) == "unknown corpus format 'csv'; use one of: plain, ljspeech, tsv"


def test_corpus_error_is_a_value_error():
    # Callers that catch ValueError for bad input also catch corpus problems.
    assert issubclass(CorpusError, ValueError)


# --- property: never lose or invent a line -----------------------------------------------------

# Bytes built from the pieces that matter (separators, line endings, BOMs,
# invalid UTF-8, id characters) hit the interesting paths far more often than
# uniformly random bytes, which are mixed in as well.
_PIECES = st.sampled_from([
    b"\n", b"\r", b"\r\n", b"|", b"\t", b"\xef\xbb\xbf", b"\xff", b"\xe9", b"\xc3", b"\xc3\xa9",
    b" ", b"a", b"B7", b"id-1", b"x.y", b"/", b".", b"\x00", "\u2028".encode(), b"\x85",
])
_CORPUS_BYTES = st.one_of(st.binary(max_size=200), st.lists(_PIECES, max_size=60).map(b"".join))


def _read_bytes_as_corpus(data: bytes, fmt: str) -> list[Utterance]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "corpus.txt"
        path.write_bytes(data)
        return read_corpus(path, fmt)


@settings(max_examples=400, deadline=None)
@given(data=_CORPUS_BYTES)
def test_plain_any_bytes_give_exactly_one_row_per_physical_line_or_are_refused_as_not_text(data):
    try:
        rows = _read_bytes_as_corpus(data, "plain")  # ids cannot clash: only what is not text is refused
    except CorpusError as error:
        assert "\n" not in str(error)
        assert re.search(r"not a text file|not valid UTF-8|a gzip file", str(error))
        assert b"\0" in data or data.startswith(b"\x1f\x8b") or "UTF-8" in str(error)
        return
    assert len(rows) == physical_line_count(data)
    assert [row.line for row in rows] == list(range(1, len(rows) + 1))
    assert len({row.id for row in rows}) == len(rows)


@settings(max_examples=400, deadline=None)
@given(data=_CORPUS_BYTES, fmt=st.sampled_from(["ljspeech", "tsv"]))
def test_separated_any_bytes_give_one_row_per_line_or_a_corpus_error(data, fmt):
    try:
        rows = _read_bytes_as_corpus(data, fmt)
    except CorpusError as error:
        assert "\n" not in str(error)
        return
    assert len(rows) == physical_line_count(data)
    assert [row.line for row in rows] == list(range(1, len(rows) + 1))
    assert len({row.id.casefold() for row in rows}) == len(rows)
    for row in rows:
        assert row.id  # every row has an id, even a placeholder
        assert "\n" not in row.text and "\r" not in row.text


def test_a_binary_file_is_refused_as_not_text(tmp_path):
    """A program or an audio file given as the corpus: its lines would be
    synthesized as noise, so it is refused in one line naming the file."""
    path = tmp_path / "ls"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00hello\nworld\n")
    with pytest.raises(CorpusError) as error:
        read_corpus(path)
    assert str(error.value) == (f"{path}: not a text file (a NUL byte at byte 8); give a UTF-8 text corpus, "
                                "one line per utterance")


def test_a_file_whose_first_byte_is_nul_is_refused_as_not_text(tmp_path):
    path = tmp_path / "utf16.txt"
    path.write_bytes("Hi.\nThere.\n".encode("utf-16-be"))    # b"\0H\0i..."
    with pytest.raises(CorpusError, match=r"utf16.txt: not a text file \(a NUL byte at byte 1\)"):
        read_corpus(path)


def test_a_corpus_mostly_in_another_encoding_is_refused(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Café crème.\nNaïve façade.\nPlain line.\n".encode("latin-1"))
    with pytest.raises(CorpusError) as error:
        read_corpus(path)
    assert str(error.value) == (f"{path}: 2 of 3 lines are not valid UTF-8, so it is not a UTF-8 text file; "
                                "convert it (iconv -t UTF-8) or give the text corpus")


def test_one_bad_line_among_good_ones_is_that_line_s_problem_only(tmp_path):
    path = tmp_path / "mostly.txt"
    path.write_bytes(b"Good line one.\nGood line two.\nbad \xff byte\n")
    rows = read_corpus(path)
    assert [u.problem is None for u in rows] == [True, True, False]


def test_a_gzip_corpus_reads_as_its_text(tmp_path):
    import gzip
    text = "LJ001|Printing, in the only sense.\nLJ002|Hello there.\n"
    (tmp_path / "c.psv").write_text(text)
    (tmp_path / "c.psv.gz").write_bytes(gzip.compress(text.encode()))
    assert read_corpus(tmp_path / "c.psv.gz", "ljspeech") == read_corpus(tmp_path / "c.psv", "ljspeech")
    (tmp_path / "broken.gz").write_bytes(gzip.compress(text.encode())[:20])
    with pytest.raises(CorpusError, match="broken.gz: a gzip file that cannot be read"):
        read_corpus(tmp_path / "broken.gz")


def test_texts_given_in_python_get_the_ids_and_problems_a_plain_corpus_file_of_them_gets(tmp_path):
    """Synthesizer.synthesize(texts) seeds each line by its id: the same ids
    as the file, so a text's audio is that line's WAV."""
    from tts_cli.corpus import utterances_from_texts
    texts = [f"Line {n}." for n in range(1, 1_001)] + ["", "   "]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{text}\n" for text in texts))
    assert utterances_from_texts(texts) == read_corpus(corpus, "plain")
    two = tmp_path / "two.txt"
    two.write_text("a\nb\n")
    assert [u.id for u in utterances_from_texts(["a", "b"])] == [u.id for u in read_corpus(two, "plain")]
    [one] = utterances_from_texts(["two\nlines"])
    assert (one.line, one.text, one.problem) == (1, "two\nlines", None), "one utterance per text"


def test_a_plain_lines_id_stays_as_the_corpus_grows_past_a_million_lines(tmp_path):
    """Its id keys its seed and names its file: a cron job's corpus that
    reaches line 1,000,000 must not make every earlier line again."""
    small = [u.id for u in read_corpus(write_corpus(tmp_path, b"Hi.\nHo.\n"))]
    big = read_corpus(write_corpus(tmp_path, b"x\n" * 1_000_000))
    assert [u.id for u in big[:2]] == small == ["000001", "000002"]
    assert (len(big), big[999_998].id, big[-1].id) == (1_000_000, "999999", "1000000")
    assert [u.id for u in utterances_from_texts(["Hi."] * 1_000_000)[-2:]] == ["999999", "1000000"]
