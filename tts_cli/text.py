"""Text front end: turn English text into the symbol ids Tacotron2 was trained on.

The published NVIDIA Tacotron2 checkpoint learned one embedding per symbol id,
and it only ever saw text that went through one particular cleaning pipeline
("english_cleaners"). Any drift here -- a different id order, a number read
differently, a character kept that used to be dropped -- changes what the
model hears, so this module mirrors that front end rule for rule, including
its odd corners (see the tests, which pin each of them down).

Pipeline for plain text, in this order:

1. transliterate to ASCII (Unidecode): "é" -> "e", "—" -> "--", "£" -> "PS";
2. lowercase;
3. spell out numbers (money, decimals, ordinals, years, plain integers);
4. spell out a fixed list of abbreviations that end in a period;
5. collapse each run of whitespace into a single space (no strip).

Text may embed ARPAbet inside curly braces, ``"Turn left on {HH AW1 S} St."``;
the brace contents bypass cleaning and map to ``@``-prefixed phone symbols.
Characters with no symbol are dropped (``read`` names them), and no
end-of-sequence id is appended.

That is the "reference" normalization, these functions' default. The
"extended" one (a run's default, ``--text-normalization``) first writes out
what the reference drops or mangles, such as "12%" or "7:30"
(spoken_forms.py), then cleans the same way.

Pure Python: importing this module does no file I/O and does not import
inflect; the number speller is created on first use and then reused.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, Sequence

from unidecode import unidecode

from tts_cli.formats import NORMALIZATIONS
from tts_cli.spoken_forms import spoken_forms

__all__ = ["SYMBOLS", "PAD_ID", "NORMALIZATIONS", "Reading", "UnsupportedTextError", "clean_text", "expand_numbers",
           "spoken_forms", "spoken", "read", "text_to_sequence", "sequence_to_text", "normalize", "foreign_letters",
           "words_lost", "is_speakable"]


# --------------------------------------------------------------------------
# Symbol table
# --------------------------------------------------------------------------

# The 84 CMUdict phones in the order the checkpoint's embedding table uses.
# Each stress variant is its own symbol, so order here is id order.
_ARPABET_PHONES = (
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 "
    "AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 "
    "B CH D DH EH EH0 EH1 EH2 ER ER0 ER1 ER2 "
    "EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 "
    "JH K L M N NG OW OW0 OW1 OW2 OY OY0 OY1 OY2 "
    "P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 "
    "V W Y Z ZH"
).split()

_PAD = "_"
_HYPHEN = "-"
_PUNCTUATION = "!'(),.:;? "
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"

# Phones get an "@" prefix so that e.g. the phone "B" and the letter "B"
# stay distinct symbols.
_PHONE_PREFIX = "@"

SYMBOLS: tuple[str, ...] = (
    (_PAD, _HYPHEN)
    + tuple(_PUNCTUATION)
    + tuple(_UPPER)
    + tuple(_LOWER)
    + tuple(_PHONE_PREFIX + phone for phone in _ARPABET_PHONES)
)
PAD_ID: int = 0

_SYMBOL_TO_ID = {symbol: index for index, symbol in enumerate(SYMBOLS)}
# A dict rather than tuple indexing so that out-of-range ids (including
# negative ones, which would wrap around a tuple) are skipped, not misread.
_ID_TO_SYMBOL = dict(enumerate(SYMBOLS))
# How each id reads in the manifest: a phone in braces, anything else as itself.
_RENDERED = {i: "{" + s[1:] + "}" if len(s) > 1 and s.startswith(_PHONE_PREFIX) else s
             for i, s in _ID_TO_SYMBOL.items()}

# Ids that carry sound: letters of either case and every phone. Pad,
# hyphen, punctuation and space only shape prosody.
_SPEAKABLE_IDS = frozenset(
    _SYMBOL_TO_ID[symbol]
    for symbol in SYMBOLS
    if symbol.isalpha() or symbol.startswith(_PHONE_PREFIX)
)


class UnsupportedTextError(ValueError):
    """Raised for text the reference front end cannot process at all.

    The reference crashes (IndexError, inflect's NumOutOfRangeError, or a
    ValueError from int()) on integers of 10**36 or more and on dollar
    amounts with a stray comma such as "$,5". There is no reference output to
    match, so we fail with one clear, catchable error instead.
    """


# --------------------------------------------------------------------------
# Number spelling
# --------------------------------------------------------------------------

# inflect has words only up to the decillions; anything from 10**36 up makes
# it raise, so we refuse such numbers ourselves with a readable message (this
# also keeps int() away from Python's 4300-digit conversion limit).
_MAX_DIGITS = 36


@functools.cache
def _number_speller():
    """The one shared inflect engine, created on first use."""
    return _import_inflect().engine()


def _import_inflect():
    """inflect, imported without typeguard's instrumentation. inflect 7 wraps
    its engine's methods in ``typeguard.typechecked``, which re-parses and
    recompiles inflect's source on every import to add argument checks: 2 s
    of a run's start (4 s where no bytecode is cached), against 0.1 s
    without. The checks only reject arguments of the wrong type, and
    ``_words`` passes plain ints, so the words are the same."""
    try:
        import typeguard
    except ImportError:   # inflect 6 does not use typeguard
        import inflect
        return inflect
    checked = typeguard.typechecked
    typeguard.typechecked = _unchecked
    try:
        import inflect
    finally:
        typeguard.typechecked = checked
    return inflect


def _unchecked(target=None, **_options):
    """``typeguard.typechecked`` that leaves its target as it is."""
    return target if target is not None else (lambda later: later)


def _checked_int(digits: str) -> int:
    """int() of an ASCII digit string, refusing numbers inflect cannot read."""
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        raise UnsupportedTextError(
            f"number too large to read aloud: {digits[:20]}... "
            f"({len(digits)} digits)"
        )
    return int(digits)


def _words(number: int, **options) -> str:
    # Always pass a real int: current inflect type-checks its arguments.
    return _number_speller().number_to_words(int(number), **options)


# A digit run containing commas: "1,000,000". Also matches runs without any
# comma, which is harmless; it deliberately swallows lists like "1,2,3" too.
_GROUPED_NUMBER = re.compile(r"[0-9][0-9,]+[0-9]")
# Only reachable through expand_numbers(): clean_text() transliterates first,
# and Unidecode has already turned "£" into "PS" by the time numbers run.
_POUNDS = re.compile(r"£([0-9,]*[0-9]+)")
_DOLLARS = re.compile(r"\$([0-9.,]*[0-9]+)")
_DECIMAL = re.compile(r"[0-9]+\.[0-9]+")
# No word boundary on either side: "1stop" reads as "firstop".
_ORDINAL = re.compile(r"[0-9]+(?:st|nd|rd|th)")
_INTEGER = re.compile(r"[0-9]+")


def _drop_commas(match: re.Match) -> str:
    return match.group(0).replace(",", "")


def _pounds(match: re.Match) -> str:
    return match.group(1) + " pounds"


def _unit(count: int, singular: str) -> str:
    return f"{count} {singular}" if count == 1 else f"{count} {singular}s"


def _amount_part(part: str, amount: str) -> int:
    if part == "":
        return 0
    if not part.isdigit():
        # Only a comma can get here ("$,5"); the reference dies in int().
        raise UnsupportedTextError(f"cannot read dollar amount ${amount!r}")
    return _checked_int(part)


def _dollars(match: re.Match) -> str:
    """"$3.50" -> "3 dollars, 50 cents"; the digits are spelled out later.

    Cents are the integer after the point, not a fraction: "$0.5" is
    "5 cents". Anything with two or more points is left as digits.
    """
    amount = match.group(1)
    parts = amount.split(".")
    if len(parts) > 2:
        return amount + " dollars"
    dollars = _amount_part(parts[0], amount)
    cents = _amount_part(parts[1], amount) if len(parts) == 2 else 0
    if dollars and cents:
        return _unit(dollars, "dollar") + ", " + _unit(cents, "cent")
    if dollars:
        return _unit(dollars, "dollar")
    if cents:
        return _unit(cents, "cent")
    return "zero dollars"


def _decimal(match: re.Match) -> str:
    # The fraction is later read as a whole number: "3.14" -> "three point
    # fourteen", and "3.05" -> "three point five".
    return match.group(0).replace(".", " point ")


def _ordinal(match: re.Match) -> str:
    text = match.group(0)
    _checked_int(text[:-2])
    # inflect reads the suffix itself and keeps its default "and":
    # "104th" -> "one hundred and fourth". The suffix letters are not
    # checked against the digits, so "2th" is "second".
    return _number_speller().number_to_words(text)


def _year_like(number: int) -> str:
    """Read 1001..2999 the way years are said aloud."""
    if number == 2000:
        return "two thousand"
    if 2000 < number < 2010:
        return "two thousand " + _words(number % 100)
    if number % 100 == 0:
        return _words(number // 100) + " hundred"
    # Pairs of digits: 1995 -> "nineteen, ninety-five" -> drop the comma.
    paired = _words(number, andword="", zero="oh", group=2)
    return paired.replace(", ", " ")


def _integer(match: re.Match) -> str:
    number = _checked_int(match.group(0))
    if 1000 < number < 3000:
        return _year_like(number)
    # Commas between thousands groups stay: they become short pauses.
    return _words(number, andword="")


# Order matters: commas go before money so "$1,000" is one amount, money
# before decimals so cents are not read as "point", and ordinals before
# plain integers so the suffix is still attached when they are matched.
_NUMBER_RULES: tuple[tuple[re.Pattern, Callable[[re.Match], str]], ...] = (
    (_GROUPED_NUMBER, _drop_commas),
    (_POUNDS, _pounds),
    (_DOLLARS, _dollars),
    (_DECIMAL, _decimal),
    (_ORDINAL, _ordinal),
    (_INTEGER, _integer),
)


def expand_numbers(text: str) -> str:
    """Spell out every digit run in lowercase ASCII text (reference rules)."""
    for pattern, spell in _NUMBER_RULES:
        text = pattern.sub(spell, text)
    return text


# --------------------------------------------------------------------------
# Abbreviations
# --------------------------------------------------------------------------

_ABBREVIATIONS = (
    ("mrs", "misess"),
    ("mr", "mister"),
    ("dr", "doctor"),
    ("st", "saint"),
    ("co", "company"),
    ("jr", "junior"),
    ("maj", "major"),
    ("gen", "general"),
    ("drs", "doctors"),
    ("rev", "reverend"),
    ("lt", "lieutenant"),
    ("hon", "honorable"),
    ("sgt", "sergeant"),
    ("capt", "captain"),
    ("esq", "esquire"),
    ("ltd", "limited"),
    ("col", "colonel"),
    ("ft", "fort"),
)

# One pattern per abbreviation, applied one after another. A single combined
# alternation would not be equivalent: an earlier expansion can glue onto the
# next word and hide its word boundary ("mr.co." -> "misterco.").
_ABBREVIATION_RULES = tuple(
    (re.compile(r"\b" + short + r"\.", re.IGNORECASE), long)
    for short, long in _ABBREVIATIONS
)


# Whether any rule applies at all: most lines have no abbreviation, and one
# search is cheaper than a pass per rule. A rule can only match where the
# text changed or matched before, so a line none matches stays as it is.
_ANY_ABBREVIATION = re.compile(r"\b(?:" + "|".join(short for short, _ in _ABBREVIATIONS) + r")\.",
                               re.IGNORECASE)


def _expand_abbreviations(text: str) -> str:
    # The period is consumed, so a sentence ending in "St." loses its stop.
    if not _ANY_ABBREVIATION.search(text):
        return text
    for pattern, replacement in _ABBREVIATION_RULES:
        text = pattern.sub(replacement, text)
    return text


# --------------------------------------------------------------------------
# Cleaning and id mapping
# --------------------------------------------------------------------------

_WHITESPACE_RUN = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Apply the reference "english_cleaners" to text without braces.

    The result may still contain characters outside the symbol table (such as
    "#" or "/"); they are dropped when mapping to ids, not here.
    """
    text = unidecode(text)
    text = text.lower()
    text = expand_numbers(text)
    text = _expand_abbreviations(text)
    return _WHITESPACE_RUN.sub(" ", text)


# Text before the first "{...}", the braces' contents, and everything after.
# "." stops at a newline, exactly like the reference: a newline before a
# brace hides the braces (they are then cleaned as ordinary text), and
# anything after the first newline that follows a brace pair is discarded.
_BRACED_PHONES = re.compile(r"(?P<before>.*?)\{(?P<phones>.+?)\}(?P<after>.*)")


def _read_plain(text: str, normalization: str) -> tuple[list[int], str]:
    """Ids for text without braces, and the characters it left unsaid."""
    said = spoken_forms(text) if normalization == "extended" else text
    cleaned = clean_text(said)
    # "_" is padding, never content, even if the text contains one.
    ids = [i for i in map(_SYMBOL_TO_ID.get, cleaned) if i is not None and i != PAD_ID]
    if len(ids) == len(cleaned) and said.isascii():   # every character became a symbol or a word
        return ids, ""
    return ids, _unsaid(said, cleaned)


def _unsaid(said: str, cleaned: str) -> str:
    """The characters of ``said`` that leave nothing in ``cleaned`` that has
    a symbol, once each: ASCII ones the cleaners kept and the table lacks
    ("#", "%": they are still in ``cleaned``), and others whose
    transliteration has neither a symbol nor a digit (an emoji, "«").
    Spaces, combining accents and format characters are not counted."""
    unsaid: dict[str, None] = {}
    for char in dict.fromkeys(said):
        if char.isascii():
            lost = (char.lower() not in _SYMBOL_TO_ID or char == _PAD) and char in cleaned
        else:
            lost = (not char.isspace() and unicodedata.category(char)[0] not in "MC"
                    and not any(c in _SYMBOL_TO_ID and c != _PAD or c.isdigit() for c in unidecode(char).lower()))
        if lost:
            unsaid[char] = None
    return "".join(unsaid)


def _phone_ids(phones: str) -> tuple[list[int], list[str]]:
    """The ids of the phones in a brace pair, and what it held that is no
    phone: contents are case-sensitive and uncleaned, so unknown phones,
    lowercase ones and stray punctuation are all dropped, as the reference drops them."""
    found = [(phone, _SYMBOL_TO_ID.get(_PHONE_PREFIX + phone)) for phone in phones.split()]
    return [i for _, i in found if i is not None], [phone for phone, i in found if i is None]


@dataclass(frozen=True)
class Reading:
    """What the front end makes of a line."""
    ids: list[int]      # symbol ids: what the model reads
    text: str           # the ids as text, phones in braces: the manifest's normalized_text
    dropped: str        # characters outside braces it left unsaid, once each, in order ("" for none)
    unknown_phones: str = ""   # what braces held that is no ARPAbet phone (left out), once each, space-separated


def read(text: str, normalization: str = "reference") -> Reading:
    """Text (optionally with ``{ARPAbet}`` spans) as the model reads it,
    by the rules of ``normalization`` (one of NORMALIZATIONS; a run's
    comes from its settings, ``text_normalization``)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"text normalization must be one of {', '.join(NORMALIZATIONS)}, not {normalization!r}")
    ids: list[int] = []
    dropped: dict[str, None] = {}
    unknown: dict[str, None] = {}
    for plain, phones in _segments(text):
        plain_ids, unsaid = _read_plain(plain, normalization)
        phone_ids, not_phones = _phone_ids(phones or "")
        ids += plain_ids + phone_ids
        dropped.update(dict.fromkeys(unsaid))
        unknown.update(dict.fromkeys(not_phones))
    return Reading(ids, sequence_to_text(ids), "".join(dropped), " ".join(unknown))


def _segments(text: str):
    """(text before a brace pair, its phones), ..., (the rest, None), as
    the reference finds them (_BRACED_PHONES)."""
    while text:
        match = _BRACED_PHONES.match(text)
        if match is None:
            yield text, None
            return
        yield match["before"], match["phones"]
        text = match["after"]


def spoken(text: str, normalization: str) -> str:
    """``text`` with what ``normalization`` writes out before cleaning
    already written (the extended one's spoken forms, outside braces, as
    ``read`` finds them): read by the reference's rules it gives the ids
    ``read(text, normalization)`` gives. A long line is cut on this text,
    so that no cut parts a spoken form ("$3.5 million", "14:25 Dec. 24")."""
    if normalization == "reference":
        return text
    return "".join(spoken_forms(plain) + (f"{{{phones}}}" if phones is not None else "")
                   for plain, phones in _segments(text))


def text_to_sequence(text: str, normalization: str = "reference") -> list[int]:
    """Map text (optionally with ``{ARPAbet}`` spans) to symbol ids; by
    default exactly as NVIDIA's ``text_to_sequence(text, ["english_cleaners"])``."""
    return read(text, normalization).ids


def sequence_to_text(ids: Sequence[int]) -> str:
    """Render ids as text; phones come back in braces, adjacent ones merged.

    Ids outside the table are skipped. The pad id renders as "_".
    """
    return "".join([_RENDERED[i] for i in ids if i in _RENDERED]).replace("}{", " ")


def foreign_letters(text: str) -> str:
    """The letters of ``text`` that are not of the Latin script, once each,
    in order: the front end reads them through their ASCII transliteration
    (日本語 as "ri ben yu"), which is not what the text says. A Latin letter's
    other forms (full-width Ｆ, mathematical 𝐅) are Latin."""
    if text.isascii():
        return ""
    seen: dict[str, None] = {}
    for char in text:
        latin = unicodedata.normalize("NFKC", char)[:1]
        if unicodedata.category(char).startswith("L") and not (latin.isascii() or
                                                                unicodedata.name(latin, "").startswith("LATIN")):
            seen[char] = None
    return "".join(seen)


# ASCII marks that stand for a word, whose loss changes what a line says.
_WORD_MARKS = frozenset("#$%&+=@")


def words_lost(dropped: str) -> str:
    """Those of ``dropped`` (``Reading.dropped``) that stand for something
    said: letters, digits and symbols ("%", "&", "@", an emoji); not the
    marks a reader passes over in silence (quotes, brackets, "*", "/",
    other punctuation)."""
    return "".join(c for c in dropped
                   if c in _WORD_MARKS or not c.isascii() and unicodedata.category(c)[0] in "LNS")


def normalize(text: str, normalization: str = "reference") -> tuple[list[int], str]:
    """Ids for ``text`` and their readable form, as shown in the manifest."""
    reading = read(text, normalization)
    return reading.ids, reading.text


def is_speakable(ids: Sequence[int]) -> bool:
    """True if any id is a letter or a phone, i.e. there is something to say.

    Punctuation, spaces and padding alone make the model babble or stall.
    """
    return any(symbol_id in _SPEAKABLE_IDS for symbol_id in ids)
