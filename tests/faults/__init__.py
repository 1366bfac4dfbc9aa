"""The fault-injection suite: real workers on real stores, killed, cut off, restarted and
skewed, judged from their handlers' own logs (docs/faults.md).

* ``checker``: the verdict rules, from handler logs and the harness's fault log only.
* ``servers``: private stores on free ports and the faults they take.
* ``harness``: the run itself, and ``python -m tests.faults.harness`` (scripts/faults).
* ``settings`` / ``workerapp``: what the ``anarchon_worker`` processes run.
"""
