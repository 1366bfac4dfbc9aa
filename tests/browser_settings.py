"""Settings of the web server and worker subprocesses that tests/test_browser.py drives.

A file SQLite database (shared by the server, the worker and nothing else) and the
database backend, so a "Run now" filed by the web process is run by the worker; and a
memory scheduler autostarted in the web process, whose store keeps a ledger.
"""

import os

from tests.settings import *  # noqa: F403

DEBUG = True  # runserver serves the admin's CSS, so the screenshot looks like the admin
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
# browserapp: an every-5s job that sometimes fails and a long name (tests/browserapp/jobs.py)
INSTALLED_APPS = [*INSTALLED_APPS, "django.contrib.staticfiles", "tests.browserapp"]  # noqa: F405
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ANARCHON_BROWSER_DB", "browser-test.sqlite3"),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL;",
        },
    },
}
ANARCHON = {
    "default": {"BACKEND": "django_anarchon.backends.database.DatabaseBackend", "LEASE": "10s"},
    # A store with a ledger in the web process itself (the worker runs only "default"):
    # what the browser test pauses, resumes and dry-runs a backfill of.
    "ops": {
        "BACKEND": "django_anarchon.backends.memory.MemoryBackend", "AUTOSTART": True,
        "INSTANCE_ID": "web-ops", "LEASE": "5s",
    },
}
