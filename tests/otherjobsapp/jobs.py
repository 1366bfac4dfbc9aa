"""The jobs.py recipe of docs/deployment.md: import the module that defines jobs."""

from . import reports  # noqa: F401  (importing the module registers its jobs)
