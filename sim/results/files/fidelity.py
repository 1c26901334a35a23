"""The metrics a fidelity report compares, and the signed error it reports for each.

Why here: the engine's report (calibrate.report) and a live server's
(sim.serve.fidelity) compare a measured run with a simulated one on the same
summary keys, so both read one list and one formula.
"""

from __future__ import annotations

import math

# (summary key, label, unit): the metrics a fidelity report compares
METRICS: tuple[tuple[str, str, str], ...] = (
    ("request_throughput", "Request throughput", "req/s"),
    ("output_throughput", "Output token throughput", "tok/s"),
    ("median_ttft_ms", "TTFT p50", "ms"),
    ("p90_ttft_ms", "TTFT p90", "ms"),
    ("p99_ttft_ms", "TTFT p99", "ms"),
    ("median_tpot_ms", "TPOT p50", "ms"),
    ("p90_tpot_ms", "TPOT p90", "ms"),
    ("median_e2el_ms", "E2EL p50", "ms"),
    ("p90_e2el_ms", "E2EL p90", "ms"),
)


def relative_error_pct(simulated: float, measured: float) -> float:
    """Signed error of the simulator against the measurement, in percent of the measurement."""
    if not (math.isfinite(simulated) and math.isfinite(measured)) or measured == 0:
        return math.nan
    return (simulated - measured) / abs(measured) * 100.0
