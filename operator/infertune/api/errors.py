"""Turn pydantic's validation errors into messages for people: a field path and how to fix it."""

from __future__ import annotations

import difflib
import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from infertune.api.base import CROSS_FIELD_ERROR
from infertune.api.spec import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    METRIC_NAME,
    PROM_LABEL_NAME,
    PROM_WINDOW,
    InferenceTuning,
)
from infertune.api.tuning import LIBRARY_PATH, MIG_PROFILE

# What each naming pattern means, so an error says the rule instead of a regex.
_PATTERN_HINTS = {
    DNS_SUBDOMAIN: "must be a lowercase RFC 1123 name: a-z, 0-9, '-' and '.', starting and "
    "ending with a letter or digit",
    DNS_LABEL: "must be a lowercase RFC 1123 label: a-z, 0-9 and '-', starting and ending with "
    "a letter or digit",
    METRIC_NAME: "must be a Prometheus metric name (letters, digits, '_' and ':'), not a "
    "PromQL expression",
    PROM_LABEL_NAME: "must be a Prometheus label name (letters, digits and '_', not starting "
                     "with '__', which Prometheus keeps for its own labels)",
    PROM_WINDOW: "is not a PromQL range: a whole number above 0 and one unit, ms, s, m or h "
                 "(for example 1m or 90s)",
    MIG_PROFILE: "is not a MIG profile name: lowercase, as NVIDIA writes it (for example "
                 "3g.71gb, or 1g.18gb+me with media extensions); `infertune mig profiles` "
                 "lists them",
    LIBRARY_PATH: "must be one absolute path (starting with /) without whitespace or ':': "
                  "LD_PRELOAD takes this single library, for example "
                  "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
}


_PYDANTIC_TAG = re.compile(
    r"(function-(after|before|wrap|plain)|lax-or-strict|json-or-python|(tagged-)?union"
    r"|nullable|chain|default|list|dict|tuple|set|frozenset|is-instance|literal|enum)\[.*\]$")
"""The steps pydantic puts into an error's location for its own schemas; a user's map key such
as `pool[gpu]` is kept (the error is about it)."""


@dataclass(frozen=True)
class FieldError:
    """One problem in one field."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def format_path(loc: tuple[int | str, ...]) -> str:
    """('spec', 'canary', 'steps', 1, 'weight') -> 'spec.canary.steps[1].weight'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PYDANTIC_TAG.match(part):
            continue  # pydantic's internal tags such as function-after[...] are not fields
        else:
            out += f".{part}" if out else part
    return out


def _join(base: str, field: str) -> str:
    if not base:
        return field
    return f"{base}{field}" if field.startswith("[") else f"{base}.{field}"


def _known_fields(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The camelCase field names valid at the parent of `loc`, for "did you mean"."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(current, type)
                                         and issubclass(current, BaseModel)):
            continue
        field = next((f for n, f in current.model_fields.items()
                      if (f.alias or n) == part), None)
        if field is None:
            return []
        annotation = field.annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            inner = getattr(candidate, "__args__", (candidate,))
            found = next((c for c in (candidate, *inner)
                          if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if found is not None:
                current = found
                break
        else:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or n for n, f in current.model_fields.items()]
    return []


def _message(error: Any, model: type[BaseModel]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "is required; add it"
    if kind == "extra_forbidden":
        name = str(error["loc"][-1])
        known = _known_fields(model, tuple(error["loc"]))
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            return f"unknown field; did you mean {close[0]}?"
        listing = f" (valid here: {', '.join(known)})" if known else ""
        return f"unknown field; remove it{listing}"
    if kind == "int_parsing_size":
        # pydantic's words showed 1e+20 for the 99999999999999999999 the user wrote (the
        # reader keeps it as kubectl does, a float), and said neither the bound nor the fix.
        return (f"{_shown(error['input'])} is beyond any integer the API server stores "
                "(-2^63 to 2^63-1); give a number within the field's bounds")
    if kind == "string_pattern_mismatch":
        hint = _PATTERN_HINTS.get(str(ctx.get("pattern")))
        shown = f"{_shown(error['input'])} "
        if hint:
            return shown + hint
        return f"{shown}does not match the pattern {ctx.get('pattern')}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        # pydantic names its class ("a valid dictionary or instance of NumaSpec").
        return f"{_shown(error['input'])} is not a mapping; give its fields under it"
    if kind == "list_type":
        return f"{_shown(error['input'])} is not a list; give its items as a list"
    if kind == "finite_number":
        return (f"{_shown(error['input'])} is not a finite number; give a number (the API "
                "server stores no .inf or .nan)")
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if kind in ("literal_error", "enum"):
        return f"{_shown(error['input'])} is not allowed; {message[0].lower()}{message[1:]}"
    if kind == "string_type" and isinstance(error["input"], bool):
        # `container: n` is False to a YAML reader, as to kubectl: the message said only that
        # False is no string.
        return (f"{_shown(error['input'])}: input should be a valid string (YAML reads an "
                "unquoted y, n, yes, no, on, off, true or false as a boolean; quote it, for "
                "example 'n')")
    if kind.startswith(("greater", "less", "too_", "int_", "float_", "bool_", "string_")):
        return f"{_shown(error['input'])}: {message[0].lower()}{message[1:]}"
    return message


MAX_FIELD_ERRORS = 100
"""The most problems `field_errors` words one by one; the rest are counted. Each unknown field
is compared with the known ones for a "did you mean": 480,000 of them in an 8 MiB review took
23 s of the operator's event loop, while no message shows more than the first few."""


def field_errors(exc: ValidationError, model: type[BaseModel]) -> list[FieldError]:
    """Every problem in `exc` (the first MAX_FIELD_ERRORS, then how many more), with
    cross-field problems expanded to the fields they name."""
    errors = exc.errors(include_url=False)
    if len(errors) <= MAX_FIELD_ERRORS:
        return _worded(errors, model)
    more = len(errors) - MAX_FIELD_ERRORS
    return [*_worded(errors[:MAX_FIELD_ERRORS], model),
            FieldError("", f"and {more} more problem{'s' if more > 1 else ''}")]


def _worded(errors: Iterable[Any], model: type[BaseModel]) -> list[FieldError]:
    out: list[FieldError] = []
    for error in errors:
        path = format_path(tuple(error["loc"]))
        ctx = error.get("ctx") or {}
        if error["type"] == CROSS_FIELD_ERROR:
            for field, message in ctx["problems"]:
                out.append(FieldError(_join(path, field), message))
            continue
        out.append(FieldError(path, _message(error, model)))
    return out


def validate_stored(body: Mapping[str, Any]) -> tuple[InferenceTuning | None, str]:
    """The InferenceTuning in an object as the API server returns it (its status and anything
    else the server adds are left out), or None and its problems in one line,
    `field.path: message; ...`."""
    tuning, problems = stored_problems(body)
    return tuning, "; ".join(str(e) for e in problems)


def stored_problems(body: Mapping[str, Any]) -> tuple[InferenceTuning | None, list[FieldError]]:
    """`validate_stored` with the problems one by one."""
    try:
        return InferenceTuning.model_validate(
            {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}), []
    except ValidationError as exc:
        return None, field_errors(exc, InferenceTuning)


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlist = _SHOWN.maxdict = 4
_SHOWN.maxlevel = 2


def _shown(value: Any) -> str:
    """A bad value as an error message quotes it: short, and never the whole of a large or
    deeply shared structure (YAML aliases made a 645-byte file print for minutes)."""
    return _SHOWN.repr(value)
