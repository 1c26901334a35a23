"""The serving core shared by the simulator and the real engine.

Plain Python only: importing this package must load neither simpy nor torch,
and nothing here reads a clock (time always comes in as `now`).
"""

from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import KVBudget, KVManager, PagedBlockManager, num_kv_blocks
from sim.core.plan import SeqWork, StepPlan, StepResult, StepShape, checked_plan
from sim.core.request import Request, RequestState

__all__ = [
    "ContiguousAllocator",
    "KVBudget",
    "KVManager",
    "PagedBlockManager",
    "Request",
    "RequestState",
    "SeqWork",
    "StepPlan",
    "StepResult",
    "StepShape",
    "checked_plan",
    "num_kv_blocks",
]
