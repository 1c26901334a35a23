"""Workloads: arrival processes, token-length distributions and trace replay.

`WorkloadConfig` is the validated `workload:` section of a scenario and
`make_requests` turns it into a lazy, seeded stream of `Request`s. Synthetic
workloads can share prefixes (`SharedPrefix`: a common system prompt) or run
multi-turn conversations (`conversation_turns`); both name prompt content with
`Request.prefix_block_ids`, as Mooncake traces do.
"""

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
from sim.workload.conversations import ConversationSpec, ThinkTime, Turn, conversation_turns
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
from sim.workload.trace import MOONCAKE_UNIT_TOKENS, Trace
from sim.workload.traces import TraceFormatError, detect_format, read_trace

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
