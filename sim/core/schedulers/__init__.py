"""Scheduling policies behind one contract (see base.Scheduler)."""

from sim.core.schedulers.base import Scheduler
from sim.core.schedulers.continuous import ContinuousScheduler

__all__ = ["ContinuousScheduler", "Scheduler"]
