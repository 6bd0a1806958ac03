"""jemalloc 5.3 MALLOC_CONF syntax: the tokenizer and the number readers, exactly as the library
reads them (src/jemalloc.c malloc_conf_next, src/malloc_io.c malloc_strtoumax, src/fxp.c
fxp_parse). Pure; mallocconf.py checks the options on top of it.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

_U64 = 2**64
_INT64_MAX = 2**63 - 1
_KEY_CHARS = frozenset(string.ascii_letters + string.digits + "_")


@dataclass(frozen=True)
class ConfProblem:
    """One thing jemalloc would complain about, and how to fix it."""

    key: str | None
    value: str | None
    message: str
    aborts: bool = True
    """Whether abort_conf:true makes jemalloc abort on it: not on a count it cuts to its
    limit, nor on an experimental_ key (measured with the library)."""
    opt_abort: bool = False
    """Whether abort:true makes jemalloc abort on it too: the per-CPU arena checks it makes
    once the options are read (measured with the library)."""


class MallocConfSyntaxError(ValueError):
    """The string does not tokenize the way jemalloc's malloc_conf_next() needs."""

    def __init__(self, problem: ConfProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


# ---- tokenizer: malloc_conf_next() ----------------------------------------------------------


def scan(text: str) -> tuple[list[tuple[str, str]], ConfProblem | None]:
    """The pairs jemalloc applies, and the syntax problem that stopped it (or None).

    jemalloc stops reading a source at its first syntax error; pairs before it still apply,
    and so does the last pair before a trailing comma.
    """
    text = text.split("\0", 1)[0]  # a C string ends at NUL
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        start = i
        while i < len(text) and text[i] in _KEY_CHARS:
            i += 1
        if i == len(text):
            return pairs, _ends_with_key(text[start:])
        if text[i] != ":":
            return pairs, _malformed(text, i)
        key, comma = text[start:i], text.find(",", i + 1)
        if comma == -1:
            pairs.append((key, text[i + 1:]))
            break
        pairs.append((key, text[i + 1:comma]))
        i = comma + 1
        if i == len(text):
            return pairs, ConfProblem(None, None, "the string ends with a comma (jemalloc: "
                                      "'Conf string ends with comma'); remove the last comma")
    return pairs, None


def _ends_with_key(token: str) -> ConfProblem:
    return ConfProblem(token, None, f"{token!r} has no ':' and value (jemalloc: 'Conf string "
                       f"ends with key'); write key:value, for example narenas:4")


_MALFORMED_HINTS = {
    "=": "separate name and value with ':' (narenas:4), not '='",
    ",": "remove the empty entry (a leading comma or two commas in a row)",
    ".": "use the option name without the mallctl prefix (narenas, not opt.narenas)",
    " ": "remove the space; jemalloc allows no spaces around names",
}


def _malformed(text: str, at: int) -> ConfProblem:
    char = text[at]
    hint = _MALFORMED_HINTS.get(char, "option names are letters, digits and '_' only")
    rest = text[at:]
    return ConfProblem(None, None, f"character {char!r} at offset {at} cannot be part of an "
                       f"option name (jemalloc: 'Malformed conf string') and jemalloc ignores "
                       f"everything from there ({rest!r}); {hint}")


def parse_malloc_conf(text: str) -> list[tuple[str, str]]:
    """The (key, value) pairs of `text` in order; MallocConfSyntaxError if jemalloc would
    report a syntax error (including a trailing comma). The empty string has no pairs."""
    pairs, problem = scan(text)
    if problem is not None:
        raise MallocConfSyntaxError(problem)
    return pairs


# ---- values: malloc_strtoumax() and fxp_parse() ---------------------------------------------


def _digit(char: str) -> int | None:
    if "0" <= char <= "9":
        return ord(char) - ord("0")
    if "a" <= char.lower() <= "z" and char.isascii():
        return ord(char.lower()) - ord("a") + 10
    return None


def strtoumax(text: str) -> tuple[int, int] | None:
    """malloc_strtoumax(text, &end, 0): (value mod 2**64, characters used), None when it sets
    errno. Like the C code it skips leading whitespace, takes one sign, reads 0x as hex and a
    leading 0 as octal, and misses some overflows (its check is `ret < previous`)."""
    i = 0
    while i < len(text) and text[i] in "\t\n\v\f\r ":
        i += 1
    negative = text[i:i + 1] == "-"
    if text[i:i + 1] in ("-", "+"):
        i += 1
    digits_start, base = i, 10
    if text[i:i + 1] == "0":
        after = text[i + 1:i + 2]
        if after != "" and after in "01234567":
            base, i = 8, i + 1
        elif after in ("x", "X") and text[i + 2:i + 3] != "" and text[i + 2] in string.hexdigits:
            base, i = 16, i + 2
        elif after not in ("x", "X"):
            return 0, i + 1  # "0" followed by anything else: zero, the rest left unread
    value = 0
    while i < len(text) and (digit := _digit(text[i])) is not None and digit < base:
        previous, value = value, (value * base + digit) % _U64
        if value < previous:
            return None
        i += 1
    if i == digits_start:
        return None
    return (-value % _U64 if negative else value), i


def read_number(value: str, signed: bool) -> int | None:
    """CONF_VALUE_READ: the number as the C handler sees it, None if the value is not one."""
    parsed = strtoumax(value)
    if parsed is None or parsed[1] != len(value):
        return None
    number = parsed[0]
    return number - _U64 if signed and number > _INT64_MAX else number


def read_fxp(value: str) -> int | None:
    """fxp_parse(): 16.16 fixed point from digits with an optional fraction ("2", ".5", "0.25";
    not "1." or "1e3"); the integer part must stay below 65536."""
    match = re.fullmatch(r"([0-9]*)(?:\.([0-9]+))?", value)
    if match is None or value == "" or int(match[1] or "0") >= 2**16:
        return None
    # 14 fractional digits, FXP_FRACTIONAL_PART_DIGITS; later ones are read and ignored.
    fraction = (match[2] or "").ljust(14, "0")[:14]
    return (int(match[1] or "0") << 16) + (int(fraction) << 16) // 10**14
