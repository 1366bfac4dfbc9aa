"""What the handlers of the multi-process tests write themselves, beside the history."""

from __future__ import annotations

from django.db import models


class Execution(models.Model):
    """One handler call: (job, slot) must appear once per run, whatever the history says."""

    job = models.CharField(max_length=100)
    slot = models.BigIntegerField()
    instance_id = models.CharField(max_length=100)
    attempt = models.IntegerField()
    note = models.CharField(max_length=100, default="")
    at = models.DateTimeField(auto_now_add=True)
