"""Jobs with the mistakes a newcomer makes, for tests/test_registration_errors.py.

Autodiscovery must import this module, keep each error, and go on: ``django.setup()``
succeeds, the valid jobs are registered, and ``manage.py check`` names every mistake.
"""

from __future__ import annotations

from django_anarchon import cron, every, scheduled


@every("1h", name="badjobs.fine")
def fine(ctx: object) -> None:
    """Valid: registered despite the mistakes around it."""


@cron("*/5 * * *", name="badjobs.typo")
def typo(ctx: object) -> None:
    """A cron expression with a field missing."""


@every("10s", name="badjobs.late", max_late="soon")
def late(ctx: object) -> None:
    """An option that is not a duration."""


@scheduled(prefix="badjobs.billing")
class Billing:
    @every("1h", overlap="sometimes")
    def reconcile(self, ctx: object) -> None:
        """The class's only job method is invalid: one error, not a second for the class."""


@every("1h", name="badjobs.after")
def after(ctx: object) -> None:
    """Valid, after the mistakes: the module was imported to its end."""
