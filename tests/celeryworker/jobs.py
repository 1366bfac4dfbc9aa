"""With ``ANARCHON_DBW_SCENARIO=celery``: one job every 2 s that sends ``anarchon_tests.record``
(tests/celeryapp, on the broker and queue of ``ANARCHON_CELERY_*``), max_attempts 3, with the
pause points of tests/dbworkerapp/jobs.py before and around its enqueue (``ANARCHON_DBW_PAUSE``)."""

from __future__ import annotations

import os

if os.environ.get("ANARCHON_DBW_SCENARIO") == "celery":
    from django_anarchon import every
    from django_anarchon.enqueue.celery import CeleryTarget
    from tests.celeryapp import app
    from tests.dbworkerapp.jobs import PausingTarget, claimed_pause

    every("2s", name="beat", max_attempts=3, data=claimed_pause)(
        PausingTarget(CeleryTarget(app.tasks["anarchon_tests.record"]))
    )
