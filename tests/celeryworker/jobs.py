"""With ``ANARCHON_DBW_SCENARIO=celery``: one job every 2 s that sends ``anarchon_tests.record``
(tests/celeryapp, on the broker and queue of ``ANARCHON_CELERY_*``), max_attempts 3, with the
pause points of tests/dbworkerapp/jobs.py before and around its enqueue (``ANARCHON_DBW_PAUSE``);
with ``ANARCHON_CELERY_IDEMPOTENT`` set, it sends ``anarchon_tests.record_once`` as an
idempotent target instead."""

from __future__ import annotations

import os

if os.environ.get("ANARCHON_DBW_SCENARIO") == "celery":
    from django_anarchon import every
    from django_anarchon.enqueue.celery import CeleryTarget
    from tests.celeryapp import app
    from tests.dbworkerapp.jobs import PausingTarget, claimed_pause

    if os.environ.get("ANARCHON_CELERY_IDEMPOTENT"):  # the task does its work once per id
        target = CeleryTarget(app.tasks["anarchon_tests.record_once"], idempotent=True)
    else:
        target = CeleryTarget(app.tasks["anarchon_tests.record"])
    every("2s", name="beat", max_attempts=3, data=claimed_pause)(PausingTarget(target))
