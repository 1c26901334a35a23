"""A published GPU profile (Vidur, LLMServingSim) turned into a servesim latency table.

    servesim calibrate import vidur DIR --model M --tp N --out OUT
    servesim calibrate import llmservingsim DIR --model M --out OUT

DIR is one profiled model in the project's own published layout:

- vidur: `data/profiling/compute/<gpu>/<org>/<model>/`, holding `mlp.csv`
  (per-op `time_stats.<op>.median` ms per layer, by `num_tokens` and
  `num_tensor_parallel_workers`) and, when it was profiled, `attention.csv`;
- llmservingsim: `.../perf_models/<GPU>/<org>/<model>/tp<N>/`, holding
  `layers.csv` (`layer_name,input,kv_cache,tp_size,latency(ns)`).

Those tables time kernels, not steps, so the importer composes steps the way
Vidur does: the layers' linear ops at the step's token rows (interpolated
over the measured counts) times the layer count, plus attention, plus the
once-per-step ops. It does so over a profiling grid of step shapes
(calibrate.profile.synthetic.shape_grid), writes them as device-time measurements and
fits the table model to them (calibrate.fit), so the table is read like any
other. Whatever the profile does not time comes from servesim's fitted
roofline (sim.latency.roofline): attention without an attention.csv,
lm_head and sampling where absent, the tensor-parallel all-reduces, and the
host's CPU overhead per step and per sequence (unless a Vidur
cpu_overheads.csv for the model is given). The table's metadata names each
borrowed part and the files read (with their sha256), and the terminal says
the same. Reading the published files is calibrate.published.profiles's.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from calibrate.fit import FitReport, fit_table
from calibrate.profile.synthetic import shape_grid
from calibrate.published.profiles import GridLookup, Profile, read_llmservingsim, read_vidur
from sim.config.hardware import HardwareSpec
from sim.config.specs import ModelSpec
from sim.core.plan import StepShape
from sim.latency.roofline import RooflineLatency
from sim.latency.table_files import write_measurements
from sim.latency.table_format import Measurement, TableError, TableMetadata

SOURCES = ("vidur", "llmservingsim")
REPOSITORIES = {"vidur": "https://github.com/microsoft/vidur",
                "llmservingsim": "https://github.com/casys-kaist/LLMServingSim"}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mean_kv(shape: StepShape) -> float:
    return shape.decode_context_sum / shape.num_decodes + 1


def _decode(batch: float, kv_tokens: float) -> StepShape:
    """`batch` decodes reading `kv_tokens` each (the table's key: their own included)."""
    b, context = round(batch), max(0, round(kv_tokens) - 1)
    return StepShape(num_decodes=b, decode_context_sum=b * context, decode_context_max=context,
                     padded_batch=b)


def _prefill(chunk: float, context: float) -> StepShape:
    return StepShape((max(1, round(chunk)),), (round(context),))


@dataclass(frozen=True, slots=True)
class ComposedStep:
    """A step's device time from a profile, the roofline pricing what the profile lacks."""

    profile: Profile
    roofline: RooflineLatency
    num_layers: int

    def borrowed(self) -> tuple[str, ...]:
        """The parts the roofline supplies."""
        parts = [] if self.profile.decode_attention else ["decode attention"]
        if not self.profile.prefill_attention:
            parts.append("prefill attention")
        if self.profile.lm_head_ms is None:
            parts.append("lm_head and sampling")
        else:
            parts.append("sampling")
        if self.roofline.tp > 1:
            parts.append("tensor-parallel all-reduce")
        if self.profile.cpu_ms is None:
            parts.append("CPU overhead (per step, per sequence)")
        return tuple(parts)

    def device_ms(self, shape: StepShape) -> float:
        p, roof = self.profile, self.roofline
        parts = roof.breakdown(shape)
        rows = sum(shape.prefill_chunk_tokens) + max(shape.padded_batch - len(
            shape.prefill_chunk_tokens), shape.num_decodes)
        seqs = len(shape.prefill_chunk_tokens) + shape.num_decodes
        ms = self.num_layers * p.layer_ms(rows) + p.step_ms(rows)
        attention = 0.0
        if p.decode_attention and shape.num_decodes:
            attention += self._measured(p.decode_attention, shape.num_decodes, _mean_kv(shape),
                                        _decode)
        if p.prefill_attention:
            attention += sum(self._measured(p.prefill_attention, c, x, _prefill) for c, x in zip(
                shape.prefill_chunk_tokens, shape.prefill_context_tokens, strict=True))
        ms += self.num_layers * attention
        if not (p.decode_attention and p.prefill_attention):
            ms += self._roofline_attention_ms(shape)
        sampling_ms = roof.sampling_s(seqs) * 1e3
        ms += (p.lm_head_ms(seqs) + sampling_ms if p.lm_head_ms is not None
               else parts["lm_head_s"] * 1e3)
        return ms + parts["allreduce_s"] * 1e3

    def _measured(self, look: GridLookup, x: float, y: float,
                  shape: Callable[[float, float], StepShape]) -> float:
        """The table's ms a layer; outside its grid, its edge scaled as the roofline scales."""
        cx, cy = look.clamp(x, y)
        ms = look(cx, cy)
        if (cx, cy) == (x, y):
            return ms
        ratio = (self.roofline.breakdown(shape(x, y))["attention_s"]
                 / self.roofline.breakdown(shape(cx, cy))["attention_s"])
        return ms * ratio

    def _roofline_attention_ms(self, shape: StepShape) -> float:
        """The roofline's attention for the parts (decode, prefill) the profile lacks."""
        p, roof = self.profile, self.roofline
        decode = StepShape(num_decodes=shape.num_decodes,
                           decode_context_sum=shape.decode_context_sum,
                           decode_context_max=shape.decode_context_max,
                           padded_batch=shape.num_decodes)
        prefill = StepShape(shape.prefill_chunk_tokens, shape.prefill_context_tokens)
        ms = 0.0
        if not p.decode_attention and shape.num_decodes:
            ms += roof.breakdown(decode)["attention_s"] * 1e3
        if not p.prefill_attention and shape.prefill_chunk_tokens:
            ms += roof.breakdown(prefill)["attention_s"] * 1e3
        return ms


@dataclass(frozen=True, slots=True)
class ImportResult:
    directory: Path
    report: FitReport
    metadata: TableMetadata
    borrowed: tuple[str, ...]


def import_profile(source: str, directory: str | Path, spec: ModelSpec, hardware: HardwareSpec,
                   out: str | Path, tp: int = 1, block_size: int = 16,
                   max_num_batched_tokens: int = 4096, max_num_seqs: int = 128,
                   attention: Path | None = None, cpu_overheads: Path | None = None,
                   commit: str | None = None) -> ImportResult:
    """Read the profile, compose a grid of steps, write and fit the table at `out`."""
    directory = Path(directory)
    if source not in SOURCES:
        raise TableError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if not directory.is_dir():
        raise TableError(f"{directory}: no such profile directory")
    stored = {f: getattr(spec, f) for f in ("weight_dtype", "expert_dtype", "kv_dtype")
              if getattr(spec, f) not in ("", "bf16")}
    if stored:
        field, value = next(iter(stored.items()))
        raise TableError(f"model_spec.{field} is {value!r}: the published profiles time bf16 "
                         f"kernels, so the imported table's model must be bf16 throughout")
    profile = (read_vidur(directory, spec, tp, attention, cpu_overheads) if source == "vidur"
               else read_llmservingsim(directory, spec, tp))
    roofline = RooflineLatency(spec, hardware, tp=tp)
    composed = ComposedStep(profile, roofline, spec.num_layers)
    cpu_step_ms, cpu_seq_ms = profile.cpu_ms or (roofline.fitted.cpu_step_s * 1e3,
                                                 roofline.fitted.cpu_seq_s * 1e3)
    grid = _with_uneven_decodes(
        shape_grid(max_num_batched_tokens, max_num_seqs, spec.max_context_tokens),
        spec.max_context_tokens)
    rows = [_measurement(kind, shape, composed.device_ms(shape)) for kind, shape in grid]
    borrowed = composed.borrowed()
    provenance = [("source", source), ("repository", REPOSITORIES[source]),
                  ("commit", commit or "not given (--commit)"), ("profile", str(directory)),
                  ("imported", datetime.date.today().isoformat()),
                  ("composition", "layers x (linear ops at the step's token rows, interpolated "
                                  "over the measured counts + attention) + once-per-step ops"),
                  ("from the roofline", "; ".join(borrowed) + f" (servesim's fitted roofline, "
                                                              f"{roofline.fitted.family} family)")]
    provenance += [(f"file {f.name}", f"{f} sha256 {_sha256(f)}") for f in profile.files]
    metadata = TableMetadata(
        device_name=hardware.name, device_kind="cuda", torch_version="n/a (imported)",
        cuda_version=None, dtype="bfloat16", model_spec=spec, block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        timing="device", tp=tp, cpu_step_ms=cpu_step_ms, cpu_seq_ms=cpu_seq_ms,
        notes=f"imported from a published {source} profile; device time composed per step; "
              f"CPU overhead {'from the profile' if profile.cpu_ms else 'from the roofline'}",
        provenance=tuple(provenance))
    write_measurements(out, rows, metadata)
    report = fit_table(out, "device")
    return ImportResult(Path(out), report, metadata, borrowed)


def _with_uneven_decodes(grid: list[tuple[str, StepShape]], max_context: int
                         ) -> list[tuple[str, StepShape]]:
    """The grid plus each decode batch again with one sequence 4x longer than the mean.

    A paged GPU kernel reads each sequence's own KV (its cost follows the context sum);
    with only even batches the fit could not tell that from padding every sequence to the
    widest (TableFit.decode_padded_attention_ms_per_token), which is a CPU engine's cost.
    """
    extra = []
    for kind, shape in grid:
        if kind == "decode" and shape.num_decodes > 1:
            widest = min(4 * shape.decode_context_max, shape.decode_context_sum, max_context)
            if widest > shape.decode_context_max:
                extra.append((kind, StepShape(num_decodes=shape.num_decodes,
                                              decode_context_sum=shape.decode_context_sum,
                                              decode_context_max=widest,
                                              padded_batch=shape.padded_batch)))
    return grid + extra


def _measurement(kind: str, shape: StepShape, device_ms: float) -> Measurement:
    return Measurement(kind, shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                       shape.num_decodes, shape.decode_context_sum, shape.decode_context_max,
                       shape.padded_batch, 1, 1, device_ms, device_ms, device_ms)


def describe(result: ImportResult) -> Sequence[str]:
    """What the terminal says: where the table is, what came from the roofline, the fit."""
    meta = result.metadata
    return [f"wrote {result.directory} ({meta.model_spec.name} on {meta.device_name}, tp "
            f"{meta.tp}, device time)",
            "from the roofline (the profile does not time them): " + ", ".join(result.borrowed),
            f"CPU overhead carried by the table: {meta.cpu_step_ms:.3f} ms per step + "
            f"{meta.cpu_seq_ms:.4f} ms per sequence"]


