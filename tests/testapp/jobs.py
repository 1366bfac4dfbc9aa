"""Found by autodiscovery: proves that an installed app's jobs.py is imported at start-up."""

from __future__ import annotations

from django_anarchon import cron, every, scheduled


@every("1h", history_size=5)
def hourly_cleanup(ctx: object) -> None:
    """Named ``testapp.hourly_cleanup`` by default."""


@cron("0 8 * * 1-5", timezone="Europe/Athens", name="morning-report")
async def morning_report(ctx: object) -> None:
    """An async handler with an explicit name."""


@scheduled(prefix="billing")
class BillingJobs:
    @every("1h", jitter="30s")
    def reconcile(self, ctx: object) -> None:
        """Named ``billing.reconcile``."""
