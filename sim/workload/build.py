"""Config to pure specs: trace paths resolved, length and time configs made samplers.

The generators never see pydantic models; these functions are the one place
where a validated `workload:` section becomes the frozen values they take.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.config.draws import (
    ConstantArrivals,
    EmpiricalConfig,
    ExponentialTime,
    FixedConfig,
    FixedTime,
    GammaArrivals,
    LengthConfig,
    LognormalConfig,
    LognormalTime,
    NormalConfig,
    PoissonArrivals,
    TimeConfig,
    TraceFormat,
    UniformConfig,
)
from sim.config.workload import WorkloadConfig
from sim.workload.arrivals import ArrivalProcess
from sim.workload.lengths import (
    Empirical,
    Fixed,
    LengthDist,
    LengthSpec,
    Lognormal,
    Normal,
    Uniform,
)
from sim.workload.prefixes import SharedPrefix

if TYPE_CHECKING:
    from sim.workload.conversations import ConversationSpec, ThinkTime
    from sim.workload.trace import Trace

# Traces, their tokenizers and conversations load inside the functions that read or build
# them: a synthetic workload's run never imports them (~8 ms of a quickstart's start-up).

BUILTIN_PREFIX = "builtin:"
# the shipped traces (package data; sources, licences and citations in data/traces/README.md)
BUILTIN_TRACES = {
    "azure_code": "data/traces/azure_llm_2023_code.csv",
    "azure_conv": "data/traces/azure_llm_2023_conv.csv",
    "mooncake_conv": "data/traces/mooncake_conversation.jsonl",
    "synthetic_conv": "data/synthetic_conv.csv",
}


def resolve_trace_path(path: str, base_dir: Path | None = None) -> Path:
    """Find a trace: relative to `base_dir` (the scenario's folder) first, then the cwd."""
    given = Path(path).expanduser()
    if given.is_absolute():
        candidates = [given]
    else:
        candidates = [base_dir / given] if base_dir is not None else []
        candidates.append(Path.cwd() / given)
    for candidate in candidates:
        if candidate.exists():  # a directory or device: the reader says what it is
            return candidate
    tried = ", ".join(dict.fromkeys(str(c) for c in candidates))
    raise FileNotFoundError(f"trace file {path!r} not found (tried: {tried})")


@contextmanager
def trace_file(path: str, base_dir: Path | None = None) -> Iterator[Path]:
    """A readable file for a config path: a `builtin:` name or a path (see resolve_trace_path)."""
    if not path.startswith(BUILTIN_PREFIX):
        yield resolve_trace_path(path, base_dir)
        return
    name = path.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_TRACES:
        raise FileNotFoundError(f"unknown builtin trace {name!r}; have "
                                f"{', '.join(BUILTIN_PREFIX + n for n in BUILTIN_TRACES)}")
    with resources.as_file(resources.files("sim.workload").joinpath(BUILTIN_TRACES[name])) as real:
        yield real


def load_trace(
    path: str,
    fmt: TraceFormat | None,
    time_scale: float = 1.0,
    base_dir: Path | None = None,
    tokenizer: str | None = None,
    columns: Mapping[str, str | None] | None = None,
) -> Trace:
    """Read a trace by config path, including the shipped `builtin:` ones.

    A text trace's prompts are tokenized with `tokenizer` (`workload.tokenizer`);
    `columns` maps a CSV's own column names (`trace.columns`).
    """
    from sim.workload.text import workload_tokenizer
    from sim.workload.traces import detect_format, read_trace

    with trace_file(path, base_dir) as real_path:
        is_text = (fmt or detect_format(real_path)) == "text"
        tok = workload_tokenizer(tokenizer, base_dir) if is_text else None
        return read_trace(real_path, fmt, time_scale, tok, columns)


def _empirical_values(cfg: EmpiricalConfig, trace_path: str, column: str,
                      base_dir: Path | None, tokenizer: str | None) -> np.ndarray:
    """`column: prompt | output` reads the trace's lengths; any other name reads that column.

    A CSV trace's prompt or output lengths are its format's column, read alone: the
    draws need neither its arrival times nor its other lengths, and reading the whole
    trace (for each of the two distributions) took three times as long.
    """
    from sim.workload.csv_traces import CSV_FORMATS
    from sim.workload.text import trace_lengths
    from sim.workload.traces import detect_format, read_column

    with trace_file(trace_path, base_dir) as real_path:
        fmt = cfg.format or detect_format(real_path)
        if column in ("prompt", "output") and fmt in CSV_FORMATS:
            names = CSV_FORMATS[fmt]
            column = names.prompt_tokens if column == "prompt" else names.output_tokens
        if column not in ("prompt", "output"):
            return read_column(real_path, fmt, column)
    trace = load_trace(trace_path, fmt, base_dir=base_dir, tokenizer=tokenizer)
    return trace_lengths(trace, column)


def length_spec(
    cfg: LengthConfig, column: str, base_dir: Path | None = None, tokenizer: str | None = None
) -> LengthSpec:
    """The pure sampling spec for a length config; `column` is the default trace column."""
    dist: LengthDist
    match cfg:
        case FixedConfig():
            dist = Fixed(cfg.value)
        case UniformConfig():
            dist = Uniform(cfg.low, cfg.high)
        case NormalConfig():
            dist = Normal(cfg.mean, cfg.std)
        case LognormalConfig():
            dist = Lognormal(cfg.mean, cfg.cv)
        case EmpiricalConfig(values=list() as values):
            dist = Empirical(tuple(values))
        case EmpiricalConfig(trace=str() as trace_path):
            lengths = _empirical_values(cfg, trace_path, cfg.column or column, base_dir, tokenizer)
            dist = Empirical(tuple(lengths.tolist()))
        case _:
            raise TypeError(f"not a length config: {cfg!r}")
    return LengthSpec(dist, min_tokens=cfg.min or 1, max_tokens=cfg.max)


def arrival_process(cfg: PoissonArrivals | GammaArrivals | ConstantArrivals) -> ArrivalProcess:
    burstiness = cfg.burstiness if isinstance(cfg, GammaArrivals) else 1.0
    return ArrivalProcess(cfg.process, cfg.rate, burstiness)


def think_time(cfg: float | TimeConfig) -> ThinkTime:
    from sim.workload.conversations import ThinkTime

    match cfg:
        case FixedTime():
            return ThinkTime("fixed", cfg.value_s)
        case ExponentialTime():
            return ThinkTime("exponential", cfg.mean_s)
        case LognormalTime():
            return ThinkTime("lognormal", cfg.mean_s, cfg.cv)
    return ThinkTime("fixed", float(cfg))


def shared_prefix_spec(cfg: WorkloadConfig) -> SharedPrefix | None:
    sp = cfg.shared_prefix
    if sp is None:
        return None
    return SharedPrefix(sp.fraction, sp.tokens, sp.num_prompts, cfg.unit_tokens)


def conversation_spec(cfg: WorkloadConfig, base_dir: Path | None = None) -> ConversationSpec:
    """The pure spec of a `conversations:` workload (arrivals are conversation starts)."""
    from sim.workload.conversations import ConversationSpec

    conv, prompt, output = cfg.conversations, cfg.prompt_tokens, cfg.output_tokens
    if conv is None or prompt is None or output is None:
        raise ValueError("conversations need conversations, prompt_tokens and output_tokens")
    tok = cfg.tokenizer
    turns = (
        LengthSpec(Fixed(conv.turns))
        if isinstance(conv.turns, int)
        else length_spec(conv.turns, "prompt", base_dir, tok)
    )
    return ConversationSpec(
        first_prompt=length_spec(prompt, "prompt", base_dir, tok),
        output=length_spec(output, "output", base_dir, tok),
        user=length_spec(conv.user_tokens, "prompt", base_dir, tok),
        turns=turns,
        think=think_time(conv.think_time_s),
        assumed_tpot_s=conv.assumed_tpot_s,
        num_conversations=conv.num_conversations,
        max_prompt_tokens=conv.max_prompt_tokens,
        shared_prefix=shared_prefix_spec(cfg),
        unit_tokens=cfg.unit_tokens,
    )
