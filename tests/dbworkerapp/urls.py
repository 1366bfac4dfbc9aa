"""No views: the worker processes only run jobs."""

urlpatterns: list[object] = []
