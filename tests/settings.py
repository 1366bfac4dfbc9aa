"""Settings for the test suite. Extra databases are added by the backend test modules' needs."""

from __future__ import annotations

import os

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django_anarchon",
    "tests.testapp",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ANARCHON_TEST_SQLITE", ":memory:"),
    },
}
ANARCHON = {
    "default": {"BACKEND": "django_anarchon.backends.memory.MemoryBackend"},
}
