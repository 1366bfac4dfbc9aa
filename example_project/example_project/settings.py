"""Settings of the example project.

SQLite by default, configured for several worker processes (WAL, IMMEDIATE
transactions, a generous lock timeout). Environment variables switch the store:

- ``EXAMPLE_SQLITE``: the SQLite file (default ``db.sqlite3`` beside manage.py);
- ``EXAMPLE_DATABASE=postgres``: PostgreSQL instead, from ``PGHOST``, ``PGPORT``,
  ``PGDATABASE``, ``PGUSER`` and ``PGPASSWORD``;
- ``EXAMPLE_BACKEND=redis``: keep runs in Redis (``EXAMPLE_REDIS_URL``) rather than in
  the database; the database still holds the admin's users and run requests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("EXAMPLE_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("EXAMPLE_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_anarchon",
    "inventory",
    "reports",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
WSGI_APPLICATION = None

if os.environ.get("EXAMPLE_DATABASE", "sqlite") == "postgres":
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "NAME": os.environ.get("PGDATABASE", "test"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("EXAMPLE_SQLITE", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": {
                # Several worker processes share this file: take the write lock at BEGIN,
                # wait for it instead of failing, and let readers run beside the writer.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

if os.environ.get("EXAMPLE_BACKEND", "database") == "redis":
    ANARCHON = {
        "default": {
            "BACKEND": "django_anarchon.backends.redis.RedisBackend",
            "OPTIONS": {
                "url": os.environ.get("EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/0"),
                "strategy": "lease",
            },
            "LEASE": "15s",
        }
    }
else:
    ANARCHON = {
        "default": {
            "BACKEND": "django_anarchon.backends.database.DatabaseBackend",
            "OPTIONS": {"using": "default"},
            "LEASE": "15s",
            "JOB_DEFAULTS": {"history_size": 200},
        }
    }

LANGUAGE_CODE = "en-us"
TIME_ZONE = "Europe/Athens"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_anarchon": {"handlers": ["console"], "level": "INFO"}},
}
