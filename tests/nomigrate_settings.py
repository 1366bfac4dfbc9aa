"""Settings of the subprocesses in tests/test_migrate_check.py: a database never migrated.

``ANARCHON_NOMIGRATE_KIND`` is "sqlite" or "postgres" (tests/settings.py's alias of that
name), ``ANARCHON_NOMIGRATE_NAME`` the file or database the test made for the run.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _DATABASES

DATABASES = {"default": {
    **_DATABASES[os.environ.get("ANARCHON_NOMIGRATE_KIND", "sqlite")],
    "NAME": os.environ.get("ANARCHON_NOMIGRATE_NAME", "anarchon-nomigrate.sqlite3"),
}}
ANARCHON = {
    "default": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend"},
    "fast": {"BACKEND": "django_anarchon.backends.memory.MemoryBackend"},
}
