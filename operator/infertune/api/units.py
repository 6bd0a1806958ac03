"""Units as Kubernetes users write them: quantities (`28Gi`, `500m`) and durations (`30s`, `75ms`).

Both types are `str` subclasses, so a parsed spec serialises back to exactly what the user
wrote (Git stays the source of truth) while the code reads `.value` or `.seconds`.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

# k8s.io/apimachinery/pkg/api/resource: binary (power of two) and decimal SI suffixes.
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[eE][+-]?[0-9]+|[A-Za-z]*)$"
)

_EXPONENT = re.compile(r"[eE][+-]?[0-9]+")
"""A decimal exponent: digits required (`30e` is not 30, `1eM` is no quantity)."""

QUANTITY_PATTERN = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$")
"""k8s.io/apimachinery's resource.Quantity as controller-gen writes it into CRDs, narrowed to
what the operator takes: no sign but `+` (every quantity here is a size, >= 0), and a whole
exponent (`3e1.5` matched controller-gen's pattern, so the API server stored it and the
operator then refused the tuning)."""
MAX_QUANTITY_TEXT = 64
"""The longest quantity text, as the CRD's maxLength (Kubernetes' own limit on a quantity)."""

# Go's time.ParseDuration units, the format kubectl and every Kubernetes API use.
_DURATION_UNITS = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
LONGEST_DURATION_S = 7 * 24 * 3600
"""No duration in the API is longer (fields that feed queries have tighter limits); without a
bound, 400 digits of seconds would become an infinite float in the arithmetic after it."""


class QuantityError(ValueError):
    """A text that `parse_quantity` does not take as a Kubernetes quantity."""


def parse_quantity(text: str) -> Decimal:
    """Return the value of a Kubernetes quantity, or raise QuantityError (a ValueError) with a
    hint."""
    match = _QUANTITY.match(text.strip()) if text == text.strip() else None
    if match is None:
        raise QuantityError(
            f"{shown(text)} is not a Kubernetes quantity; write a number with an optional suffix "
            "such as 28Gi, 512Mi, 500m or 2"
        )
    number = Decimal(match["num"])
    suffix = match["suffix"]
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = number * _DECIMAL[suffix]
    elif _EXPONENT.fullmatch(suffix):
        if len(suffix.lstrip("eE+-").lstrip("0")) > 4:  # 1e00005 is 1e5
            # int() of thousands of digits is refused in Python's own words; no quantity
            # needs an exponent past 18 or below -9 (nano).
            if "-" not in suffix:
                raise QuantityError(_too_large(text))
            raise QuantityError(f"{shown(text)} is smaller than any quantity Kubernetes keeps (1n "
                             "is the least); write it with a suffix such as 500m")
        digits = suffix.lstrip("eE+-").lstrip("0") or "0"
        exponent = -int(digits) if "-" in suffix else int(digits)
        if exponent > MAX_EXPONENT:  # 10 ** a billion overflows Decimal (or takes for ever)
            raise QuantityError(_too_large(text))
        value = number * (Decimal(10) ** exponent)
    else:
        raise QuantityError(
            f"{shown(text)} has an unknown suffix {shown(suffix)}; use one of "
            f"{', '.join(_BINARY)} (binary) or k, M, G, T, P, E, m (decimal)"
        )
    if value > MAX_QUANTITY:
        raise QuantityError(_too_large(text))
    return value


MAX_QUANTITY = Decimal(2**63 - 1)
"""The largest quantity Kubernetes keeps as a number (an int64): memory in bytes, or an
exponent, above it cannot be a resource and cannot be written to memory.high."""
MAX_EXPONENT = 18


def _too_large(text: str) -> str:
    return (f"{shown(text)} is larger than any resource Kubernetes counts (at most 2^63-1, about "
            "8Ei); write it with a suffix such as 28Gi")


def shown(text: str, limit: int = 40) -> str:
    """`text` quoted for a message, cut to `limit` characters: a 100 kB value made a 100 kB
    error line in validate's output and in the tuning's status."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def parse_duration(text: str) -> Decimal:
    """Return seconds for a Go-style duration such as `30s`, `1m30s` or `75ms`."""
    if not re.fullmatch(DURATION_PATTERN, text):
        # Both: a latency target of 500 is 500ms, a sustain of 30 is 30s.
        hint = (f"; did you mean '{text}s' or '{text}ms'?"
                if len(text) <= 40 and re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) else "")
        raise ValueError(
            f"{shown(text)} is not a duration; write a number with a unit (ms, s, m, h), "
            f"for example 30s, 2m or 75ms{hint}"
        )
    return sum(
        (Decimal(num) * _DURATION_UNITS[unit] for num, unit in _DURATION_PART.findall(text)),
        Decimal(0),
    )


_SECONDS: dict[str, float] = {}
"""Duration text -> seconds, for `duration_seconds`: a dict, as a Duration (a str subclass)
misses lru_cache's fast path for plain str keys."""


def duration_seconds(duration: str) -> float:
    """`parse_duration` as a float, cached (Duration.seconds): a cycle over 1000 tunings
    reads each of their durations several times per tuning."""
    try:
        return _SECONDS[duration]
    except KeyError:
        pass
    value = float(parse_duration(duration))  # raises on a bad one: never cached
    if len(_SECONDS) >= 1024:  # specs come and go; the durations in use are few
        _SECONDS.clear()
    _SECONDS[str(duration)] = value
    return value


def format_duration(seconds: float) -> str:
    """The shortest exact Go-style spelling of a number of seconds, for messages and status:
    `1h30m`, `9h21m15s`, `3h0m15s`, `1.5s`, `500ms`. A breach 9 hours old was written
    `33675s` when only the largest unit that divided it evenly was used, which a person
    reading the reason at night has to work out."""
    millis = round(seconds * 1000)
    if millis < 0:
        return "-" + format_duration(-millis / 1000)
    whole, fraction = divmod(millis, 1000)
    if not whole:
        return f"{fraction}ms" if fraction else "0s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    # 3h0m15s, as Go writes it: "3h15s" read as 3 hours 15 minutes.
    text = (f"{hours}h" if hours else "") + (
        f"{minutes}m" if minutes or (hours and (secs or fraction)) else "")
    if fraction:
        text += f"{secs}.{fraction:03d}".rstrip("0") + "s"
    elif secs or not text:
        text += f"{secs}s"
    return text


class Quantity(str):
    """A Kubernetes resource quantity, kept as written. `.value` is the number it means."""

    __slots__ = ()

    @property
    def value(self) -> Decimal:
        return parse_quantity(self)

    @classmethod
    def _validate(cls, raw: Any) -> Quantity:
        if isinstance(raw, float) and math.isfinite(raw) and raw == int(raw):
            raw = int(raw)  # 30e9 in YAML: kubectl sends it as the integer it is
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise PydanticCustomError(
                "quantity", "expected a quantity such as 28Gi or 500m, got {kind}",
                {"kind": type(raw).__name__},
            )
        text = str(raw)
        if len(text) > MAX_QUANTITY_TEXT:
            # As the API server refuses it (the CRD's maxLength): validate said valid.
            raise PydanticCustomError(
                "quantity", f"{shown(text)}: a quantity is at most {MAX_QUANTITY_TEXT} "
                "characters; write it with a suffix such as 28Gi")
        try:
            value = parse_quantity(text)
        except ValueError as exc:
            raise PydanticCustomError("quantity", str(exc)) from None
        if value < 0:
            raise PydanticCustomError("quantity",
                                      f"{shown(text)} is negative; quantities here are >= 0")
        return cls(text)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # The shape Kubernetes itself uses for resource.Quantity in CRDs (controller-gen's
        # pattern): without it the API server took 28GB, which the operator then refused
        # (InvalidSpec) after the sync had passed.
        # `minimum` for the integer form, which the pattern (strings only) does not reach:
        # without it the API server stored -1, which the operator refuses (InvalidSpec)
        # after the sync had passed, whenever the admission webhook was not there to say so.
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": MAX_QUANTITY_TEXT,
            "minimum": 0,
            "x-kubernetes-int-or-string": True,
        }


class Duration(str):
    """A Go-style duration (`30s`, `2m`, `75ms`), kept as written. `.seconds` is its length."""

    __slots__ = ()

    @property
    def seconds(self) -> float:
        return duration_seconds(self)

    @classmethod
    def _validate(cls, raw: Any) -> Duration:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise PydanticCustomError(
                "duration", "expected a duration such as 30s or 75ms, got {kind}",
                {"kind": type(raw).__name__},
            )
        text = str(raw)
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise PydanticCustomError("duration", str(exc)) from None
        if seconds > LONGEST_DURATION_S:
            raise PydanticCustomError(
                "duration", "{text} is longer than any field here takes (at most 168h, 7 days)",
                {"text": shown(text)})
        return cls(text)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"type": "string", "pattern": DURATION_PATTERN}
