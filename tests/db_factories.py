"""Backend factories that ``race_in_processes`` imports in fresh (spawned) processes.

The parent's fixtures export the database names in ``ANARCHON_*_NAME``, which
``tests/settings.py`` reads, so every process talks to the same database.
"""

from __future__ import annotations

import os

import django

from django_anarchon.backends.database import DatabaseBackend


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()


def postgres() -> DatabaseBackend:
    _setup()
    return DatabaseBackend(using="postgres")


def mysql() -> DatabaseBackend:
    _setup()
    return DatabaseBackend(using="mysql")


def sqlite() -> DatabaseBackend:
    _setup()
    return DatabaseBackend(using="sqlite")
