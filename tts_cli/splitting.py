"""Cut a long line into pieces the model speaks well.

Tacotron2's attention was trained on LJSpeech clips of at most ~10 s (about
190 characters); on longer inputs it starts to skip, repeat or mumble, and
long lines also run into the decoder step limit. A line whose normalized text
is longer than the limit is therefore cut, at the gentlest boundary that
works: sentence ends first, then clause punctuation (, ; :), then spaces
between words, and in a script written without spaces (Chinese, Japanese,
Thai, ...) between its characters. Ideographs' full stops and commas (。，、)
end sentences and clauses as ``.`` and ``,`` do. Pieces are packed
greedily, so a line is cut as few times as the limit allows. The pipeline synthesizes each piece as its own job and
joins the audio with a short pause.

Lengths are counted in normalized symbols (what the model reads), not in raw
characters: "$3.50" is five characters but 29 symbols. Cutting happens on the
text as the normalization writes it out before cleaning (text.spoken: the
extended one's spoken forms already said), so each piece is cleaned on its
own as the reference would and no cut parts a spoken form.
``{ARPAbet}`` spans are never cut, nor is a sentence after a title ("Mr.").
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

# Ends of sentences: terminal punctuation, closing quotes or brackets, then
# space; an ideographic full stop (or a closing bracket after it) needs none.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+|(?<=[。！？．])(?![」』）])\s*|(?<=[。！？．][」』）])\s*")
# A title whose period ends no sentence ("Mr. Smith"): no cut after it.
_TITLE = re.compile(r"(?:^|\s)(?:mrs?|ms|drs?|rev|lt|hon|sgt|capt|maj|gen|col|st)\.$", re.IGNORECASE)
# Clause boundaries: a comma, semicolon or colon followed by space; an
# ideographic one with or without.
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+|(?<=[，、；：])\s*")
# Words; a braced ARPAbet span counts as one word so phones stay together.
_WORD = re.compile(r"\{[^}]*\}?|\S+")
# Letters of the scripts written without spaces between words: CJK
# ideographs, kana, Thai, Lao, Khmer, Myanmar. A "word" of them too long
# for a piece is cut between its characters, which are joined with nothing.
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
                       "\uf900-\ufaff\uff66-\uff9f]")


def split_text(text: str, max_symbols: int, length: Callable[[str], int]) -> list[str]:
    """``text`` cut into pieces of at most ``max_symbols`` by ``length``.

    ``length`` counts a piece's normalized symbols. A single word longer than
    the limit stays whole (it cannot be cut anywhere sensible). Returns
    ``[text]`` when no cut is needed.
    """
    if max_symbols <= 0:
        return [text]
    levels = [(_sentences, " "), (lambda t: _parts(t, _CLAUSE_END), " "), (_WORD.findall, " "), (_characters, "")]
    return _cut(text.strip(), levels, max_symbols, length) or [text]


def _cut(text: str, levels: list, max_symbols: int, length: Callable[[str], int]) -> list[str]:
    """Cut ``text`` at the first level's boundaries, packing neighbours that fit
    together (joined as that level joins them); a part still too long is cut
    at the next level on its own, so a fragment of a long sentence is never
    glued onto the next sentence."""
    if length(text) <= max_symbols or not levels:
        return [text]
    (split, joiner), deeper = levels[0], levels[1:]
    pieces: list[str] = []
    fitting: list[str] = []
    for part in split(text):
        if length(part) <= max_symbols:
            fitting.append(part)
            continue
        pieces += _pack(fitting, max_symbols, length, joiner) + _cut(part, deeper, max_symbols, length)
        fitting = []
    return pieces + _pack(fitting, max_symbols, length, joiner)


def _characters(word: str) -> list[str]:
    """A word of a script written without spaces, as its characters (each
    ideograph or letter with the marks after it); any other word whole."""
    if word.startswith("{") or not _UNSPACED.search(word):
        return [word]
    letters: list[str] = []
    for character in word:
        if letters and unicodedata.category(character).startswith("M"):   # a vowel sign or tone mark stays on
            letters[-1] += character
        else:
            letters.append(character)
    return letters


def _sentences(text: str) -> list[str]:
    """``text``'s sentences; a title's period ends none."""
    sentences: list[str] = []
    for part in _parts(text, _SENTENCE_END):
        if sentences and _TITLE.search(sentences[-1]):
            sentences[-1] = f"{sentences[-1]} {part}"
        else:
            sentences.append(part)
    return sentences


def _parts(text: str, boundary: re.Pattern) -> list[str]:
    """Split after each boundary, dropping the whitespace there; no empty parts."""
    return [part.strip() for part in boundary.split(text) if part.strip()]


def _pack(parts: list[str], max_symbols: int, length: Callable[[str], int], joiner: str = " ") -> list[str]:
    """Join neighbouring parts (with ``joiner``) while they stay within the limit."""
    packed: list[str] = []
    for part in parts:
        if packed and length(f"{packed[-1]}{joiner}{part}") <= max_symbols:
            packed[-1] = f"{packed[-1]}{joiner}{part}"
        else:
            packed.append(part)
    return packed
