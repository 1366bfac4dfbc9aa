"""The AppConfig.ready() recipe of docs/deployment.md: import the module that defines jobs."""

from django.apps import AppConfig


class OtherJobsConfig(AppConfig):
    name = "tests.otherjobsapp"
    label = "otherjobsapp"

    def ready(self) -> None:
        from . import schedules  # noqa: F401  (importing the module registers its jobs)
