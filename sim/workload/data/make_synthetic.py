"""Regenerate synthetic_conv.csv: a small conversation-like trace we own outright.

Poisson arrivals at 2 req/s and lognormal lengths whose means match the public
Azure 2023 conversation summary (prompt ~1155, output ~211); no trace rows are
copied. Run from the repo root: python -m sim.workload.data.make_synthetic
"""

from pathlib import Path

import numpy as np

from sim.workload.arrivals import ArrivalProcess, arrival_chunks_s
from sim.workload.lengths import LengthSpec, Lognormal, sample_lengths

NUM_ROWS = 2000
SEED = 20231116


def main() -> None:
    out_path = Path(__file__).with_name("synthetic_conv.csv")
    arrivals_rng, prompt_rng, output_rng = (
        np.random.default_rng(child) for child in np.random.SeedSequence(SEED).spawn(3)
    )
    arrival_s = next(arrival_chunks_s(ArrivalProcess("poisson", 2.0), arrivals_rng, NUM_ROWS))
    prompts = sample_lengths(LengthSpec(Lognormal(1155, 1.0), 1, 8000), prompt_rng, NUM_ROWS)
    outputs = sample_lengths(LengthSpec(Lognormal(211, 1.0), 1, 2000), output_rng, NUM_ROWS)
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    lines += [f"{t:.6f},{p},{o}" for t, p, o in zip(arrival_s, prompts, outputs, strict=True)]
    out_path.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
