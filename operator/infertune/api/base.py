"""What every API model shares: camelCase field names, no unknown fields, cross-field errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# The error type used for rules that span fields; `ctx["problems"]` lists (field, message)
# so the formatter can point at the exact field instead of the section holding it.
CROSS_FIELD_ERROR = "infertune_cross_field"


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
