"""``settings.ANARCHON``: named schedulers, read lazily over defaults.

Read on first use and cached; the cache is dropped on ``setting_changed`` so that
``override_settings(ANARCHON=...)`` works in tests. Nothing is read at import time.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings

from .exceptions import ConfigurationError

DEFAULT_ALIAS = "default"
DEFAULT_BACKEND = "django_anarchon.backends.database.DatabaseBackend"

#: The keys of one scheduler's settings, with their defaults.
SCHEDULER_DEFAULTS: dict[str, Any] = {
    "BACKEND": DEFAULT_BACKEND,
    "OPTIONS": {},
    "LEASE": "30s",
    "HEARTBEAT": None,  # a third of LEASE
    "JOB_DEFAULTS": {},
    "INSTANCE_ID": None,  # host-pid-random
    "THREADS": 10,
    "DATA": None,
    "AUTOSTART": False,
    "SPOOL": None,  # the default spool directory; False: no spool
}


def default_spool_directory() -> Path:
    """Where records the store could not take wait, unless ``SPOOL`` says otherwise.

    Private to the user (``0700``, per uid), so that two users of one machine never share
    it. Containers should mount a volume here or set ``SPOOL`` to one (docs/deployment.md).
    """
    uid = getattr(os, "getuid", lambda: "user")()
    return Path(tempfile.gettempdir()) / f"django-anarchon-{uid}" / "spool"


def spool_directory(value: Any, option: str = "SPOOL") -> Path | None:
    """``SPOOL`` as a directory, or ``None`` for no spool (``False``)."""
    if value is False:
        return None
    if value is None:
        return default_spool_directory()
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigurationError(
            "expected a directory (a path), None for the default one, or False for no spool",
            option=option, value=value,
        )
    return Path(value)


@functools.cache
def get_config() -> dict[str, dict[str, Any]]:
    """Every configured scheduler's settings, each merged over ``SCHEDULER_DEFAULTS``."""
    raw = getattr(settings, "ANARCHON", None)
    if raw is None:
        raw = {DEFAULT_ALIAS: {}}
    if not isinstance(raw, dict):
        raise ConfigurationError(
            "settings.ANARCHON must be a dict of named schedulers, like CACHES",
            option="ANARCHON", value=raw,
        )
    config: dict[str, dict[str, Any]] = {}
    for alias, entry in raw.items():
        if not isinstance(entry, dict):
            raise ConfigurationError(
                f"scheduler {alias!r} must be a dict of settings", option=f"ANARCHON[{alias!r}]",
                value=entry,
            )
        unknown = set(entry) - set(SCHEDULER_DEFAULTS)
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigurationError(
                f"unknown key in scheduler {alias!r}; known keys: {', '.join(SCHEDULER_DEFAULTS)}",
                option=f"ANARCHON[{alias!r}][{name!r}]", value=entry[name],
            )
        config[alias] = {**SCHEDULER_DEFAULTS, **entry}
    return config


def reset(**kwargs: Any) -> None:
    """``setting_changed`` receiver: forget cached settings when ANARCHON changes."""
    if kwargs.get("setting") in (None, "ANARCHON"):
        get_config.cache_clear()
