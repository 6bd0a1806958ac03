"""What every API model shares: camelCase field names, no unknown fields, cross-field errors."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# The error type used for rules that span fields; `ctx["problems"]` lists (field, message)
# so the formatter can point at the exact field instead of the section holding it.
CROSS_FIELD_ERROR = "infertune_cross_field"


def _number(value: Any) -> Any:
    """A number as the API server takes one: pydantic alone turns the string "2" and true into
    2 and 1, which `kubectl apply` refuses (and `minReplicas: yes` would mean one replica)."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        # Not a number in quotes (and inf or nan, which YAML spells .inf and .nan): "write it
        # without quotes" misled.
        # Digits of another script (U+FF13, a fullwidth 3) are a number to Python, not to
        # the API server: "write it without quotes" did not help.
        if (math.isnan(number) or value.strip().lstrip("+-")[:1].isalpha()
                or not value.isascii()):
            raise PydanticCustomError(
                "infertune_not_a_number", "{shown} is not a number; give a number",
                {"shown": repr(value)[:60]})
        if math.isinf(number):
            # Beyond a float (1e400, thousands of digits), the reader keeps even an unquoted
            # one as the string it is, as kubectl does: quotes are not what is wrong.
            text = value.strip()
            raise PydanticCustomError(
                "infertune_number_out_of_range",
                "{shown} is out of range: a number beyond what a 64-bit float holds; give a "
                "smaller one", {"shown": text if len(text) <= 40 else
                                f"{text[:20]}... ({len(text)} characters)"})
        raise PydanticCustomError(
            "infertune_quoted_number",
            "{shown} is a string, not a number; write it without quotes",
            {"shown": repr(value)[:60]})
    if isinstance(value, bool):
        raise PydanticCustomError(
            "infertune_bool_number", "{shown} is a boolean, not a number; give a number",
            {"shown": str(value).lower()})
    return value


def _flag(value: Any) -> Any:
    """true or false, and nothing else: pydantic alone reads "yes", "off", 1 and 0 as ones."""
    if not isinstance(value, bool):
        raise PydanticCustomError(
            "infertune_not_a_flag", "{shown} is not true or false; write true or false{hint}",
            {"shown": repr(value)[:60],
             "hint": " without quotes" if isinstance(value, str) else ""})
    return value


def int64(value: int) -> int:
    """An integer the API server can store (it refuses one beyond an int64 as not an
    integer); for an AfterValidator where a `maximum` in the CRD is not wanted."""
    if not -(2**63) <= value <= 2**63 - 1:
        raise PydanticCustomError("infertune_int64", "{value} is beyond what the API server "
                                  "stores (at most 2^63-1)", {"value": str(value)[:30]})
    return value


def without_nulls(value: Any) -> Any:
    """A map entry given as null is dropped, as the API server prunes it (a model's fields, and
    a BeforeValidator of a dict field: labels, nodeSelector)."""
    if isinstance(value, dict) and None in value.values():
        return {k: v for k, v in value.items() if v is not None}
    return value


NUMBER = BeforeValidator(_number)
"""Put last in the Annotated of every int and float field (after its Field, whose bounds then
reach the CRD schema as minimum and maximum). An integral float such as 2.0 is an integer, as
the API server takes it."""
FLAG = BeforeValidator(_flag)
"""Put in the Annotated of every bool field."""


def no_schema_default(schema: dict[str, Any]) -> None:
    """A field's `json_schema_extra`: its default stays out of the CRD, so the API server does
    not write it into stored objects (the operator applies it when it reads them). For a field
    an older release does not know: rolled back to it (the CRD stays, Helm never downgrades
    it), the operator would refuse every object holding it as an unknown field. For a field of
    a list item: Argo CD compares a list whole, and the value the API server filled into each
    item (`pause: 1m` of a canary step) showed as a drift from Git that never settles."""
    schema.pop("default", None)


class ApiModel(BaseModel):
    """Base of the InferenceTuning models: fields are camelCase in YAML, unknown ones rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
        allow_inf_nan=False,  # .inf or .nan in YAML is no target, ratio or bound
    )

    @model_validator(mode="before")
    @classmethod
    def _nulls_left_out(cls, data: Any) -> Any:
        """A field given as null is left out, as the API server prunes it (no field of the CRD
        is nullable): `numa: null` is the default NUMA section there, and here too."""
        return without_nulls(data)


class CrossFieldProblems:
    """Collects cross-field problems in a model validator and raises them all at once."""

    def __init__(self) -> None:
        self._problems: list[tuple[str, str]] = []

    def add(self, field: str, message: str) -> None:
        self._problems.append((field, message))

    def raise_if_any(self) -> None:
        if self._problems:
            raise PydanticCustomError(
                CROSS_FIELD_ERROR,
                "; ".join(f"{field}: {message}" for field, message in self._problems),
                {"problems": list(self._problems)},
            )
