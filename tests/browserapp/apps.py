from django.apps import AppConfig


class BrowserAppConfig(AppConfig):
    """The jobs and seeded history of the admin browser test (tests/test_browser.py)."""

    name = "tests.browserapp"
    label = "browserapp"
    default_auto_field = "django.db.models.BigAutoField"
