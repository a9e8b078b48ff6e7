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
(``spoken_forms``), then cleans the same way.

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

__all__ = [
    "SYMBOLS",
    "PAD_ID",
    "NORMALIZATIONS",
    "Reading",
    "UnsupportedTextError",
    "clean_text",
    "expand_numbers",
    "spoken_forms",
    "read",
    "text_to_sequence",
    "sequence_to_text",
    "normalize",
    "foreign_letters",
    "words_lost",
    "is_speakable",
]


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
# Spoken forms (the extended normalization)
# --------------------------------------------------------------------------

# How a run reads its text: "reference" is NVIDIA's english_cleaners exactly
# (parity with the published voice); "extended" first writes out, in words,
# what those cleaners drop or mangle (spoken_forms), then cleans alike.
NORMALIZATIONS = ("reference", "extended")

# The rules below act on the raw line, before transliteration, and leave
# digits as digits: every number is then read by the reference's rules
# above, the same way wherever it stands ("7:05" -> "7 oh 5" -> "seven oh
# five"; "March 3" -> "March 3rd" -> "march third").


def _stop_kept(match: re.Match, stop: str) -> str:
    """The period an abbreviation took ("p.m.", "ft.", "Jan."), put back
    when it also ends the sentence: at the end of the text, or before a
    capital."""
    if not stop:
        return ""
    rest = match.string[match.end():]
    return "." if not rest.strip() or re.match(r"\s+[A-Z\"'(]", rest) else ""


# E-mail and web addresses. A web address starts with a scheme or "www.", or
# is a bare domain under a common top-level domain ("example.com"); it ends
# before a space, and trailing punctuation is the sentence's.
_ADDRESS_END = r"[^\s<>\"'.,;:!?)\]}]"
_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"']*" + _ADDRESS_END, re.IGNORECASE)
_EMAIL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_TOP_LEVEL_DOMAINS = r"\.(?:com|org|net|edu|gov|io|info|uk|de|eu)\b"
_DOMAIN = re.compile(r"(?<![\w@./-])[A-Za-z0-9][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*" + _TOP_LEVEL_DOMAINS
                     + r"(?![.-]?\w)(?:/[^\s<>\"']*" + _ADDRESS_END + ")?")
_SCHEME = re.compile(r"^(?:[a-z]+://)?(?:www\.)?", re.IGNORECASE)
_ADDRESS_PARTS = re.compile(r"[A-Za-z]+|[0-9]+|[@./+]")
_ADDRESS_MARKS = {"@": "at", ".": "dot", "/": "slash", "+": "plus"}


def _address(match: re.Match) -> str:
    """An address as it is read out: "info@example.com" -> "info at example
    dot com", "https://example.org/a-b" -> "example dot org slash a b". The
    scheme, "www." and a trailing slash are not said; "@", ".", "/" and "+"
    are; other marks (- _ ? = & # % ~) only part the words; letters and
    digits are apart ("web2" -> "web 2")."""
    address = _SCHEME.sub("", match[0]).rstrip("/")
    return " ".join(_ADDRESS_MARKS.get(part, part) for part in _ADDRESS_PARTS.findall(address))


# Times: H:MM (0-24 : 00-59, not part of H:MM:SS), then "am", "pm", "a.m."
# or "p.m." if given; an hour alone with am/pm too ("7pm").
_HALF_DAY = r"(?:\s?([AaPp])\.?[Mm](\.?)(?![A-Za-z]))"
_TIME = re.compile(r"(?<![\d:.])([01]?[0-9]|2[0-4]):([0-5][0-9])(?![\d:])" + _HALF_DAY + "?")
_HOUR = re.compile(r"(?<![\d:.])(1[0-2]|0?[1-9])" + _HALF_DAY)


def _time(match: re.Match) -> str:
    """"7:30" -> "7 30", "7:05" -> "7 oh 5", "7:00" -> "7 o'clock", "19:00"
    -> "19 hundred"; with its half of the day "7:00 pm" -> "7 p m"."""
    hour, minutes, half, stop = match.groups()
    if minutes == "00":
        said = hour if half else f"{hour} o'clock" if 1 <= int(hour) <= 12 else f"{hour} hundred"
    elif minutes[0] == "0":
        said = f"{hour} oh {minutes[1]}"
    else:
        said = f"{hour} {minutes}"
    return said + (f" {half.lower()} m" if half else "") + _stop_kept(match, stop)


def _hour(match: re.Match) -> str:
    hour, half, stop = match.groups()
    return f"{hour} {half.lower()} m" + _stop_kept(match, stop)


# Dates: a day (1-31) beside a month's name, capitalized as names are ("may
# 3" is left alone); abbreviated months are said in full.
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_MONTH_NAMES = {**{m: m for m in _MONTHS}, **{m.upper(): m for m in _MONTHS},
                **{m[:3]: m for m in _MONTHS if len(m) > 3}, "Sept": "September"}
_MONTH = "(" + "|".join(sorted(_MONTH_NAMES, key=len, reverse=True)) + r")\b(\.?)"
_MONTH_DAY = re.compile(_MONTH + r"\s+([0-9]{1,2})(?:st|nd|rd|th)?\b(?![:.,]?[0-9])")
_DAY_MONTH = re.compile(r"(?<![\w.,])(?:[Tt]he\s+)?([0-9]{1,2})(?:st|nd|rd|th)?(?:\s+of)?\s+" + _MONTH)


def _ordinal_digits(day: str) -> str:
    """"3" -> "3rd": the reference's ordinal rule then says "third"."""
    n = int(day)
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _month_day(match: re.Match) -> str:
    """"March 3" -> "March 3rd"."""
    month, _, day = match.groups()
    if not 1 <= int(day) <= 31:
        return match[0]
    return f"{_MONTH_NAMES[month]} {_ordinal_digits(day)}"


def _day_month(match: re.Match) -> str:
    """"3 March" -> "the 3rd of March"."""
    day, month, stop = match.groups()
    if not 1 <= int(day) <= 31:
        return match[0]
    return f"the {_ordinal_digits(day)} of {_MONTH_NAMES[month]}" + _stop_kept(match, stop)


_NUMBER = r"([0-9](?:[0-9,.]*[0-9])?)"
_PERCENT = re.compile(_NUMBER + r"\s?([%\u2030])")
_PERCENT_WORDS = {"%": "percent", "\u2030": "per mille"}
# Degrees: "20°C", "20 °F", "-5°C", "90°", "20℃".
_DEGREES = re.compile(r"(?<![\w.])([-\u2212])?([0-9]+(?:\.[0-9]+)?)\s?(°\s?[CFK]?|\u2103|\u2109)(?![A-Za-z])")
_SCALES = {"C": "celsius", "F": "fahrenheit", "K": "kelvin", "\u2103": "celsius", "\u2109": "fahrenheit"}
# "$3.5 million": the reference would read "3 dollars, 5 cents million".
_DOLLARS_SCALED = re.compile(r"\$([0-9]+(?:\.[0-9]+)?)\s(thousand|million|billion|trillion)\b", re.IGNORECASE)
_NUMBER_SIGN = re.compile(r"#\s?([0-9])")


def _percent(match: re.Match) -> str:
    return f"{match[1]} {_PERCENT_WORDS[match[2]]}"


def _degrees(match: re.Match) -> str:
    minus, number, sign = match.groups()
    scale = _SCALES.get(sign[-1])
    unit = "degree" if number == "1" else "degrees"
    return " ".join(word for word in ("minus" if minus else "", number, unit, scale) if word)


# Units after a number, by symbol: (one, several). Case matters ("MB" is not
# "mb"). Left out as ambiguous: "m" (metres, minutes, millions), "in" (the
# word), "l" (reads as 1), "s", "h", "min".
_UNITS = {
    "km/h": ("kilometer per hour", "kilometers per hour"), "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "km": ("kilometer", "kilometers"), "cm": ("centimeter", "centimeters"), "mm": ("millimeter", "millimeters"),
    "kg": ("kilogram", "kilograms"), "mg": ("milligram", "milligrams"), "g": ("gram", "grams"),
    "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"), "L": ("liter", "liters"),
    "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"), "ft": ("foot", "feet"),
    "kB": ("kilobyte", "kilobytes"), "KB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"),
    "Hz": ("hertz", "hertz"), "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
}
_UNIT = re.compile(r"(?<![\w.])" + _NUMBER + r"\s?(" + "|".join(sorted(map(re.escape, _UNITS), key=len, reverse=True))
                   + r")(\.?)(?![\w/])")


def _measure(match: re.Match) -> str:
    """"5 km" -> "5 kilometers", "1 ft." -> "1 foot" (the period kept where
    it ends the sentence)."""
    number, symbol, stop = match.groups()
    one, several = _UNITS[symbol]
    return f"{number} {one if number == '1' else several}" + _stop_kept(match, stop)


# Symbols said as words wherever they stand.
_SYMBOL_WORDS = {"&": "and", "+": "plus", "\u00b1": "plus or minus"}
_SYMBOL = re.compile(r"\s*([&+\u00b1])\s*")


def _symbol(match: re.Match) -> str:
    """A word, set off by single spaces (none at the ends of the text)."""
    before = " " if match.start() > 0 else ""
    after = " " if match.end() < len(match.string) else ""
    return before + _SYMBOL_WORDS[match[1]] + after


# In this order: addresses first (their marks are not symbols or times),
# times before dates ("March 3:30" is no date), and the symbols last.
_SPOKEN_FORM_RULES: tuple[tuple[re.Pattern, Callable[[re.Match], str] | str], ...] = (
    (_URL, _address),
    (_EMAIL, _address),
    (_DOMAIN, _address),
    (_TIME, _time),
    (_HOUR, _hour),
    (_MONTH_DAY, _month_day),
    (_DAY_MONTH, _day_month),
    (_PERCENT, _percent),
    (_DEGREES, _degrees),
    (_DOLLARS_SCALED, r"\1 \2 dollars"),
    (_NUMBER_SIGN, r"number \1"),
    (_UNIT, _measure),
    (_SYMBOL, _symbol),
)


# What every rule needs somewhere in the line (a digit, a mark, an
# address's start or end): most lines have none and skip the rules.
_ANY_SPOKEN_FORM = re.compile(r"[0-9@&+\u00b1]|://|www\." + "|" + _TOP_LEVEL_DOMAINS)


def spoken_forms(text: str) -> str:
    """Raw text with what the reference cleaners drop or mangle written out
    as it is said: percentages, times, e-mail and web addresses, degrees,
    units after numbers, "&", "+", "#" before a number, scaled dollar
    amounts, and days beside a month's name as ordinals. Numbers stay
    digits for the reference's rules to read."""
    if not _ANY_SPOKEN_FORM.search(text):
        return text
    for pattern, said in _SPOKEN_FORM_RULES:
        text = pattern.sub(said, text)
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


def _phone_ids(phones: str) -> list[int]:
    # Brace contents are case-sensitive and uncleaned: unknown phones,
    # lowercase ones and stray punctuation are all dropped.
    keys = (_PHONE_PREFIX + phone for phone in phones.split())
    return [_SYMBOL_TO_ID[key] for key in keys if key in _SYMBOL_TO_ID]


@dataclass(frozen=True)
class Reading:
    """What the front end makes of a line."""
    ids: list[int]      # symbol ids: what the model reads
    text: str           # the ids as text, phones in braces: the manifest's normalized_text
    dropped: str        # characters outside braces it left unsaid, once each, in order ("" for none)


def read(text: str, normalization: str = "reference") -> Reading:
    """Text (optionally with ``{ARPAbet}`` spans) as the model reads it,
    by the rules of ``normalization`` (one of NORMALIZATIONS; a run's
    comes from its settings, ``text_normalization``)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"text normalization must be one of {', '.join(NORMALIZATIONS)}, not {normalization!r}")
    ids: list[int] = []
    dropped: dict[str, None] = {}
    while text:
        match = _BRACED_PHONES.match(text)
        plain_ids, unsaid = _read_plain(text if match is None else match["before"], normalization)
        ids += plain_ids
        dropped.update(dict.fromkeys(unsaid))
        if match is None:
            break
        ids += _phone_ids(match["phones"])
        text = match["after"]
    return Reading(ids, sequence_to_text(ids), "".join(dropped))


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
    (日本語 as "ri ben yu"), which is not what the text says."""
    seen: dict[str, None] = {}
    for char in text:
        if unicodedata.category(char).startswith("L") and not unicodedata.name(char, "").startswith("LATIN"):
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
