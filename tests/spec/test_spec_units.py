"""Sizes and durations with units (expr_tracker.spec.units)."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError

from expr_tracker.spec.units import Duration, OptionalDuration, Size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (4096, 4096),
        (1.4, 1),
        ("100", 100),
        ("100B", 100),
        ("500KB", 500_000),
        ("500kb", 500_000),
        ("1.5GB", 1_500_000_000),
        ("2MB", 2_000_000),
        ("1TB", 10**12),
        ("1KiB", 1024),
        ("64MiB", 64 * 1024**2),
        ("64 MiB", 64 * 1024**2),
        ("64mib", 64 * 1024**2),
        ("1GiB", 1024**3),
        ("1.5KiB", 1536),
        ("2TiB", 2 * 1024**4),
        (" 8MiB ", 8 * 1024**2),
    ],
)
def test_parse_size_valid(value, expected):
    result = parse_size(value)
    assert result == expected
    assert isinstance(result, int)


@pytest.mark.parametrize(
    "value", ["", "MiB", "64 megabytes", "64MB/s", "-1", -1, "1e", True, None, [1], math.inf, "nan"]
)
def test_parse_size_invalid_names_value_and_forms(value):
    with pytest.raises(ValueError) as info:
        parse_size(value)
    text = str(info.value)
    assert repr(value) in text
    assert "size" in text


def test_parse_size_error_lists_valid_forms():
    with pytest.raises(ValueError, match="MiB"):
        parse_size("64 megabytes")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0.0),
        (30, 30.0),
        (0.25, 0.25),
        ("30", 30.0),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("250us", 250e-6),
        ("250µs", 250e-6),
        ("100ns", 100e-9),
        ("5m", 300.0),
        ("1.5h", 5400.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1D", 86400.0),
        (" 10 s ", 10.0),
    ],
)
def test_parse_duration_valid(value, expected):
    assert parse_duration(value) == pytest.approx(expected)
    assert isinstance(parse_duration(value), float)


@pytest.mark.parametrize(
    "value", ["", "s", "5 minutes", "5mm", "-1s", -0.5, False, None, {}, "inf", math.nan]
)
def test_parse_duration_invalid(value):
    with pytest.raises(ValueError) as info:
        parse_duration(value)
    assert repr(value) in str(info.value)
    assert "duration" in str(info.value)


def test_parse_duration_error_lists_valid_forms():
    with pytest.raises(ValueError, match="500ms"):
        parse_duration("5 minutes")


class _M(BaseModel):
    size: Size = 0
    every: Duration = 1.0
    limit: OptionalDuration = 5.0


def test_pydantic_types_parse_units():
    m = _M(size="64MiB", every="500ms", limit="2m")
    assert (m.size, m.every, m.limit) == (64 * 1024**2, 0.5, 120.0)


def test_optional_duration_accepts_none_as_disabled():
    assert _M(limit=None).limit is None


def test_duration_type_rejects_none():
    with pytest.raises(ValidationError):
        _M(every=None)


def test_pydantic_types_reject_bad_units():
    with pytest.raises(ValidationError) as info:
        _M(size="12 parsecs", every="soon")
    assert len(info.value.errors()) == 2


def test_json_schema_accepts_numbers_and_strings():
    schema = _M.model_json_schema()["properties"]
    assert {"integer", "string"} <= {alt.get("type") for alt in schema["size"]["anyOf"]}
    assert {"number", "string"} <= {alt.get("type") for alt in schema["every"]["anyOf"]}
    assert "null" in {alt.get("type") for alt in schema["limit"]["anyOf"]}
