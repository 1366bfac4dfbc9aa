"""Jobs that enqueue a task once per slot instead of running a handler.

A job may name a ``django.tasks`` Task (or, with the ``[celery]`` extra, a Celery task)
where a handler goes. The instance that wins a slot enqueues the task once; ``base``
defines what a task system must offer for that, one module per system implements it.
"""

from .base import SLOT_ARGUMENTS, TaskTarget, check_target, slot_kwargs, target_for

__all__ = ["SLOT_ARGUMENTS", "TaskTarget", "check_target", "slot_kwargs", "target_for"]
