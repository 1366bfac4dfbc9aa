"""Settings of the ``anarchon_worker`` subprocesses of tests/test_celery_workers.py.

tests/db_worker_settings.py (a PostgreSQL database of the test's own, the database
backend), with the Celery job of tests/celeryworker.
"""

from tests.db_worker_settings import *  # noqa: F403
from tests.db_worker_settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "tests.celeryworker"]
