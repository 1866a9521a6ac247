"""Schedules: when reminders fire (``rules``), where they are kept (``store``), the ``clock``.

The Scheduler actor (``actors/scheduler.py``) runs them.
"""
