"""django-anarchon: scheduled jobs that run exactly once across every instance of a project."""
