from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class AnarchonConfig(AppConfig):
    name = "django_anarchon"
    label = "django_anarchon"
    verbose_name = _("Scheduled jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import request_started, setting_changed
        from django.utils.module_loading import autodiscover_modules

        from . import checks, conf  # noqa: F401  (checks registers the system checks)
        from .autostart import autostarter
        from .handler import schedulers
        from .registry import registry

        setting_changed.connect(conf.reset, dispatch_uid="django_anarchon.conf.reset")
        setting_changed.connect(schedulers.reset, dispatch_uid="django_anarchon.handler.reset")
        request_started.connect(
            autostarter.on_request_started, dispatch_uid="django_anarchon.autostart"
        )
        # A bad decorator must not break django.setup() (the web process, the shell):
        # its error is kept and reported by the system checks (anarchon.E004).
        with registry.collecting():
            autodiscover_modules("jobs")
