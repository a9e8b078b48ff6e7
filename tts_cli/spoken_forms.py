"""The extended normalization's first step: what NVIDIA's english_cleaners
drop or mangle in common English text, written out as it is said, before
the reference's cleaning (text.py) runs: percentages, times, e-mail and web
addresses, degrees, units after numbers, "&", "+", "#" before a number,
scaled dollar amounts, and days beside a month's name as ordinals.

Pure Python, regular expressions only: the reference's rules then read every
number, so the two normalizations agree on anything these rules leave alone.
"""
from __future__ import annotations

import re
from typing import Callable

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
    """"3" -> "3th": the reference's ordinal rule then says "third" (it reads
    the number as an ordinal whatever its suffix)."""
    return f"{int(day)}th"


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
