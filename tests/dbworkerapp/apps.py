from django.apps import AppConfig


class DbWorkerAppConfig(AppConfig):
    name = "tests.dbworkerapp"
    label = "dbworkerapp"
    default_auto_field = "django.db.models.BigAutoField"
