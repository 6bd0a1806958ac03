"""Quantities and durations parse the way Kubernetes users write them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infertune.api.units import format_duration, parse_duration, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("28Gi", 28 * 2**30),
        ("512Mi", 512 * 2**20),
        ("500m", Decimal("0.5")),
        ("2", 2),
        ("1.5Gi", Decimal("1.5") * 2**30),
        ("1k", 1000),
        ("1e3", 1000),
        ("0", 0),
        # Leading zeros in the exponent: Kubernetes takes them (1e00005 is 1e5).
        ("1e00005", 100000), ("2e-00003", Decimal("0.002")),
        ("1e" + "0" * 5000 + "5", 100000),  # int() of it failed in Python's words
    ],
)
def test_quantity_values(text: str, value: Decimal | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "hint"),
    [("28GB", "unknown suffix 'GB'"), ("Gi", "not a Kubernetes quantity"),
     (" 1Gi", "not a Kubernetes quantity"), ("1..2", "not a Kubernetes quantity"),
     # Beyond an int64: decimal.Overflow escaped every handler (no InvalidSpec, a traceback
     # in validate), and 1e5000 passed validation to fail in plan.
     ("1e999999999", "larger than any resource Kubernetes counts"),
     ("1e5000", "larger than any resource Kubernetes counts"),
     ("9Ei", "larger than any resource Kubernetes counts"),
     # Python's int() refused the exponent in its own words (sys.set_int_max_str_digits).
     ("1e-" + "9" * 5000, "smaller than any quantity Kubernetes keeps"),
     ("1e" + "9" * 5000, "larger than any resource Kubernetes counts"),
     # An exponent without digits: 30e read as 30 (bytes), 1eM failed in int()'s words.
     ("30e", "unknown suffix 'e'"), ("1eM", "unknown suffix 'eM'"),
     ("3e1.5", "not a Kubernetes quantity")],
)
def test_bad_quantities_say_what_to_write(text: str, hint: str) -> None:
    with pytest.raises(ValueError, match=hint) as info:
        parse_quantity(text)
    # The value is echoed cut short: a 100 kB one made a 100 kB line in status.
    assert len(str(info.value)) < 200, str(info.value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("2m", 120), ("75ms", Decimal("0.075")), ("1m30s", 90), ("1h", 3600),
     ("1.5s", Decimal("1.5")), ("250us", Decimal("0.00025"))],
)
def test_durations(text: str, seconds: Decimal | int) -> None:
    assert parse_duration(text) == seconds


def test_bare_number_duration_suggests_seconds() -> None:
    with pytest.raises(ValueError, match="did you mean '30s' or '30ms'"):
        parse_duration("30")


@pytest.mark.parametrize("text", ["", "s", "-1s", "30 s", "1d", "3sec"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.5, "500ms"), (1.5, "1.5s"), (90, "1m30s"), (3600, "1h"), (3601, "1h0m1s"),
    (5400, "1h30m"), (33675, "9h21m15s"), (33675.25, "9h21m15.25s"), (-3, "-3s"),
    (10815, "3h0m15s"), (3600.5, "1h0m0.5s"),
])
def test_format_duration_spells_each_unit(seconds: float, text: str) -> None:
    # A breach 9 hours old read "33675s ago" in a reason; 3 hours and 15 seconds read
    # "3h15s", taken for 3 h 15 min at night (Go writes 3h0m15s).
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**9))
def test_format_duration_round_trips(millis: int) -> None:
    assert parse_duration(format_duration(millis / 1000)) * 1000 == millis
