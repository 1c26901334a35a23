"""Workloads: arrival processes, token-length distributions and trace replay.

`WorkloadConfig` is the validated `workload:` section of a scenario and
`make_requests` turns it into a lazy, seeded stream of `Request`s.
"""

from sim.workload.arrivals import ArrivalProcess, arrival_chunks_s, arrival_times_s, sample_gaps_s
from sim.workload.config import (
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
from sim.workload.traces import Trace, TraceFormatError, detect_format, read_trace

__all__ = [
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
