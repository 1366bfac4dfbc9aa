"""No views: the fault workers only run jobs."""

urlpatterns: list[object] = []
