"""`servesim plan` over data-parallel layouts of an MoE model: DP=N attention ranks of TP=T
GPUs each, the experts over all N x T (EP = N x T), beside the pure-TP candidates.

Which layouts: for every GPU count G that a pure-TP candidate uses (--tp), every N >= 2
dividing G, with T = G / N, so DP+EP and TP are compared at the same GPUs (8 GPUs: TP8, DP2 x TP4,
DP4 x TP2, DP8 x TP1). `--dp` picks the N (auto: all, for an MoE model; none for a dense
one).

One DP group per layout: a layout is simulated once, as one group of N ranks behind the
front router, and passes or fails at the target rate. A fleet of DP groups (replicas > 1)
is not modelled (sim.config.data_parallel refuses it: each group would need its own
lockstep log behind a second router level); a bigger DP deployment is a bigger N, which is
its own candidate. So the pure-TP candidates grow by replicas and the DP ones do not: the
answer is the cheapest of both.

Capacity math prunes here too: the layout must split the experts and heads
(sim.config.specs.check_ep/check_tp), and a rank's GPUs must leave KV room for one longest
request beside the replicated attention, the 1/(N x T) experts and the activations
(sim.config.capacity_dp, the sheet `servesim capacity --dp` prints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sim.config.capacity_dp import dp_ep_report
from sim.config.hardware import HardwareSpec
from sim.config.specs import ModelSpec


@dataclass(frozen=True, slots=True)
class DPLayout:
    """One DP x TP layout on one GPU type, and whether it fits."""

    gpu: str
    tp: int
    dp: int
    fits: bool
    reason: str | None  # why it does not fit

    @property
    def gpus(self) -> int:
        return self.dp * self.tp


def layout_label(tp: int, dp: int, replicas: int = 1) -> str:
    """How a layout reads in the plan's tables: `TP8 x2`, or `DP8 x TP1 + EP8`."""
    if dp > 1:
        return f"DP{dp} x TP{tp} + EP{dp * tp}"
    return f"TP{tp} x{replicas}"


def parse_dps(text: str, model: ModelSpec, tps: Sequence[int]) -> tuple[int, ...]:
    """--dp: `auto` (every N >= 2 dividing a --tp GPU count, for an MoE model; none for a
    dense one), or comma-separated degrees (1 alone: pure TP only). ValueError names the
    option."""
    text = text.strip()
    if text == "auto":
        if not model.is_moe:
            return ()
        return tuple(sorted({n for g in tps for n in range(2, g + 1) if g % n == 0}))
    try:
        dps = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise ValueError(f"--dp: 'auto' or comma-separated integers, got {text[:60]!r}"
                         ) from None
    if any(d < 1 for d in dps):
        raise ValueError(f"--dp: degrees must be >= 1, got {text[:60]!r}")
    wanted = tuple(sorted({d for d in dps if d > 1}))
    if wanted and not model.is_moe:
        raise ValueError(f"--dp: data-parallel layouts need an MoE model (experts over the "
                         f"ranks); {model.name} is dense; use --dp 1")
    return wanted


def dp_layouts(model: ModelSpec, gpus: Mapping[str, HardwareSpec], tps: Sequence[int],
               dps: Sequence[int], longest_tokens: int, memory_utilization: float = 0.9,
               max_num_seqs: int = 256, max_num_batched_tokens: int = 8192
               ) -> list[DPLayout]:
    """Every GPU type x DP=N x TP=T with N in `dps` and N x T among the `tps` GPU counts
    (T any whole number), with whether it fits (see the module)."""
    counts = sorted(set(tps))
    out = []
    for name, hw in gpus.items():
        for dp in dps:
            for tp in (g // dp for g in counts if g % dp == 0):
                try:
                    report = dp_ep_report(model, hw, dp, tp, longest_tokens, memory_utilization,
                                          max_num_batched_tokens=max_num_batched_tokens,
                                          max_num_seqs=max_num_seqs)
                except ValueError as err:
                    out.append(DPLayout(name, tp, dp, False, str(err)))
                    continue
                if report["rank_max_concurrency"] < 1:
                    out.append(DPLayout(name, tp, dp, False, f"no KV room on a rank for one "
                                        f"{longest_tokens}-token request beside the weights"))
                    continue
                out.append(DPLayout(name, tp, dp, True, None))
    return out
