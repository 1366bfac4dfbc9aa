"""A Django app for the anarchon_worker subprocesses of tests/test_overlap_workers.py."""
