"""The job of tests/test_celery_workers.py: a Celery task sent once per slot (jobs.py)."""
