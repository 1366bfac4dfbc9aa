"""The jobs of the fault-injection workers (tests/faults): see jobs.py."""
