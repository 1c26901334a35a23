"""Hostile inputs through the CLI's own entry point: every one exits 0 or 2, never a traceback.

Hypothesis draws whole user inputs (issue 46): scenario documents (valid ones and
mutated ones), `--set` overrides, trace files (CSV and JSONL, with mutated cells,
headers and bytes), config.json files and requests.csv files for `explain`. Each
runs in-process through `sim.cli.main` with a dozen requests, and must:
- exit 0 or 2, with no exception escaping and no "Traceback" in its output;
- keep its messages bounded (no line over 600 characters, no Python digit-limit advice)
  and no numpy RuntimeWarning reaching the user;
- stay within MAX_PEAK_BYTES of traced memory (tracemalloc) and a 3 GB address space;
- leave no `.servesim-*` staging directory behind;
- not call a run that served nothing a success.

This suite runs targeted strategies with a few examples each; the large profile is
`benchmarks/fuzz_inputs.py --examples N`, which records every finding instead of
stopping at the first.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import shutil
import tempfile
import tracemalloc
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main

SMALL: dict = {"workload": {"arrivals": {"process": "poisson", "rate": 4},
                            "prompt_tokens": {"dist": "fixed", "value": 100},
                            "output_tokens": {"dist": "fixed", "value": 10},
                            "num_requests": 12}}
LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
         "vocab_size": 128256, "max_position_embeddings": 8192}
MAX_PEAK_BYTES = 400 * 2**20
HEADROOM_BYTES = 3 * 2**30
HUGE = "9" * 5000
HEADER = ["arrival_s", "prompt_tokens", "output_tokens"]
# Fields whose hostile values cannot make a dozen requests run long.
PATHS = ["seed", "name", "replicas", "hardware.count", "hardware.memory_utilization",
         "scheduler.policy", "scheduler.max_num_seqs", "scheduler.max_num_batched_tokens",
         "scheduler.max_model_len", "kv.block_size", "kv.prefix_caching", "slo.ttft_ms",
         "slo.tpot_ms", "workload.arrivals.rate", "workload.arrivals.process",
         "workload.prompt_tokens.value", "workload.output_tokens.value",
         "workload.prompt_tokens.dist", "workload.num_requests", "workload.duration_s",
         "workload.trace", "latency.model", "model", "output.plots"]
NUMBERS = {"seed", "replicas", "hardware.count", "hardware.memory_utilization",
           "scheduler.max_num_seqs", "scheduler.max_num_batched_tokens",
           "scheduler.max_model_len", "kv.block_size", "slo.ttft_ms", "slo.tpot_ms",
           "workload.arrivals.rate", "workload.prompt_tokens.value",
           "workload.output_tokens.value", "workload.num_requests", "workload.duration_s"}

hostile = st.sampled_from([True, False, 0, -1, 1, 10**30, 2**63, 1e-300, 1e-20, 1e300,
                           float("nan"), float("inf"), "abc", None, [], {}, "", 0.5, 3])
hostile_text = st.sampled_from(["true", "no", "0", "-5", "1e-300", "1e-20", "1e300", HUGE,
                                "nan", ".inf", "[1, 2]", "{a: 1}", "~", "x" * 200, "7"])


@dataclass(frozen=True)
class Case:
    """Files to write (name -> bytes) and the command to run among them."""

    kind: str
    files: dict[str, bytes]
    argv: tuple[str, ...]
    needs_run: bool = False  # explain: a real run's directory is made first, as "run"
    must_fail: str | None = None  # a mistake the case made on purpose: exit 0 misleads
    must_note: str | None = None  # text a legitimate but odd input must print


@dataclass
class Outcome:
    code: int | None
    out: str
    err: str
    peak_bytes: int
    leftovers: list[str] = field(default_factory=list)
    exception: str | None = None
    served_nothing: bool = False


def _dump(doc: object) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False).encode()


def _set(doc: dict, path: str, value: object) -> dict:
    node = doc
    *parents, leaf = path.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value
    return doc


RUN = ("--no-plots", "--quiet", "--out", "out")


@st.composite
def scenario_cases(draw: st.DrawFn) -> Case:
    """The small scenario, valid or with fields set to hostile values, keys dropped or
    repeated, as a file."""
    doc = json.loads(json.dumps(SMALL))
    must_fail = None
    for path, value in draw(st.lists(st.tuples(st.sampled_from(PATHS), hostile), max_size=2)):
        _set(doc, path, value)
        if isinstance(value, bool) and path in NUMBERS:
            must_fail = f"true/false for the number {path}"
    if draw(st.booleans()):
        del doc["workload"][draw(st.sampled_from(["arrivals", "prompt_tokens",
                                                  "output_tokens"]))]
    text = _dump(doc) if all(isinstance(v, dict) for v in doc.values()) else b""
    if not text:
        try:
            text = _dump(doc)
        except (ValueError, yaml.YAMLError):
            text = b"seed: 1\n"
    if draw(st.booleans()):
        text = b"workload: {}\n" + text  # a key given twice
        must_fail = "workload given twice"
    target = draw(st.sampled_from(["s.yaml"] * 8 + ["adir", "/dev/zero"]))
    return Case("scenario", {"s.yaml": text, "adir/keep": b""}, ("run", target, *RUN),
                must_fail=must_fail)


@st.composite
def set_cases(draw: st.DrawFn) -> Case:
    """`--set` overrides of hostile texts, sometimes the same key twice."""
    sets = [f"{draw(st.sampled_from(PATHS))}={draw(hostile_text)}"
            for _ in range(draw(st.integers(1, 3)))]
    must_fail = next((f"true/false for the number {item}" for item in sets
                      if item.partition("=")[0] in NUMBERS
                      and item.partition("=")[2] in ("true", "no")), None)
    if draw(st.booleans()):
        sets.append(sets[0])
        must_fail = "a --set key given twice"
    argv = ["run", "s.yaml", *RUN]
    for item in sets:
        argv += ["--set", item]
    return Case("--set", {"s.yaml": _dump(SMALL)}, tuple(argv), must_fail=must_fail)


cells = st.sampled_from(["0", "1", "5", "12", "-5", "1e30", str(10**30), HUGE, "nan", "inf",
                         "abc", "", "1.5", "3.0", "-0", "99999999999999999999"])


@st.composite
def trace_cases(draw: st.DrawFn) -> Case:
    """A CSV or Mooncake JSONL trace with hostile cells, headers or bytes, replayed."""
    rows = draw(st.integers(1, 5))
    jsonl = draw(st.booleans())
    values = [[draw(cells) for _ in HEADER] for _ in range(rows)]
    must_fail = "a negative arrival time" if any(r[0] == "-5" for r in values) else None
    if jsonl:
        keys = ["timestamp", "input_length", "output_length"]
        lines = []
        for row in values:
            record = ", ".join(f'"{k}": {v if _is_number(v) else json.dumps(v)}'
                               for k, v in zip(keys, row, strict=True))
            lines.append("{" + record + "}")
        body = "\n".join(lines).encode() + b"\n"
        name = "t.jsonl"
    else:
        header = list(HEADER)
        mutation = draw(st.sampled_from(["none", "twice", "renamed", "dropped"]))
        if mutation == "twice":
            header.append(draw(st.sampled_from(HEADER)))
            must_fail = f"column {header[-1]} given twice"
            values = [row + ["1"] for row in values]
        elif mutation == "renamed":
            header[draw(st.integers(0, 2))] = "other"
        elif mutation == "dropped":
            header.pop()
        body = ("\n".join(",".join(r) for r in [header, *values]) + "\n").encode()
        name = "t.csv"
    how = draw(st.sampled_from(["as is", "as is", "binary", "empty", "cut", "scaled"]))
    extra: tuple[str, ...] = ()
    if how == "binary":
        body = bytes(range(128, 256)) + body
    elif how == "empty":
        body = b""
    elif how == "cut":
        body = body[:draw(st.integers(0, max(0, len(body) - 1)))]
    elif how == "scaled":
        extra = ("--set", f"workload.trace.time_scale={draw(hostile_text)}")
    target = draw(st.sampled_from([name, name, name, "adir", "/dev/zero", "missing.csv"]))
    scenario = _dump({"workload": {"trace": {"path": target}}})
    return Case("trace", {name: body, "tr.yaml": scenario, "adir/keep": b""},
                ("run", "tr.yaml", *RUN, *extra), must_fail=must_fail)


def _is_number(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return text not in ("nan", "inf")


@st.composite
def config_cases(draw: st.DrawFn) -> Case:
    """A config.json with fields set to hostile values (or removed), for `capacity`."""
    config: dict = dict(LLAMA)
    note = None
    for key in draw(st.lists(st.sampled_from(sorted(LLAMA)), max_size=2)):
        choice = draw(st.sampled_from(["value", "huge", "layers", "drop", "odd"]))
        if choice == "drop":
            config.pop(key, None)
        elif choice == "layers":
            config["num_hidden_layers"] = 10**9
        elif choice == "odd":
            config["hidden_size"] = 4000
            config["num_attention_heads"] = 48
            note = "head_dim"
        else:
            config[key] = draw(hostile) if choice == "value" else "HUGE"
    text = json.dumps(config).replace('"HUGE"', HUGE).replace("NaN", "nan")
    return Case("config", {"m/config.json": text.encode()},
                ("capacity", "--config", "m/config.json"), must_note=note)


@st.composite
def explain_cases(draw: st.DrawFn) -> Case:
    """`explain` on a real run's directory whose requests.csv is cut, renamed or replaced."""
    how = draw(st.sampled_from(["as is", "cut", "renamed", "empty", "binary", "no summary"]))
    return Case("explain", {"how": how.encode(),
                            "at": str(draw(st.floats(0, 1))).encode()},
                ("explain", "run"), needs_run=True)


def _mutate_run(folder: Path, how: str, at: float) -> None:
    requests = folder / "run" / "requests.csv"
    data = requests.read_bytes()
    if how == "cut":
        requests.write_bytes(data[:int(len(data) * at)])
    elif how == "renamed":
        requests.write_bytes(data.replace(b"status", b"state", 1))
    elif how == "empty":
        requests.write_bytes(b"")
    elif how == "binary":
        requests.write_bytes(bytes(range(128, 256)) * 8)
    elif how == "no summary":
        (folder / "run" / "summary.json").unlink()


def run_case(case: Case, folder: Path) -> Outcome:
    """Write the case's files into `folder`, run its command there in-process and report."""
    for name, data in case.files.items():
        if case.needs_run:
            break
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    exception = None
    with contextlib.chdir(folder), _address_space_capped(), warnings.catch_warnings():
        warnings.simplefilter("always")
        if case.needs_run:
            (folder / "s.yaml").write_bytes(_dump(SMALL))
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                main(["run", "s.yaml", "--no-plots", "--quiet", "--out", "run"])
            _mutate_run(folder, case.files["how"].decode(), float(case.files["at"]))
        tracemalloc.start()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(case.argv))
        except BaseException as caught:  # noqa: BLE001 - any escape is the finding
            exception = f"{type(caught).__name__}: {str(caught)[:160]}"
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    leftovers = [p.name for p in folder.rglob(".servesim-*") if p.is_dir()]
    summary = folder / "out" / "summary.json"
    served_nothing = code == 0 and summary.is_file() and \
        json.loads(summary.read_text()).get("completed") == 0
    return Outcome(code, out.getvalue(), err.getvalue(), peak, leftovers, exception,
                   served_nothing)


@contextlib.contextmanager
def _address_space_capped():
    """A soft address-space limit HEADROOM_BYTES above today's, so an input that reads
    without end fails with MemoryError here instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as handle:
        used = int(handle.read().split()[0]) * resource.getpagesize()
    cap = used + HEADROOM_BYTES
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def problem(outcome: Outcome, case: Case) -> str | None:
    """What the outcome breaks (None: a clean success or a clean user error)."""
    text = outcome.out + outcome.err
    if outcome.code == 0 and case.must_fail is not None:
        return f"accepted silently: {case.must_fail}"
    if outcome.code == 0 and case.must_note is not None and case.must_note not in text:
        return f"no note naming {case.must_note}"
    if outcome.exception is not None:
        return f"exception {outcome.exception}"
    if "Traceback" in text:
        return "traceback text"
    if outcome.code not in (0, 2):
        return f"exit code {outcome.code}"
    if outcome.peak_bytes > MAX_PEAK_BYTES:
        return f"peak memory {outcome.peak_bytes / 2**20:.0f} MiB"
    if outcome.leftovers:
        return f"staging directory left: {outcome.leftovers[0]}"
    if "set_int_max_str_digits" in text or max(map(len, text.splitlines()), default=0) > 600:
        return "unbounded message"
    if "invalid value encountered" in text or "RuntimeWarning" in text:
        return "numpy warning reached the user"
    if outcome.served_nothing:
        return "a run that served nothing exited 0"
    if outcome.code == 2 and not outcome.err.strip():
        return "exit 2 without a message"
    return None


def check(case: Case) -> None:
    with tempfile.TemporaryDirectory() as folder:
        outcome = run_case(case, Path(folder))
        shutil.rmtree(folder, ignore_errors=True)
    found = problem(outcome, case)
    assert found is None, f"{case.kind} {case.argv}: {found}\n{outcome.err[-800:]}"


SUITE = settings(max_examples=12, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))


@SUITE
@given(scenario_cases())
def test_scenario_documents(case: Case) -> None:
    check(case)


@SUITE
@given(set_cases())
def test_set_overrides(case: Case) -> None:
    check(case)


@SUITE
@given(trace_cases())
def test_trace_files(case: Case) -> None:
    check(case)


@SUITE
@given(config_cases())
def test_config_json_files(case: Case) -> None:
    check(case)


@settings(SUITE, max_examples=6)
@given(explain_cases())
def test_explain_on_damaged_runs(case: Case) -> None:
    check(case)
