"""Read a text corpus into one utterance per physical line.

The rest of tts-batch relies on one promise from this module: the list it
returns has exactly one ``Utterance`` per physical line of the file, in file
order. A line that cannot be synthesized (empty, not UTF-8, no id) is not
dropped; it comes back with ``problem`` set, so the manifest can say why that
line has no audio instead of silently shifting every later line.

Problems that would make the *whole run* wrong (an unreadable file, two lines
that would write the same output file, an id that is not a safe file name)
raise ``CorpusError`` before any synthesis starts.

Supported formats:

* ``plain``    every line is text; the id is the zero-padded line number.
* ``ljspeech`` ``id|text[|more columns ignored]`` (LJSpeech ``metadata.csv``).
* ``tsv``      ``id<TAB>text[<TAB>more columns ignored]``.

``format_hint`` says when a plain corpus looks like one of the other two.
"""

from __future__ import annotations

import gzip
import os
import re
import sys
import zlib
from dataclasses import dataclass

from tts_cli.errors import option
from tts_cli.formats import CORPUS_FORMATS as FORMATS

# The corpus path that means standard input.
STDIN = "-"

# The id becomes an output file stem, so it must not contain path separators,
# must not start with '.' or '-' (hidden files, command-line options) and must
# stay well under file-name length limits once an extension is added.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_ID_LENGTH = 128
# A plain line's id is its number with at least this many digits: a line
# keeps its id (and its seed, and its file) however long the corpus grows.
_MIN_ID_WIDTH = 6

_UTF8_BOM = b"\xef\xbb\xbf"

# Problems that mean "nothing to say" rather than "something is wrong": the
# manifest marks such lines skipped, the others error.
EMPTY_LINE = "empty line"
EMPTY_TEXT = "empty text"
NOTHING_TO_SAY = (EMPTY_LINE, EMPTY_TEXT)
# A lone surrogate: what bytes decoded with surrogateescape leave in a str.
_SURROGATE = re.compile("[\ud800-\udfff]")

# Separator byte and how to name it in messages, per separated format.
# Splitting the raw bytes is safe for UTF-8: ASCII bytes never occur inside
# a multi-byte sequence, so a '|' or TAB byte is always a real separator.
_SEPARATORS = {
    "ljspeech": (b"|", "'|'", "id|text"),
    "tsv": (b"\t", "tab", "id<TAB>text"),
}

# A plain corpus whose lines mostly read id|text or id<TAB>text was likely
# meant for that format: as plain, every id would be spoken. "Mostly": this
# share of the lines with text, and at least this many; an id: a first field
# that is a safe id (_SAFE_ID), no longer than this.
_HINT_SHARE = 0.8
_HINT_MIN_LINES = 2
_HINT_MAX_ID_LENGTH = 64


@dataclass(frozen=True)
class Utterance:
    """One physical line of the corpus."""

    # 1-based physical line number in the corpus file.
    line: int
    # Output file stem; a placeholder ``line-<N>`` when the line has no readable id.
    id: str
    # The line's text as read, minus the line ending ('' when it could not be read).
    text: str
    # Why this line cannot be synthesized, or None when it can.
    problem: str | None = None


class CorpusError(ValueError):
    """The corpus cannot be used at all; the message is one line naming file (and line)."""


def read_corpus(path: str | os.PathLike, fmt: str = "plain") -> list[Utterance]:
    """Return one ``Utterance`` per physical line of ``path``, in file order.

    Raises ``ValueError`` for an unknown ``fmt`` and ``CorpusError`` when the
    file cannot be read or its ids are duplicated or unsafe as file names.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}; use one of: {', '.join(FORMATS)}")
    lines = _split_physical_lines(_text_bytes(_read_bytes(path), path))
    parsed = [_parse_line(raw, number, fmt) for number, raw in enumerate(lines, start=1)]
    if fmt != "plain":
        # Plain ids are distinct line numbers: safe and unique by construction.
        _check_ids(parsed, path)
    return [utterance for utterance, _ in parsed]


def utterances_from_texts(texts: list[str]) -> list[Utterance]:
    """What ``read_corpus`` gives for a plain corpus whose lines are
    ``texts`` (the same ids, so the same seeds), one utterance per text
    whatever line breaks it holds."""
    return [_given_text(n, _line_number(n), text) for n, text in enumerate(texts, start=1)]


def _given_text(line: int, line_id: str, text: str) -> Utterance:
    """A text given as a string, as a plain corpus's line: one with a lone
    surrogate (a file name or bytes decoded with ``surrogateescape``) is not
    text, as a line that is not UTF-8 is not; its row shows it with the
    surrogate escaped (``\\udcff``)."""
    if (bad := _SURROGATE.search(text)) is not None:
        return Utterance(line=line, id=line_id, text=text.encode("utf-8", "backslashreplace").decode(),
                         problem=f"text is not valid Unicode (a lone surrogate, U+{ord(bad.group()):04X}, at "
                                 f"character {bad.start() + 1}); decode its bytes as UTF-8 (errors='replace')")
    return Utterance(line=line, id=line_id, text=text, problem=None if text.strip() else EMPTY_LINE)


def format_hint(path: str | os.PathLike, utterances: list[Utterance], fmt: str) -> str | None:
    """One line suggesting the format ljspeech or tsv for a plain corpus whose
    lines mostly start with an id and that format's separator; else None.
    The caller shows it: the corpus may be right as it is."""
    if fmt != "plain":
        return None
    texts = [u.text for u in utterances if u.problem is None]
    for name, (separator, _, layout) in _SEPARATORS.items():
        with_ids = sum(1 for text in texts if _starts_with_id(text, separator.decode()))
        if with_ids >= max(_HINT_MIN_LINES, _HINT_SHARE * len(texts)):
            return (f"{corpus_name(path)}: {with_ids} of its {len(texts)} lines with text look like '{layout}', but "
                    f"{option('format', 'plain')} speaks each whole line; pass {option('format', name)} if those "
                    "are ids")
    return None


def _starts_with_id(text: str, separator: str) -> bool:
    line_id, found, rest = text.partition(separator)
    return (bool(found) and len(line_id) <= _HINT_MAX_ID_LENGTH and _SAFE_ID.fullmatch(line_id) is not None
            and bool(rest.strip()))


def _split_physical_lines(data: bytes) -> list[bytes]:
    """Split file contents into physical lines without their line endings.

    A UTF-8 BOM starting a line is dropped: the file's, or that of a file
    after the first where several were joined (``cat *.tsv | tts-batch -``).
    LF, CRLF and lone CR all end a line, and a final line ending does not
    start an extra empty line. Splitting happens on bytes, before decoding,
    so characters such as U+2028 or NEL that ``str.splitlines`` would treat
    as line breaks stay inside their line, and a line that is not valid
    UTF-8 cannot disturb its neighbours.
    """
    if data.startswith(_UTF8_BOM):   # the file's (one holding only a BOM has no line)
        data = data[len(_UTF8_BOM):]
    # bytes.splitlines breaks on exactly \n, \r\n and \r, and never yields a
    # trailing empty element for a file that ends with a line ending.
    lines = data.splitlines()
    if _UTF8_BOM in data:
        lines = [line[len(_UTF8_BOM):] if line.startswith(_UTF8_BOM) else line for line in lines]
    return lines


def corpus_name(path: str | os.PathLike) -> str:
    """How messages name the corpus."""
    return "<stdin>" if os.fspath(path) == STDIN else os.fspath(path)


_GZIP_MAGIC = b"\x1f\x8b"
# A corpus is refused as not text when more than this share of its
# non-blank lines is not valid UTF-8 (a binary, an audio file, another encoding).
_MOST_UNDECODABLE = 0.5


def _text_bytes(data: bytes, path: str | os.PathLike) -> bytes:
    """The corpus's text: a gzip file (by its magic bytes, as cron feeds
    often are) decompressed; one line refusing what is not text, before any
    model loads (a binary's lines would be synthesized as noise)."""
    name = corpus_name(path)
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise CorpusError(f"{name}: a gzip file that cannot be read ({e}); check the file") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise CorpusError(f"{name}: not a text file (a NUL byte at byte {nul + 1}); give a UTF-8 text corpus, "
                          "one line per utterance")
    if not _undecodable(data):   # the usual corpus: one pass, no line to count
        return data
    lines = [line for line in _split_physical_lines(data) if line.strip()]
    bad = sum(1 for line in lines if _undecodable(line))
    if bad > _MOST_UNDECODABLE * len(lines):
        raise CorpusError(f"{name}: {bad} of {len(lines)} lines are not valid UTF-8, so it is not a UTF-8 text "
                          "file; convert it (iconv -t UTF-8) or give the text corpus")
    return data


def _undecodable(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _read_bytes(path: str | os.PathLike) -> bytes:
    """Read the whole corpus file, turning OS errors into one-line CorpusErrors."""
    try:
        if os.fspath(path) == STDIN:
            return sys.stdin.buffer.read()
        with open(path, "rb") as corpus_file:
            return corpus_file.read()
    except FileNotFoundError:
        raise CorpusError(f"{corpus_name(path)}: no such file; check the corpus path") from None
    except IsADirectoryError:
        raise CorpusError(f"{corpus_name(path)}: is a directory; pass the corpus text file itself") from None
    except PermissionError:
        raise CorpusError(f"{corpus_name(path)}: permission denied; make the file readable") from None
    except OSError as error:
        raise CorpusError(f"{corpus_name(path)}: cannot read ({error.strerror or error}); check the file") from None


def _line_number(line: int) -> str:
    """``000042``: a line's number as an id, at least _MIN_ID_WIDTH digits."""
    return f"{line:0{_MIN_ID_WIDTH}d}"


def _placeholder_id(line: int) -> str:
    """Id for a line whose own id cannot be read, so every manifest row has one."""
    return f"line-{_line_number(line)}"


def _decode(raw: bytes, column_offset: int) -> tuple[str, str | None]:
    """Decode UTF-8 bytes; on failure return ('', problem) pointing at the bad byte.

    ``column_offset`` is where ``raw`` starts within its line, so the column
    in the message is the byte column in the line, not in the field.
    """
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as error:
        bad_byte = raw[error.start]
        column = column_offset + error.start + 1
        return "", f"line is not valid UTF-8 (byte 0x{bad_byte:02x} at column {column}); save the corpus as UTF-8"


def _is_blank(raw: bytes) -> bool:
    """True for a line that is empty or whitespace only (Unicode whitespace too)."""
    text, problem = _decode(raw, 0)
    return problem is None and not text.strip()


def _parse_line(raw: bytes, line: int, fmt: str) -> tuple[Utterance, bool]:
    """Parse one physical line; the flag says whether the id is a placeholder."""
    if fmt == "plain":
        return _parse_plain_line(raw, line), False
    return _parse_separated_line(raw, line, fmt)


def _parse_plain_line(raw: bytes, line: int) -> Utterance:
    """A plain line is all text; its id is the zero-padded line number."""
    line_id = _line_number(line)
    text, problem = _decode(raw, 0)
    if problem is None and not text.strip():
        problem = EMPTY_LINE
    return Utterance(line=line, id=line_id, text=text, problem=problem)


def _parse_separated_line(raw: bytes, line: int, fmt: str) -> tuple[Utterance, bool]:
    """Parse ``id<sep>text[<sep>ignored...]``; unreadable ids get a placeholder."""
    separator, separator_name, layout = _SEPARATORS[fmt]
    placeholder = _placeholder_id(line)

    if _is_blank(raw):
        return Utterance(line, placeholder, "", EMPTY_LINE), True

    id_bytes, found, rest = raw.partition(separator)
    if not found:
        # Keep the line's text so the manifest shows what was there.
        text, problem = _decode(raw, 0)
        problem = problem or f"no {separator_name} separator; expected '{layout}'"
        return Utterance(line, placeholder, text, problem), True

    # Columns after the text are ignored, so they are never decoded either:
    # a broken third column must not stop a good line from being synthesized.
    text_bytes = rest.partition(separator)[0]
    text_offset = len(id_bytes) + len(separator)
    line_id, id_problem = _decode(id_bytes, 0)
    text, text_problem = _decode(text_bytes, text_offset)

    if id_problem is not None:
        return Utterance(line, placeholder, text, id_problem), True
    if not line_id.strip():
        return Utterance(line, placeholder, text, f"empty id before the {separator_name} separator"), True
    if text_problem is not None:
        return Utterance(line, line_id, "", text_problem), False
    if not text.strip():
        return Utterance(line, line_id, text, EMPTY_TEXT), False
    return Utterance(line, line_id, text), False


def _check_ids(parsed: list[tuple[Utterance, bool]], path: str | os.PathLike) -> None:
    """Raise CorpusError at the first unsafe or clashing id, in file order.

    Ids are compared ignoring case: on case-insensitive file systems (macOS,
    Windows) 'LJ001' and 'lj001' would write the same file and one would
    silently overwrite the other.
    """
    name = corpus_name(path)
    first_seen: dict[str, tuple[Utterance, bool]] = {}
    for utterance, is_placeholder in parsed:
        if not is_placeholder:
            _check_safe_id(utterance, name)
        key = utterance.id.casefold()
        if key in first_seen:
            earlier, earlier_is_placeholder = first_seen[key]
            raise CorpusError(_clash_message(name, earlier, earlier_is_placeholder, utterance, is_placeholder))
        first_seen[key] = (utterance, is_placeholder)


def _check_safe_id(utterance: Utterance, name: str) -> None:
    """Raise CorpusError unless the id can be used as a file stem as is."""
    if len(utterance.id) > _MAX_ID_LENGTH:
        raise CorpusError(
            f"{name}:{utterance.line}: id {utterance.id[:40]!r}... is {len(utterance.id)} characters long; "
            f"use at most {_MAX_ID_LENGTH}"
        )
    if not _SAFE_ID.fullmatch(utterance.id):
        raise CorpusError(
            f"{name}:{utterance.line}: id {utterance.id!r} is not a safe file name "
            "(use letters, digits, '.', '_' and '-', starting with a letter or digit)"
        )


def _clash_message(name: str, earlier: Utterance, earlier_is_placeholder: bool,
                   later: Utterance, later_is_placeholder: bool) -> str:
    """One-line message for two lines that would write the same output file."""
    if earlier_is_placeholder or later_is_placeholder:
        # Point at the line whose id was actually written in the corpus.
        real, placeholder = (later, earlier) if earlier_is_placeholder else (earlier, later)
        return (
            f"{name}:{real.line}: id {real.id!r} is the placeholder id of line {placeholder.line}, "
            "which has no readable id; rename it"
        )
    if earlier.id != later.id:
        return (
            f"{name}:{later.line}: id {later.id!r} differs only in case from {earlier.id!r} on line "
            f"{earlier.line}; ids must be unique ignoring case"
        )
    return f"{name}:{later.line}: duplicate id {later.id!r} (first on line {earlier.line}); ids must be unique"
