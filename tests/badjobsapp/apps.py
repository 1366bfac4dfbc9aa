from django.apps import AppConfig


class BadJobsAppConfig(AppConfig):
    name = "tests.badjobsapp"
    label = "badjobsapp"
