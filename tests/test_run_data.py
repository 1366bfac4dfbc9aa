"""``parse_run_data``: the JSON of "Run now" and ``anarchon_run --data``, strict and bounded.

Each refusal here is text that Python's ``json`` reads but a store refuses later (as an
HTTP 500 in the admin or a traceback in the command), or that crashes ``json`` itself.
"""

from __future__ import annotations

import pytest

from django_anarchon.run_data import MAX_DATA_BYTES, MAX_DEPTH, RunDataError, parse_run_data


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"full": true, "n": [1, 2.5, null]}', {"full": True, "n": [1, 2.5, None]}),
        ('"caf\\u00e9 \\ud83d\\ude00"', "café 😀"),  # a surrogate pair is one character
        ("1e308", 1e308),
        ("1" * 4000, int("1" * 4000)),
        ('[[["deep enough"]]]', [[["deep enough"]]]),
        ('"[[[[" ', "[[[["),  # brackets inside strings do not nest
    ],
)
def test_standard_json_is_read(text: str, value: object) -> None:
    assert parse_run_data(text) == value


def test_nesting_up_to_the_limit_is_read() -> None:
    value = parse_run_data("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    for _ in range(MAX_DEPTH - 1):
        (value,) = value
    assert value == []


@pytest.mark.parametrize("text", [None, "", "  \n\t"])
def test_no_text_is_no_data(text: str | None) -> None:
    assert parse_run_data(text) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NaN", "NaN is not standard JSON; give a number or a string"),
        ('{"x": Infinity}', "Infinity is not standard JSON"),
        ("[-Infinity]", "-Infinity is not standard JSON"),
        ("1e999", "the number 1e999 is beyond a float's range"),
        ("[-1e400]", "the number -1e400 is beyond a float's range"),
        ("1" * 5000, "data holds an integer of more than 4,300 digits"),
        ("[" * 5000 + "]" * 5000, f"data nests deeper than {MAX_DEPTH} levels"),
        ('{"a": "x\\u0000y"}', "data holds the character \\u0000, which PostgreSQL cannot store"),
        ('{"\\u0000": 1}', "data holds the character \\u0000"),
        ('["\\ud800"]', "data holds a lone UTF-16 surrogate"),
        ('"\udcff"', "data holds a lone UTF-16 surrogate"),  # an undecodable argv byte
        ("{oops", "data is not valid JSON: Expecting property name enclosed in double quotes "
                  "at line 1 column 2"),
        ("[1, 2] x", "data is not valid JSON: Extra data at line 1 column 8"),
        ('"' + "x" * MAX_DATA_BYTES + '"', f"data is larger than {MAX_DATA_BYTES:,} bytes"),
    ],
    ids=lambda v: v[:20] if isinstance(v, str) else None,
)
def test_refusals_say_why_in_one_line(text: str, message: str) -> None:
    with pytest.raises(RunDataError) as info:
        parse_run_data(text)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
