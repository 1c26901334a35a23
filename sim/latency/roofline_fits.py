"""The roofline's fitted constants: RooflineParams, one fit per GPU family, and each GPU's family.

Apart from sim.latency.roofline_terms because these are data, not laws: numbers
`python -m calibrate.published.fit_roofline` prints and a person pastes here, and the rule that
gives a GPU without measured kernels its nearest family's fit (and its own SM count).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class RooflineParams:
    """The fitted constants of one accelerator family (efficiencies are shares of datasheet)."""

    family: str
    bandwidth_efficiency: float  # a streaming GEMM weight read, share of datasheet HBM
    compute_efficiency: float  # a large GEMM, share of dense peak
    transition_sharpness: float  # p of the soft max between memory and compute time
    gemm_tile_rows: float  # a GEMM's rows are padded up to whole tiles of this height
    gemm_tile_cols: float  # ... and its columns to whole tiles of this width
    gemm_wave_tiles: float  # tiles the GPU runs at once (its SMs): compute goes by waves
    gemm_launch_s: float  # fixed cost of every GEMM kernel
    layer_small_s: float  # per layer: norms, rope, activation, residual add (launches)
    attention_bandwidth_efficiency: float
    attention_compute_efficiency: float
    decode_attention_launch_s: float  # per layer, the decodes' kernel
    prefill_attention_launch_s: float  # per layer, the prefill chunks' kernel
    attention_min_s: float  # no attention kernel takes less
    cpu_step_s: float  # host time per step
    cpu_seq_s: float  # host time per sequence in the step
    fitted_on: str  # where the numbers come from

    def __post_init__(self) -> None:
        for name in ("bandwidth_efficiency", "compute_efficiency",
                     "attention_bandwidth_efficiency", "attention_compute_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if not self.transition_sharpness >= 1:
            raise ValueError(f"transition_sharpness must be >= 1, "
                             f"got {self.transition_sharpness!r}")
        for name in ("gemm_tile_rows", "gemm_tile_cols", "gemm_wave_tiles"):
            value = getattr(self, name)
            if not (value > 0 and value < float("inf")):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        for name in ("gemm_launch_s", "layer_small_s", "decode_attention_launch_s",
                     "prefill_attention_launch_s", "attention_min_s",
                     "cpu_step_s", "cpu_seq_s"):
            value = getattr(self, name)
            if not (value >= 0 and value < float("inf")):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


# The serving system's terms, fitted on real vLLM servers (H100, `python -m calibrate.fit_serving`
# on calibration/real_runs/, docs/real_servers.md); one value for every GPU family: the host's
# time per step (the per-sequence term stays Vidur's), and under async scheduling the share of
# it still serial with the GPU.
HOST_STEP_S = 0.002
HOST_SEQ_S = 4.13e-05
HOST_SERIAL_SHARE = 0.0

# Produced by `python -m calibrate.published.fit_roofline` (prints the train / held-out split) on
# calibration/measured/ as its README pins it (Vidur 7d47513, LLMServingSim 5f18d86,
# inference-sim a410740). Attention and CPU terms: see each family's fitted_on.
FAMILIES: MappingProxyType[str, RooflineParams] = MappingProxyType({
    "ampere": RooflineParams(
        "ampere", bandwidth_efficiency=0.9093, compute_efficiency=0.7051,
        transition_sharpness=2.085, gemm_tile_rows=64, gemm_tile_cols=32, gemm_wave_tiles=108,
        gemm_launch_s=4.737e-06, layer_small_s=1.882e-05,
        attention_bandwidth_efficiency=0.9239, attention_compute_efficiency=0.7295,
        decode_attention_launch_s=1.474e-05, prefill_attention_launch_s=2.732e-05,
        attention_min_s=2.38e-05, cpu_step_s=HOST_STEP_S, cpu_seq_s=HOST_SEQ_S,
        fitted_on="A100 stacks: Vidur Llama-2-7B/70B, Qwen-72B, Llama-3-8B, phi-2 (tp 1-2); "
                  "waves of 108 tiles (A100's SMs); attention: the hopper fit; CPU: Vidur "
                  "A100 host overheads"),
    "hopper": RooflineParams(
        "hopper", bandwidth_efficiency=0.95, compute_efficiency=0.6825,
        transition_sharpness=2.433, gemm_tile_rows=128, gemm_tile_cols=32, gemm_wave_tiles=132,
        gemm_launch_s=4.414e-06, layer_small_s=1.775e-05,
        attention_bandwidth_efficiency=0.9239, attention_compute_efficiency=0.7295,
        decode_attention_launch_s=1.474e-05, prefill_attention_launch_s=2.732e-05,
        attention_min_s=2.38e-05, cpu_step_s=HOST_STEP_S, cpu_seq_s=HOST_SEQ_S,
        fitted_on="H100 stacks: Vidur Llama-2-7B/70B, Qwen-72B, phi-2 (tp 1-2); waves of 132 "
                  "tiles (H100's SMs); attention: inference-sim H100 decode and prefill; CPU: "
                  "Vidur A100 host overheads (no H100 host data)"),
})

# Catalogue GPU -> (family, why): a GPU without measured kernels takes its nearest family.
GPU_FAMILIES: MappingProxyType[str, tuple[str, str]] = MappingProxyType({
    "a100-80gb": ("ampere", "fitted on measured A100-80GB kernels"),
    "h100-sxm": ("hopper", "fitted on measured H100-SXM kernels"),
    "a100-40gb": ("ampere", "no measured kernels: A100-80GB's fit, the same die"),
    "h100-pcie": ("hopper", "no measured kernels: H100-SXM's fit, the same architecture"),
    "h200": ("hopper", "no measured kernels: H100-SXM's fit, the same Hopper die"),
    "b200": ("hopper", "no measured kernels: H100-SXM's fit, the nearest family"),
    "gb200": ("hopper", "no measured kernels: H100-SXM's fit, the nearest family"),
    "b300": ("hopper", "no measured kernels: H100-SXM's fit, the nearest family"),
    "l40s": ("ampere", "no measured kernels: A100's fit, the nearest family"),
    "l4": ("ampere", "no measured kernels: A100's fit, the nearest family"),
    "a10g": ("ampere", "no measured kernels: A100's fit, the same Ampere architecture"),
    "rtx-4090": ("ampere", "no measured kernels: A100's fit, the nearest family"),
    "mi300x": ("hopper", "no measured kernels: H100-SXM's fit, the nearest in bandwidth "
                         "and FLOP/s"),
    "mi325x": ("hopper", "no measured kernels: H100-SXM's fit, as MI300X"),
    "mi355x": ("hopper", "no measured kernels: H100-SXM's fit, as MI300X"),
    "rtx-pro-6000": ("hopper", "no measured kernels: H100-SXM's fit, the nearest family to "
                               "Blackwell (as b200)"),
    "h20": ("hopper", "no measured kernels: H100-SXM's fit, the same Hopper die cut down"),
    "l20": ("ampere", "no measured kernels: A100's fit, the nearest family (as l40s, the same "
                      "AD102)"),
})
DEFAULT_FAMILY = "hopper"


def family_of(gpu_name: str, sm_count: int = 0) -> tuple[str, str]:
    """(family, why) for a GPU; a custom one takes the default family and says so."""
    waves = f"in waves of its {sm_count} SMs" if sm_count else "without waves (its SMs are " \
                                                              "unknown)"
    return GPU_FAMILIES.get(gpu_name, (DEFAULT_FAMILY, f"custom GPU: the {DEFAULT_FAMILY} "
                                                       f"family's fit, {waves}"))


def params_for(gpu_name: str, sm_count: int = 0) -> RooflineParams:
    """The family's fit, its waves as wide as this GPU's SMs (`sm_count`, 0 = unknown).

    A catalogue GPU names its SM count, so an L4 runs its GEMM tiles 58 at a time, not
    its family's 108. A custom GPU of unknown SMs pads its GEMMs to tiles but runs no
    waves: a wave of the family's would price each tile at a share of a peak it may not
    have (a CPU-sized device would pay for 132 SMs it lacks)."""
    params = FAMILIES[family_of(gpu_name)[0]]
    if sm_count:
        return dataclasses.replace(params, gemm_wave_tiles=float(sm_count))
    if gpu_name in GPU_FAMILIES:
        return params
    return dataclasses.replace(params, gemm_wave_tiles=1.0)
