"""The extended normalization's first step: what NVIDIA's english_cleaners
drop or mangle in common English text, written out as it is said, before
the reference's cleaning (text.py) runs: percentages, times, e-mail and web
addresses, degrees, units after numbers, "&", "+", "#" before a number,
money in dollars, pounds, euros and yen, scaled amounts, decimals' digits,
counts with a comma, minus signs, days beside a month's name as ordinals,
and a next-line control (U+0085, which transliteration drops, joining the
words around it) as a space. Each rule is anchored where a match can start,
so a long line costs time in proportion to its length.

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
_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_TOP_LEVEL_DOMAINS = r"\.(?:com|org|net|edu|gov|io|info|uk|de|eu)\b"
_DOMAIN = re.compile(r"(?<![\w@./-])[A-Za-z0-9][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*" + _TOP_LEVEL_DOMAINS
                     + r"(?![.-]?\w)(?:/[^\s<>\"']*" + _ADDRESS_END + ")?")
_SCHEME = re.compile(r"^(?:[a-z]+://)?(?:www\.)?", re.IGNORECASE)
# Words of any script, numbers, the marks that are said, and any other
# character outside ASCII (an emoji), kept for the cleaners to drop and
# the row's "dropped" to name.
_ADDRESS_PARTS = re.compile(r"[^\W\d_]+|[0-9]+|[@./+]|[^\x00-\x7f]")
_ADDRESS_MARKS = {"@": "at", ".": "dot", "/": "slash", "+": "plus"}
# A run of more digits than this in an address (an id, a phone number) is
# said a digit at a time, not as one number.
_ADDRESS_NUMBER_DIGITS = 4


def _address(match: re.Match) -> str:
    """An address as it is read out: "info@example.com" -> "info at example
    dot com", "https://example.org/a-b" -> "example dot org slash a b". The
    scheme, "www." and a trailing slash are not said; "@", ".", "/" and "+"
    are; other marks (- _ ? = & # % ~) only part the words; letters and
    digits are apart ("web2" -> "web 2"), and a long run of digits is said
    a digit at a time ("status/20261205" -> "status slash 2 0 2 6 1 2 0 5")."""
    address = _SCHEME.sub("", match[0]).rstrip("/")
    return " ".join(" ".join(part) if part.isdigit() and len(part) > _ADDRESS_NUMBER_DIGITS
                    else _ADDRESS_MARKS.get(part, part) for part in _ADDRESS_PARTS.findall(address))


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
_SHORT_MONTHS = {**{m[:3]: m for m in _MONTHS if len(m) > 3}, "Sept": "September"}
_MONTH_NAMES = {**{m: m for m in _MONTHS}, **{m.upper(): m for m in _MONTHS},
                **_SHORT_MONTHS, **{short.upper(): m for short, m in _SHORT_MONTHS.items()}}
_MONTH = "(" + "|".join(sorted(_MONTH_NAMES, key=len, reverse=True)) + r")\b(\.?)"
_MONTH_DAY = re.compile(_MONTH + r"\s+([0-9]{1,2})(?:st|nd|rd|th)?\b(?![:.,]?[0-9])")
_DAY_MONTH = re.compile(r"(?<![\w.,:])(?:[Tt]he\s+)?([0-9]{1,2})(?:st|nd|rd|th)?(?:\s+of)?\s+" + _MONTH)


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
_PERCENT = re.compile(r"(?<![0-9,.])" + _NUMBER + r"\s?([%\u2030])")
_PERCENT_WORDS = {"%": "percent", "\u2030": "per mille"}
# Degrees: "20°C", "20 °F", "-5°C", "90°", "20℃".
_DEGREES = re.compile(r"(?<![\w.])([-\u2212])?([0-9]+(?:\.[0-9]+)?)\s?(°\s?[CFK]?|\u2103|\u2109)(?![A-Za-z])")
_SCALES = {"C": "celsius", "F": "fahrenheit", "K": "kelvin", "\u2103": "celsius", "\u2109": "fahrenheit"}
# Money. The reference reads "$3.50" and "$1" itself; it reads "$3.5
# million" as "3 dollars, 5 cents million", "$1.5" as "1 dollar, 5 cents",
# and other currencies not at all ("\u00a35" reads "ps5").
_CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "\u00a3": ("pound", "pounds", "penny", "pence"),
               "\u20ac": ("euro", "euros", "cent", "cents"), "\u00a5": ("yen", "yen", "", "")}
# The currencies' signs for a character class, and the class of one sign:
# any, or any but "$" (the reference reads dollars itself).
_SIGNS = re.escape("".join(_CURRENCIES))
_SIGN = f"[{_SIGNS}]"
_SIGN_NOT_DOLLAR = "[" + re.escape("".join(sign for sign in _CURRENCIES if sign != "$")) + "]"
_SCALE_WORDS = {"k": "thousand", "K": "thousand", "M": "million", "bn": "billion", "B": "billion"}
_MONEY_SCALED = re.compile("(" + _SIGN + r")([0-9][0-9,]*(?:\.[0-9]+)?)(?:\s(thousand|million|billion|trillion)\b"
                           r"|(k|K|M|bn|B)\b)", re.IGNORECASE)
_DOLLAR_TENTHS = re.compile(r"(\$[0-9][0-9,]*\.[0-9])(?![0-9])")
_MONEY = re.compile("(" + _SIGN_NOT_DOLLAR + r")([0-9][0-9,]*)(?:\.([0-9]{1,2}))?(?![0-9])")
# Dollars with thousands' commas, which the reference would read as a year
# ("$2,345" -> "twenty-three forty-five dollars"): said as a count below.
_DOLLARS_GROUPED = re.compile(r"(\$)([0-9]{1,3}(?:,[0-9]{3})+)(?:\.([0-9]{1,2}))?(?![0-9])")
_NUMBER_SIGN = re.compile(r"(?<!\w)#\s?([0-9])")
# A minus sign before a number ("-5%", "-$3"), not a hyphen inside a word or range.
_MINUS = re.compile(r"(?<![\w.,)\]])[-\u2212](?=" + _SIGN + "?[0-9])")
# "1,234": the reference reads a number of 1,001-2,999 as a year ("twenty-three
# forty-five") even with its comma, which only a count has.
_THOUSANDS = re.compile(r"(?<![\w.," + _SIGNS + r"])([12]),([0-9]{3})(?![0-9]|,[0-9])")
# A decimal's digits after the point are said one by one ("3.14" -> "3 point
# 1 4"); the reference reads them as a number ("0.05" as "zero point five").
_DECIMAL = re.compile(r"(?<![\w.," + _SIGNS + r"])([0-9][0-9,]*)\.([0-9]{2,})(?!\.?[0-9])")
# "/" between numbers ("1/2", "12/05/2026"), which the reference drops, gluing them.
_NUMBER_SLASH = re.compile(r"(?<=[0-9])/(?=[0-9])")


def _money_scaled(match: re.Match) -> str:
    """"$3.5 million" -> "3.5 million dollars", "\u20ac2bn" -> "2 billion euros"."""
    sign, amount, word, suffix = match.groups()
    return f"{amount} {word.lower() if word else _SCALE_WORDS[suffix]} {_CURRENCIES[sign][1]}"


def _money(match: re.Match) -> str:
    """"\u00a35" -> "5 pounds", "\u20ac1.50" -> "1 euro, 50 cents", "\u00a5100" -> "100 yen"."""
    sign, whole, fraction = match.groups()
    one, several, hundredth, hundredths = _CURRENCIES[sign]
    said = f"{whole} {one if whole == '1' else several}"
    if fraction and hundredth and int(fraction.ljust(2, "0")):
        cents = str(int(fraction.ljust(2, "0")))
        said += f", {cents} {hundredth if cents == '1' else hundredths}"
    return said


def _thousands(match: re.Match) -> str:
    """"2,345" -> "2 thousand 345" ("1,234.5" -> "1 thousand 234.5"); a
    whole thousand as the reference reads it ("2,000" -> "2000")."""
    rest = int(match[2])
    return f"{match[1]} thousand {match[2].lstrip('0')}" if rest else f"{match[1]}{match[2]}"


def _decimal(match: re.Match) -> str:
    """"3.14" -> "3 point 1 4"."""
    return f"{match[1]} point {' '.join(match[2])}"


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
_UNIT = re.compile(r"(?<![\w.,])" + _NUMBER + r"\s?(" + "|".join(sorted(map(re.escape, _UNITS), key=len, reverse=True))
                   + r")(\.?)(?![\w/])")


def _measure(match: re.Match) -> str:
    """"5 km" -> "5 kilometers", "1 ft." -> "1 foot" (the period kept where
    it ends the sentence)."""
    number, symbol, stop = match.groups()
    one, several = _UNITS[symbol]
    return f"{number} {one if number == '1' else several}" + _stop_kept(match, stop)


# Symbols said as words wherever they stand.
_SYMBOL_WORDS = {"&": "and", "+": "plus", "\u00b1": "plus or minus"}
_SYMBOL = re.compile(r"(?<!\s)\s*([&+\u00b1])\s*")


def _symbol(match: re.Match) -> str:
    """A word, set off by single spaces (none at the ends of the text)."""
    before = " " if match.start() > 0 else ""
    after = " " if match.end() < len(match.string) else ""
    return before + _SYMBOL_WORDS[match[1]] + after


# In this order: addresses first (their marks are not symbols or times);
# dates before times, so that a time's minutes are not a day ("14:25 Dec.
# 24"; a day is not followed by ":" nor preceded by it); money, units and
# the rest before decimals, which they may hold; the symbols last.
_SPOKEN_FORM_RULES: tuple[tuple[re.Pattern, Callable[[re.Match], str] | str], ...] = (
    (_URL, _address),
    (_EMAIL, _address),
    (_DOMAIN, _address),
    (_MONTH_DAY, _month_day),
    (_DAY_MONTH, _day_month),
    (_TIME, _time),
    (_HOUR, _hour),
    (_PERCENT, _percent),
    (_DEGREES, _degrees),
    (_MONEY_SCALED, _money_scaled),
    (_DOLLAR_TENTHS, r"\g<1>0"),
    (_MONEY, _money),
    (_DOLLARS_GROUPED, _money),
    (_MINUS, "minus "),
    (_NUMBER_SIGN, r"number \1"),
    (_UNIT, _measure),
    (_THOUSANDS, _thousands),
    (_DECIMAL, _decimal),
    (_NUMBER_SLASH, " slash "),
    (_SYMBOL, _symbol),
)


# What every rule needs somewhere in the line (a digit, a mark, an
# address's start or end): most lines have none and skip the rules.
_ANY_SPOKEN_FORM = re.compile(r"[0-9@&+\u00b1]|://|www\." + "|" + _TOP_LEVEL_DOMAINS)


def spoken_forms(text: str) -> str:
    """Raw text with what the reference cleaners drop or mangle written out
    as it is said (the module's docstring lists what). Numbers stay digits
    for the reference's rules to read."""
    text = text.replace("\x85", " ")
    if not _ANY_SPOKEN_FORM.search(text):
        return text
    for pattern, said in _SPOKEN_FORM_RULES:
        text = pattern.sub(said, text)
    return text
