# mypy: disable-error-code="no-redef, dict-item"
"""Settings of the fault workers (``anarchon_worker`` processes started by tests/faults).

``FAULTS_BACKEND`` picks the store; the harness passes its address in ``FAULTS_*``
variables (private servers on free ports, a private RabbitMQ vhost, a temporary SQLite
file) and the jobs in ``FAULTS_JOBS`` (tests/faults/workerapp/jobs.py).
"""

import os
from typing import Any

from tests.settings import *  # noqa: F403

_ENV = os.environ.get
BACKEND = _ENV("FAULTS_BACKEND", "sqlite")
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_anarchon",
    "tests.faults.workerapp",
]
# tests/settings.py's TASKS names django_tasks_db's backend, whose app this list leaves out:
# Django 6 checks that (tasks.E001) and every command here would stop on it.
globals().pop("TASKS", None)
ROOT_URLCONF = "tests.faults.workerapp.urls"
MIDDLEWARE: list[str] = []

_db = _ENV("FAULTS_DB", "")
if _db == "postgres":
    _DEFAULT: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql", "NAME": _ENV("FAULTS_DB_NAME", "faults"),
        "HOST": "127.0.0.1", "PORT": _ENV("FAULTS_DB_PORT", "5432"),
        "USER": _ENV("FAULTS_DB_USER", "postgres"), "PASSWORD": "",
        "CONN_MAX_AGE": None, "OPTIONS": {"connect_timeout": 5},
    }
elif _db == "mysql":
    _DEFAULT = {
        "ENGINE": "django.db.backends.mysql", "NAME": _ENV("FAULTS_DB_NAME", "faults"),
        "HOST": "127.0.0.1", "PORT": _ENV("FAULTS_DB_PORT", "3306"),
        "USER": _ENV("FAULTS_DB_USER", "root"), "PASSWORD": "",
        "CONN_MAX_AGE": None, "OPTIONS": {"charset": "utf8mb4", "connect_timeout": 5},
    }
elif _db == "sqlite":
    _DEFAULT = {
        "ENGINE": "django.db.backends.sqlite3", "NAME": _ENV("FAULTS_DB_NAME", ""),
        "CONN_MAX_AGE": None,
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE", "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
else:  # a store outside the database: "default" only serves the run-request poller
    _DEFAULT = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
DATABASES = {"default": _DEFAULT}

_LEASE = _ENV("FAULTS_LEASE", "3s")
_TAG = _ENV("FAULTS_TAG", "faults")
_REDIS_URL = _ENV("FAULTS_REDIS_URL", "redis://127.0.0.1:6379/0")
_BACKENDS: dict[str, dict[str, Any]] = {
    "database": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend"},
    "redis-lease": {
        "BACKEND": "django_anarchon.backends.redis.RedisBackend",
        "OPTIONS": {"url": _REDIS_URL, "strategy": "lease", "key_prefix": _TAG},
    },
    "redis-stream-id": {
        "BACKEND": "django_anarchon.backends.redis.RedisBackend",
        "OPTIONS": {"url": _REDIS_URL, "strategy": "stream-id", "key_prefix": _TAG},
    },
    "redis-script": {
        "BACKEND": "django_anarchon.backends.redis.RedisBackend",
        "OPTIONS": {"url": _REDIS_URL, "strategy": {"name": "script", "window": "5m"},
                    "key_prefix": _TAG},
    },
    "valkey-lease": {
        "BACKEND": "django_anarchon.backends.valkey.ValkeyBackend",
        "OPTIONS": {"url": _REDIS_URL, "strategy": "lease", "key_prefix": _TAG},
    },
    "nats": {
        "BACKEND": "django_anarchon.backends.nats.NatsBackend",
        "OPTIONS": {"url": _ENV("FAULTS_NATS_URL", "nats://127.0.0.1:4222"),
                    "stream_prefix": _TAG.upper().replace("-", ""),
                    "subject_prefix": _TAG.replace("-", "")},
    },
    "rabbitmq": {
        "BACKEND": "django_anarchon.backends.rabbitmq.RabbitMQBackend",
        "OPTIONS": {"url": _ENV("FAULTS_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"),
                    "prefix": _TAG, "dedupe_window": "5m"},
    },
}
_KIND = "database" if BACKEND in ("postgres", "mariadb", "sqlite") else BACKEND
ANARCHON = {"default": {**_BACKENDS[_KIND], "LEASE": _LEASE}}
