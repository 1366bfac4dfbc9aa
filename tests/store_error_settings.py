# mypy: disable-error-code="no-redef, dict-item"
"""Settings of the command subprocesses in tests/test_command_errors.py: a store that fails.

Environment: ``ANARCHON_SE_KIND`` is ``redis`` (``ANARCHON_SE_URL`` is its URL) or
``database`` (tests/settings.py's ``ANARCHON_PG_*`` / ``ANARCHON_SQLITE_NAME`` variables
point the ``ANARCHON_SE_DB`` alias, "postgres" or "sqlite", at a server or file).
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _DATABASES

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_anarchon",
    "tests.storeerrorsapp",
]
# tests/settings.py's TASKS names django_tasks_db's backend, whose app this list leaves out:
# Django 6 checks that (tasks.E001) and every command here would stop on it.
globals().pop("TASKS", None)
ROOT_URLCONF = "tests.dbworkerapp.urls"
MIDDLEWARE: list[str] = []
if os.environ.get("ANARCHON_SE_KIND") == "redis":
    # Only the in-memory default: Django 6.1's command checks validate the models against
    # every configured database, and tests/settings.py's server aliases name databases
    # that only a test run creates.
    DATABASES = {"default": dict(_DATABASES["default"])}
    ANARCHON = {
        "default": {
            "BACKEND": "django_anarchon.backends.redis.RedisBackend",
            "OPTIONS": {"url": os.environ["ANARCHON_SE_URL"], "key_prefix": "anarchon-se"},
        },
    }
else:
    DATABASES = {"default": dict(_DATABASES[os.environ.get("ANARCHON_SE_DB", "postgres")])}
    ANARCHON = {"default": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend"}}
