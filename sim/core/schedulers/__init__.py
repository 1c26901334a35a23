"""Scheduling policies behind one contract (see base.Scheduler), and their registry."""

from sim.core.schedulers.base import Scheduler
from sim.core.schedulers.continuous import ContinuousScheduler
from sim.core.schedulers.dynamic import DynamicScheduler
from sim.core.schedulers.registry import (
    POLICIES,
    Policy,
    SchedulerSettings,
    build_scheduler,
    resolve_async_scheduling,
)
from sim.core.schedulers.static import StaticScheduler

__all__ = ["POLICIES", "ContinuousScheduler", "DynamicScheduler", "Policy", "Scheduler",
           "SchedulerSettings", "StaticScheduler", "build_scheduler", "resolve_async_scheduling"]
