"""Text traces: JSONL rows with a `prompt`, tokenized into the ids that requests carry.

A row is `{"prompt": "...", "output_tokens": 200, "arrival_s": 1.5}`; only
`prompt` is required, other keys are ignored. Arrivals are `arrival_s`
(seconds) or `timestamp` (milliseconds, as in Mooncake traces), on every row
or on none: a trace without them takes its arrivals from `workload.arrivals`
in file order. A row without `output_tokens` draws one from
`workload.output_tokens`. Both draws use their own child streams of the
scenario seed. Prompt ids go into `Request.prompt_token_ids`, so prompts that
share text share prefix-cache blocks, exactly as far as their tokens agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.core.request import Request
from sim.text import ByteTokenizer, Tokenizer, TokenizerError, load_tokenizer
from sim.text.catalogue import find_known
from sim.workload.arrivals import ArrivalProcess
from sim.workload.lengths import LengthSpec, sample_lengths
from sim.workload.trace import Trace, replay_times_s
from sim.workload.trace_rows import (
    TraceFormatError,
    at_least_one,
    check_arrivals,
    count,
    jsonl_records,
    row_error,
    seconds,
)

_ARRIVAL_KEYS = ("arrival_s", "timestamp")
_EXPECTED = 'a JSON object with a "prompt" string'


@dataclass(frozen=True, slots=True, eq=False)
class TextTrace(Trace):
    """A trace whose prompts are text; `prompt_ids[i]` are row i's token ids."""

    prompt_ids: tuple[np.ndarray, ...] = ()
    tokenizer_name: str = "byte"
    output_given: np.ndarray | None = None  # bool per row; None = every row gave one


def is_text_jsonl(path: Path) -> bool:
    """True when the first non-blank line is a JSON object with a `prompt`."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        for text in handle:
            if text.strip():
                try:
                    record = json.loads(text)
                except (ValueError, RecursionError):  # the reader names the line
                    return False
                return isinstance(record, dict) and "prompt" in record
    return False


def read_prompts(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of every non-blank row; each must carry a string `prompt`."""
    rows = list(jsonl_records(path, _EXPECTED, lambda r: isinstance(r.get("prompt"), str)))
    if not rows:
        raise TraceFormatError(f"{path}: the trace has no rows")
    return rows


def _arrival_s(record: dict, path: Path, line: int) -> float | None:
    given = [key for key in _ARRIVAL_KEYS if key in record]
    if len(given) > 1:
        raise row_error(path, line, "one of arrival_s (s) or timestamp (ms), not both", record)
    if not given:
        return None
    value_s = seconds(record[given[0]], path, line, given[0])
    return value_s / 1000.0 if given[0] == "timestamp" else value_s


def read_text_trace(path: Path, tokenizer: Tokenizer | None = None, time_scale: float = 1.0
                    ) -> TextTrace:
    """Tokenize every prompt (default: bytes); rows stay in file order, as every trace's do."""
    tokenizer = tokenizer or ByteTokenizer()
    rows = read_prompts(path)
    lines = [line for line, _ in rows]
    arrivals = [_arrival_s(record, path, line) for line, record in rows]
    timed = [a is not None for a in arrivals]
    if any(timed) and not all(timed):
        line = rows[timed.index(not timed[0])][0]
        raise row_error(path, line, "arrival_s or timestamp on every row or on none", "a row "
                        + ("without" if timed[0] else "with") + " one")
    ids: list[np.ndarray] = []
    outputs: list[int] = []
    given: list[bool] = []
    for line, record in rows:
        tokens = np.asarray(tokenizer.encode(record["prompt"]), dtype=np.int32)
        if tokens.size == 0:
            raise row_error(path, line, f"a prompt of at least one {tokenizer.name} token",
                            record["prompt"])
        ids.append(tokens)
        has_output = "output_tokens" in record
        given.append(has_output)
        outputs.append(count(record["output_tokens"], path, line, "output_tokens")
                       if has_output else 1)
    arrival_s = np.asarray([a or 0.0 for a in arrivals], dtype=np.float64)
    if all(timed):
        stamps = [record.get("arrival_s", record.get("timestamp")) for _, record in rows]
        keys = {key for _, record in rows for key in _ARRIVAL_KEYS if key in record}
        check_arrivals(arrival_s, lines, stamps, path, " or ".join(sorted(keys)))
    mask = np.asarray(given, dtype=bool)
    return TextTrace(
        source=str(path),
        arrival_s=(arrival_s - arrival_s[0]) / time_scale,
        prompt_tokens=np.asarray([t.size for t in ids], dtype=np.int64),
        output_tokens=at_least_one(np.asarray(outputs, dtype=np.int64), lines, path,
                                   "output_tokens"),
        prompt_ids=tuple(ids),
        tokenizer_name=tokenizer.name,
        arrivals_given=all(timed),
        arrival_column="arrival_s or timestamp",
        output_given=None if mask.all() else mask,
    )


def workload_tokenizer(name: str | None, base_dir: Path | None = None) -> Tokenizer:
    """`workload.tokenizer`: a known name, or a path relative to the scenario's folder."""
    name = name or "byte"
    if find_known(name) is None and base_dir is not None and not Path(name).is_absolute():
        local = base_dir / name
        if local.exists():
            name = str(local)
    try:
        return load_tokenizer(name)
    except TokenizerError as err:
        raise TokenizerError(f"workload.tokenizer: {err}") from None


def trace_lengths(trace: Trace, column: str) -> np.ndarray:
    """A trace column as lengths, leaving out text rows that gave no output length."""
    if column == "prompt":
        return trace.prompt_tokens
    mask = trace.output_given if isinstance(trace, TextTrace) else None
    if mask is None:
        return trace.output_tokens
    if not mask.any():
        raise ValueError(f"{trace.source}: no row gives output_tokens to draw lengths from")
    return trace.output_tokens[mask]


def check_fill(trace: Trace, process: ArrivalProcess | None, output: LengthSpec | None) -> None:
    """`workload.arrivals` fills in a trace without arrival times, `workload.output_tokens` the
    rows of a text trace without one; anything else beside a trace is a mistake."""
    if trace.arrivals_given and process is not None:
        undo = ("the arrivals from the file" if isinstance(trace, TextTrace) else
                "set trace.columns: {arrival_s: null} to replay the rows at workload.arrivals")
        raise ValueError(f"workload.arrivals: {trace.source} gives every row an arrival time; "
                         f"remove workload.arrivals, or {undo}")
    if not trace.arrivals_given and process is None:
        raise ValueError(f"workload.arrivals: {trace.source} has no {trace.arrival_column}; "
                         "set workload.arrivals (e.g. process: poisson, rate: 2)")
    if not isinstance(trace, TextTrace):
        if output is not None:
            raise ValueError(f"workload.output_tokens: {trace.source} gives every row an output "
                             "length; remove workload.output_tokens (it fills in text-trace "
                             "rows without output_tokens)")
        return
    if trace.output_given is not None and output is None:
        missing = int(np.count_nonzero(~trace.output_given))
        raise ValueError(f"workload.output_tokens: {missing} rows of {trace.source} have no "
                         "output_tokens; set workload.output_tokens to draw them")


def text_requests(trace: TextTrace, process: ArrivalProcess | None, output: LengthSpec | None,
                  seed: int, limit: float, end_s: float, chunk_size: int) -> Iterator[Request]:
    """Requests carrying their prompt ids; arrivals and missing outputs drawn when needed."""
    check_fill(trace, process, output)
    output_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
    outputs = trace.output_tokens
    if trace.output_given is not None and output is not None:
        outputs = outputs.copy()
        missing = ~trace.output_given
        outputs[missing] = sample_lengths(output, output_rng, int(np.count_nonzero(missing)))
    times_s = replay_times_s(trace, process, seed, chunk_size)
    rows = zip(times_s, trace.prompt_ids, outputs.tolist(), strict=False)
    for request_id, (arrival_s, ids, out) in enumerate(rows):
        if request_id >= limit or arrival_s >= end_s:
            return
        yield Request(request_id, arrival_s, int(ids.size), out,
                      prompt_token_ids=tuple(ids.tolist()))
