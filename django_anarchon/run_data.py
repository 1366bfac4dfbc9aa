"""The ``data`` an operator hands to "Run now": strict JSON, bounded, or a clear refusal.

Python's ``json`` accepts ``NaN``, ``Infinity`` and ``-Infinity`` (which no other JSON
reader does, and which PostgreSQL's ``jsonb`` refuses), reads ``1e999`` as infinity,
raises a bare ``ValueError`` for an integer of more than 4,300 digits, and recurses once
per nested bracket (5,000 of them raise ``RecursionError``). PostgreSQL's ``jsonb`` also
refuses the character ``\\u0000`` and a lone UTF-16 surrogate (``"\\ud800"``, or an
undecodable byte of a command-line argument). The admin form and ``anarchon_run --data``
both parse through here, so both refuse the same things with the same words, before the
value reaches a store.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

__all__ = ["MAX_DATA_BYTES", "MAX_DEPTH", "RunDataError", "parse_run_data"]

MAX_DEPTH = 64
MAX_DATA_BYTES = 1_000_000


class RunDataError(ValueError):
    """The text is not data a run can carry; the message says why, in one line."""


def _refuse_constant(name: str) -> Any:
    raise RunDataError(f"{name} is not standard JSON; give a number or a string")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RunDataError(f"the number {text[:40]} is beyond a float's range")
    return value


def _depth_exceeds(text: str, limit: int) -> bool:
    """True if brackets outside strings nest deeper than ``limit``."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _text_problem(value: Any) -> str | None:
    """Why a string (or key) inside ``value`` cannot be stored, or ``None``."""
    if isinstance(value, str):
        if "\x00" in value:
            return "data holds the character \\u0000, which PostgreSQL cannot store"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "data holds a lone UTF-16 surrogate (like \\ud800), which is not text"
        return None
    if isinstance(value, dict):
        items: list[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:  # the depth is bounded above, so this recursion is too
        problem = _text_problem(item)
        if problem:
            return problem
    return None


def parse_run_data(text: str | None) -> Any:
    """``None`` for no text; else the JSON value, or :class:`RunDataError`."""
    if text is None or not text.strip():
        return None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_DATA_BYTES:
        raise RunDataError(f"data is larger than {MAX_DATA_BYTES:,} bytes")
    if _depth_exceeds(text, MAX_DEPTH):
        raise RunDataError(f"data nests deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise RunDataError(
            f"data is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RunDataError:
        raise
    except ValueError:  # an integer longer than Python converts
        raise RunDataError(
            f"data holds an integer of more than {sys.get_int_max_str_digits():,} digits"
        ) from None
    problem = _text_problem(value)
    if problem:
        raise RunDataError(problem)
    return value
