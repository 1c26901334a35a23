"""Workloads: arrival processes, token-length distributions and trace replay.

`WorkloadConfig` is the validated `workload:` section of a scenario and
`make_requests` turns it into a lazy, seeded stream of `Request`s. Synthetic
workloads can share prefixes (`SharedPrefix`: a common system prompt) or run
multi-turn conversations (`conversation_turns`); both name prompt content with
`Request.prefix_block_ids`, as Mooncake traces do.

The names of traces and conversations load from their modules on first use
(`__getattr__`), so a synthetic workload's run imports neither (nor the tokenizers).
"""

import importlib
from typing import Any

from sim.workload.arrivals import ArrivalProcess, arrival_chunks_s, arrival_times_s, sample_gaps_s
from sim.workload.config import (
    ConversationsConfig,
    SharedPrefixConfig,
    TraceConfig,
    WorkloadConfig,
    load_trace,
    make_requests,
    resolve_trace_path,
)
from sim.workload.lengths import (
    Empirical,
    Fixed,
    LengthSpec,
    Lognormal,
    Normal,
    Uniform,
    lognormal_params,
    sample_lengths,
)
from sim.workload.prefixes import SharedPrefix, num_units

# name -> the module of this package that defines it, imported when the name is first read
_LAZY = {"ConversationSpec": "conversations", "ThinkTime": "conversations",
         "Turn": "conversations", "conversation_turns": "conversations",
         "MOONCAKE_UNIT_TOKENS": "trace", "Trace": "trace", "TraceFormatError": "traces",
         "detect_format": "traces", "read_trace": "traces"}

__all__ = [
    "MOONCAKE_UNIT_TOKENS",
    "ConversationSpec",
    "ConversationsConfig",
    "SharedPrefix",
    "SharedPrefixConfig",
    "ThinkTime",
    "Turn",
    "conversation_turns",
    "num_units",
    "ArrivalProcess",
    "Empirical",
    "Fixed",
    "LengthSpec",
    "Lognormal",
    "Normal",
    "Trace",
    "TraceConfig",
    "TraceFormatError",
    "Uniform",
    "WorkloadConfig",
    "arrival_chunks_s",
    "arrival_times_s",
    "detect_format",
    "load_trace",
    "lognormal_params",
    "make_requests",
    "read_trace",
    "resolve_trace_path",
    "sample_gaps_s",
    "sample_lengths",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
