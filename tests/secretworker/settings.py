"""Settings of the ``anarchon_worker`` subprocesses of tests/test_secrets.py.

``ANARCHON_SECRET_BACKEND`` is the dotted path of the backend, ``ANARCHON_SECRET_OPTIONS``
its ``OPTIONS`` as JSON (URLs with a password). The PostgreSQL alias's ``PASSWORD`` comes
from ``ANARCHON_PG_PASSWORD`` (tests/settings.py); the test server trusts loopback, so
any password works.
"""

import json
import os

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.secretworker"]  # noqa: F405
ANARCHON = {
    "default": {
        "BACKEND": os.environ.get(
            "ANARCHON_SECRET_BACKEND", "django_anarchon.backends.memory.MemoryBackend"
        ),
        "OPTIONS": json.loads(os.environ.get("ANARCHON_SECRET_OPTIONS", "{}")),
    },
}
