from django.apps import AppConfig


class SwallowAppConfig(AppConfig):
    name = "tests.swallowapp"
    label = "swallowapp"
