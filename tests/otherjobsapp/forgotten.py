"""Jobs in a module nothing imports: never registered (the pitfall the docs warn about)."""

from typing import Any

from django_anarchon import every


@every("1m")
def never_found(ctx: Any) -> None:
    """Not in anarchon_jobs: no module imports this one."""
