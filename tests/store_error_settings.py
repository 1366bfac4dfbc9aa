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
ROOT_URLCONF = "tests.dbworkerapp.urls"
MIDDLEWARE: list[str] = []
if os.environ.get("ANARCHON_SE_KIND") == "redis":
    ANARCHON = {
        "default": {
            "BACKEND": "django_anarchon.backends.redis.RedisBackend",
            "OPTIONS": {"url": os.environ["ANARCHON_SE_URL"], "key_prefix": "anarchon-se"},
        },
    }
else:
    DATABASES = {"default": dict(_DATABASES[os.environ.get("ANARCHON_SE_DB", "postgres")])}
    ANARCHON = {"default": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend"}}
