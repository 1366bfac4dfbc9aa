"""Durations as users write them, and their shortest spelling back."""

from __future__ import annotations

import math
import random
from datetime import timedelta

import pytest

from django_anarchon.durations import format_duration, parse_duration, parse_optional_duration
from django_anarchon.exceptions import ConfigurationError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("250ms", 250),
        ("1ms", 1),
        ("10s", 10_000),
        ("1.5s", 1_500),
        ("1m30s", 90_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1w", 604_800_000),
        ("1w2d3h4m5s6ms", 604_800_000 + 2 * 86_400_000 + 3 * 3_600_000 + 4 * 60_000 + 5_006),
        (" 1m 30s ", 90_000),
        ("10S", 10_000),
        ("0s", 0),
        (timedelta(minutes=1, seconds=30), 90_000),
        (timedelta(milliseconds=1), 1),
        (10, 10_000),
        (0, 0),
        (0.25, 250),
        (1.0005, 1_000),  # rounds to the nearest millisecond
    ],
)
def test_parse_accepted_forms(value: object, expected: int) -> None:
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (-1, "negative"),
        (timedelta(seconds=-1), "negative"),
        ("-1s", "not a duration"),
        (True, "expected a duration"),
        (False, "expected a duration"),
        (None, "expected a duration"),
        ("soon", "not a duration"),
        ("", "not a duration"),
        ("10", "not a duration"),
        ("10 parsecs", "not a duration"),
        ("1m30", "not a duration"),
        ([10], "got list"),
        (float("inf"), "finite"),
        (0.0004, "shorter than 1 ms"),
        ("0.4ms", "shorter than 1 ms"),
        (timedelta(microseconds=100), "shorter than 1 ms"),
    ],
)
def test_errors_name_job_option_and_value(value: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_duration(value, job="nightly-report", option="timeout")
    error = info.value
    assert error.job == "nightly-report"
    assert error.option == "timeout"
    assert error.value is value
    message = str(error)
    assert "job 'nightly-report'" in message
    assert "option 'timeout'" in message
    assert repr(value) in message
    assert fragment in message


def test_nan_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="finite") as info:
        parse_duration(float("nan"), job="j", option="every")
    assert isinstance(info.value.value, float) and math.isnan(info.value.value)


def test_zero_refused_when_not_allowed() -> None:
    with pytest.raises(ConfigurationError, match="longer than zero") as info:
        parse_duration("0s", job="j", option="every", allow_zero=False)
    assert (info.value.job, info.value.option, info.value.value) == ("j", "every", "0s")


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_optional_duration() -> None:
    assert parse_optional_duration(None) is None
    assert parse_optional_duration("5s") == 5_000
    with pytest.raises(ConfigurationError):
        parse_optional_duration("0s", job="j", option="lease", allow_zero=False)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (1, "1ms"),
        (250, "250ms"),
        (1_000, "1s"),
        (1_500, "1s500ms"),
        (90_000, "1m30s"),
        (3_600_001, "1h1ms"),
        (86_400_000, "1d"),
        (604_800_000, "7d"),
        (math.inf, "forever"),
    ],
)
def test_format(ms: float, text: str) -> None:
    assert format_duration(ms) == text


def test_round_trip() -> None:
    rng = random.Random(20261129)
    samples = [0, 1, 999, 1_000, 59_999, 60_000, 3_599_999, 86_399_999, 86_400_000, 10**12]
    samples += [rng.randrange(1, 10**11) for _ in range(2_000)]
    for ms in samples:
        text = format_duration(ms)
        assert parse_duration(text) == ms, text


def test_parse_then_format_is_canonical() -> None:
    for text in ("90s", "1m30s", "0.5s", "1440m", "1w"):
        assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)
    assert format_duration(parse_duration("90s")) == "1m30s"
    assert format_duration(parse_duration("1440m")) == "1d"
