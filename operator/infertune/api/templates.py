"""PromQL templates of engine custom (spec.metrics.queries): checked here, filled in promql.py.

A template is the user's own PromQL for one signal, evaluated per pod. Two placeholders are
filled in by the operator and nothing else: `$selector`, inside a selector's braces, becomes
the label matchers of the pods being read (every value escaped, promql.py), and `$window`,
inside a range's brackets, becomes spec.metrics.window. A `$` inside a string literal is the
user's own (label_replace's "$1") and is left alone.

The check is structural, not a PromQL parser: strings closed, brackets balanced, placeholders
known and where they belong. A template that passes it and still does not parse is refused
by Prometheus when it runs, and that refusal is the MetricsAvailable condition of the tunings
that use it (its plan is its own: no other tuning's query is affected).
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_TEMPLATE_LENGTH = 2000
PLACEHOLDERS = {"selector": "{", "window": "["}
"""Each placeholder and the bracket it must stand in."""
_NAME = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_CLOSING = {"(": ")", "[": "]", "{": "}"}


class Placeholder(NamedTuple):
    start: int
    end: int
    name: str


def placeholders(text: str) -> tuple[tuple[Placeholder, ...], str | None]:
    """The placeholders of `text` outside string literals and comments, or what is wrong
    with it (then the tuple is empty)."""
    found: list[Placeholder] = []
    stack: list[tuple[str, int]] = []
    i, n = 0, len(text)
    control = next((j for j, c in enumerate(text) if ord(c) < 32 and c not in "\t\n"), None)
    if control is not None:
        # Prometheus ends a comment at a carriage return too: one here could close the
        # operator's own text after the template (escape it in a string: "\r").
        return (), (f"a control character (U+{ord(text[control]):04X}) at character "
                    f"{control + 1}; write the query on lines ended by newlines only")
    while i < n:
        c = text[i]
        if c in "\"'`":
            end = _string_end(text, i)
            if end is None:
                return (), f"the string starting at character {i + 1} is not closed"
            i = end
            continue
        if c == "#":  # a comment, to the end of the line
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
            continue
        if c in _CLOSING:
            stack.append((c, i))
        elif c in ")]}":
            if not stack or _CLOSING[stack[-1][0]] != c:
                return (), f"{c!r} at character {i + 1} closes nothing that is open"
            stack.pop()
        elif c == "$":
            match = _NAME.match(text, i)
            name = match.group(1) if match else ""
            if name not in PLACEHOLDERS:
                return (), (f"${name} at character {i + 1} is not a placeholder: only $selector "
                            "(the target's pods, inside a selector's braces) and $window "
                            "(spec.metrics.window, inside a range's brackets) are filled in")
            opener = stack[-1][0] if stack else ""
            if opener != PLACEHOLDERS[name]:
                where = "a selector's braces, as in my_metric{$selector}" if name == "selector" \
                    else "a range's brackets, as in rate(my_total{$selector}[$window])"
                return (), f"${name} at character {i + 1} must stand inside {where}"
            assert match is not None
            found.append(Placeholder(i, match.end(), name))
            i = match.end()
            continue
        i += 1
    if stack:
        opener, at = stack[-1]
        return (), f"{opener!r} at character {at + 1} is not closed"
    return tuple(found), None


def template_problem(text: str) -> str | None:
    """Why `text` cannot be a template, or None."""
    if len(text) > MAX_TEMPLATE_LENGTH:
        return f"is {len(text)} characters long; at most {MAX_TEMPLATE_LENGTH}"
    found, problem = placeholders(text)
    if problem is not None:
        return problem
    if not any(p.name == "selector" for p in found):
        return ("does not use $selector: the query must select the target's pods, for example "
                "my_queue_size{$selector}, so that each tuning reads its own pods")
    return None


def fill(text: str, values: dict[str, str]) -> str:
    """`text` with each placeholder replaced by `values[name]` (a checked template)."""
    found, problem = placeholders(text)
    if problem is not None:
        raise ValueError(f"template {text[:80]!r}: {problem}")
    out, last = [], 0
    for placeholder in found:
        out += [text[last:placeholder.start], values[placeholder.name]]
        last = placeholder.end
    out.append(text[last:])
    return "".join(out)


def _string_end(text: str, start: int) -> int | None:
    """The index after the string literal that opens at `start` (PromQL's three quotes; a
    backquoted string has no escapes)."""
    quote, i = text[start], start + 1
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "`":
            i += 2
            continue
        if c == quote:
            return i + 1
        if c == "\n" and quote != "`":
            return None
        i += 1
    return None
