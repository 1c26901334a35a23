"""Dynamic batching (Triton-style): launch at B requests or when the oldest waited max_wait.

Static batching with a mandatory timer and two differences a timer-driven server
has: a batch launched short runs over only its own members (padded_batch = the
launched size), and the end of arrivals changes nothing, since such a server
cannot know that no more requests are coming. Still request-level: a batch
runs to completion and nothing joins it.
"""

from __future__ import annotations

from typing import ClassVar

from sim.core.contiguous import ContiguousAllocator
from sim.core.schedulers.static import StaticScheduler

DEFAULT_MAX_WAIT_S = 0.05


class DynamicScheduler(StaticScheduler):
    """`max_wait_s`: how long the oldest waiter may wait for a full batch (next_wakeup)."""

    pads_to_batch_size: ClassVar[bool] = False
    launches_on_close: ClassVar[bool] = False

    def __init__(self, kv: ContiguousAllocator, batch_size: int = 16,
                 max_wait_s: float = DEFAULT_MAX_WAIT_S, max_model_len: int | None = None,
                 max_output_tokens: int | None = None, pad_prompts: bool = True) -> None:
        if max_wait_s is None:
            raise ValueError("dynamic batching needs max_wait_s")
        super().__init__(kv, batch_size, max_wait_s, max_model_len, max_output_tokens,
                         pad_prompts)
