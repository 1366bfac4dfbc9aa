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
# The beat for django.tasks (tests/test_tasks*.py): django-tasks-db's table and backend, when
# the [tasks] extra is installed (it is in [dev]).
try:
    import django_tasks_db  # noqa: F401
except ImportError:
    pass
else:
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
# "default" stays SQLite in memory. The other aliases serve the database backend's tests
# (tests/conftest.py): each test run creates its own database on the server (or its own
# file) and points the alias's NAME at it (and the ANARCHON_*_NAME variable, for the
# subprocesses it starts), so the names below are only placeholders.
# CONN_MAX_AGE=None: worker threads keep their connection (see docs/backends/database.md).
_PG_HOST = os.environ.get("ANARCHON_PG_HOST", "127.0.0.1")
_MYSQL_HOST = os.environ.get("ANARCHON_MYSQL_HOST", "127.0.0.1")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ANARCHON_TEST_SQLITE", ":memory:"),
    },
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ANARCHON_SQLITE_NAME", "anarchon-placeholder.sqlite3"),
        "CONN_MAX_AGE": None,
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    },
    "postgres": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("ANARCHON_PG_NAME", "anarchon_placeholder"),
        "HOST": _PG_HOST,
        "PORT": os.environ.get("ANARCHON_PG_PORT", "5432"),
        "USER": os.environ.get("ANARCHON_PG_USER", "postgres"),
        "PASSWORD": os.environ.get("ANARCHON_PG_PASSWORD", ""),
        "CONN_MAX_AGE": None,
        "OPTIONS": {"connect_timeout": 5},
    },
    "mysql": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": os.environ.get("ANARCHON_MYSQL_NAME", "anarchon_placeholder"),
        "HOST": _MYSQL_HOST,
        "PORT": os.environ.get("ANARCHON_MYSQL_PORT", "3306"),
        "USER": os.environ.get("ANARCHON_MYSQL_USER", "root"),
        "PASSWORD": os.environ.get("ANARCHON_MYSQL_PASSWORD", ""),
        "CONN_MAX_AGE": None,
        "OPTIONS": {"charset": "utf8mb4", "connect_timeout": 5},
    },
}
ANARCHON = {
    "default": {"BACKEND": "django_anarchon.backends.memory.MemoryBackend"},
}
# The admin pages and their tests (tests/test_admin*.py, tests/test_browser.py).
ROOT_URLCONF = "tests.urls"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
STATIC_URL = "/static/"
