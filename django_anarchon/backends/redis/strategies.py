"""The claim strategies of the Redis and Valkey backends and the validation of their settings.

A strategy is named by a string (``"lease"``) or by a dict that carries its own settings
(``{"name": "script", "window": "5m"}``). Settings are checked when the backend is built,
so a typo fails at startup with the option and the value in the message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ...durations import format_duration, parse_duration
from ...exceptions import ConfigurationError
from ...redact import redact_value

__all__ = ["STRATEGY_NAMES", "StrategyName", "StrategySettings", "parse_strategy"]

StrategyName = Literal["lease", "stream-id", "script", "idmp"]
STRATEGY_NAMES: tuple[StrategyName, ...] = ("lease", "stream-id", "script", "idmp")

DEFAULT_LEASE_WINDOW_MS = 86_400_000  # lease: how long claim() keys live (runs.claim() differs)
DEFAULT_SCRIPT_WINDOW_MS = 300_000
DEFAULT_MAXLEN = 1000
IDMP_MIN_VERSION = (8, 6)

_ALLOWED: dict[str, frozenset[str]] = {
    "lease": frozenset({"window"}),
    "stream-id": frozenset({"maxlen"}),
    "script": frozenset({"window"}),
    "idmp": frozenset({"duration_sec", "max_size", "maxlen"}),
}


@dataclass(frozen=True)
class StrategySettings:
    """A validated strategy: its name and the settings that apply to it."""

    name: StrategyName
    window_ms: int = 0
    maxlen: int = DEFAULT_MAXLEN
    duration_sec: int = 300
    max_size: int = 1000

    @property
    def dedupe_window_ms(self) -> float:
        """How long a claim made with ``claim()`` is remembered."""
        if self.name == "stream-id":
            return math.inf
        if self.name == "idmp":
            return self.duration_sec * 1000
        return self.window_ms

    def describe(self) -> str:
        if self.name in ("lease", "script"):
            return f"{self.name}, window {format_duration(self.window_ms)}"
        if self.name == "idmp":
            return f"idmp, duration {self.duration_sec}s, max_size {self.max_size}"
        return self.name


def _int_in(value: Any, option: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(
            f"expected a whole number from {low} to {high}", option=option, value=value
        )
    return value


def parse_strategy(
    value: object, *, backend: str, allowed: tuple[StrategyName, ...] = STRATEGY_NAMES
) -> StrategySettings:
    """Validate ``strategy=``: a name, or a dict with ``name`` and that strategy's settings."""
    settings: Mapping[str, Any]
    if isinstance(value, str):
        name: object = value
        settings = {}
    elif isinstance(value, Mapping):
        if "name" not in value:
            raise ConfigurationError(
                "a strategy dict needs a 'name', e.g. {'name': 'script', 'window': '5m'}",
                option="strategy", value=redact_value(dict(value)),
            )
        name = value["name"]
        settings = {k: v for k, v in value.items() if k != "name"}
    else:
        raise ConfigurationError(
            "expected a strategy name or a dict with 'name'", option="strategy", value=value
        )
    if name == "idmp" and "idmp" not in allowed:
        raise ConfigurationError(
            f"{backend} has no idempotent XADD (IDMP, Redis 8.6+); choose one of "
            + ", ".join(repr(n) for n in allowed),
            option="strategy", value=name,
        )
    if name not in allowed:
        raise ConfigurationError(
            "unknown strategy; choose one of " + ", ".join(repr(n) for n in allowed),
            option="strategy", value=name,
        )
    assert isinstance(name, str)
    unknown = sorted(set(settings) - _ALLOWED[name])
    if unknown:
        known = ", ".join(sorted(_ALLOWED[name])) or "none"
        raise ConfigurationError(
            f"unknown setting {unknown[0]!r} for the {name!r} strategy (known: {known})",
            option=f"strategy.{unknown[0]}", value=redact_value(settings[unknown[0]]),
        )
    if name == "lease":
        window = parse_duration(
            settings.get("window", DEFAULT_LEASE_WINDOW_MS / 1000),
            option="strategy.window", allow_zero=False,
        )
        return StrategySettings("lease", window_ms=window)
    if name == "script":
        window = parse_duration(
            settings.get("window", DEFAULT_SCRIPT_WINDOW_MS / 1000),
            option="strategy.window", allow_zero=False,
        )
        return StrategySettings("script", window_ms=window)
    maxlen = _int_in(settings.get("maxlen", DEFAULT_MAXLEN), "strategy.maxlen", 1, 10_000_000)
    if name == "stream-id":
        return StrategySettings("stream-id", maxlen=maxlen)
    duration = _int_in(settings.get("duration_sec", 300), "strategy.duration_sec", 1, 86_400)
    max_size = _int_in(settings.get("max_size", 1000), "strategy.max_size", 1, 10_000)
    return StrategySettings(
        "idmp", maxlen=maxlen, duration_sec=duration, max_size=max_size
    )
