from django.apps import AppConfig


class WorkerAppConfig(AppConfig):
    name = "tests.workerapp"
    label = "workerapp"
