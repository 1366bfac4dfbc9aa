# mypy: disable-error-code="no-redef, dict-item, call-overload"
"""Settings of the ``anarchon_worker`` subprocesses in tests/test_database_workers.py.

Environment: ``ANARCHON_DBW_ALIAS`` picks one of tests/settings.py's databases
("postgres" or "sqlite"; the test passes its name in ``ANARCHON_PG_NAME`` /
``ANARCHON_SQLITE_NAME``) as "default"; ``ANARCHON_DBW_SCENARIO`` picks the jobs
(tests/dbworkerapp/jobs.py); ``ANARCHON_DBW_LEASE`` is the lease. With
``ANARCHON_DBW_RUNS_ALIAS=runs`` the scheduler keeps its runs through a second alias of the
same database, so that django-tasks-db's enqueue (on "default") cannot share its transaction.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _DATABASES

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_anarchon",
    "django_tasks_db",
    "tests.dbworkerapp",
]
DATABASES = {"default": dict(_DATABASES[os.environ.get("ANARCHON_DBW_ALIAS", "postgres")])}
_RUNS_ALIAS = os.environ.get("ANARCHON_DBW_RUNS_ALIAS", "default")
DATABASES[_RUNS_ALIAS] = dict(DATABASES["default"])
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
ANARCHON = {
    "default": {
        "BACKEND": "django_anarchon.backends.database.DatabaseBackend",
        "OPTIONS": {"using": _RUNS_ALIAS},
        "LEASE": os.environ.get("ANARCHON_DBW_LEASE", "3s"),
        # Each handler thread keeps its connection (CONN_MAX_AGE=None): 4 workers hold up
        # to 4 x (10 + the store's 4 + a listener) of PostgreSQL's 100.
        "THREADS": 10,
        "JOB_DEFAULTS": {"history_size": 1000},
        # a spool of the test's own: a record spooled by one worker is replayed by the next
        "SPOOL": os.environ.get("ANARCHON_DBW_SPOOL") or None,
    },
}
ROOT_URLCONF = "tests.dbworkerapp.urls"
MIDDLEWARE: list[str] = []
