"""Traces in the formats users have: named formats by their real columns, any CSV through a
column mapping, arrivals optional, empirical lengths from any column, the shipped `builtin:`
traces, and the two content rules (arrivals never go back; a length of 0 reads as 1, loudly)."""

from __future__ import annotations

import csv
import re
import warnings
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from sim.cli import main
from sim.config.draws import EmpiricalConfig
from sim.workload import WorkloadConfig, make_requests
from sim.workload.build import BUILTIN_TRACES, length_spec, load_trace
from sim.workload.csv_traces import read_cells
from sim.workload.text import trace_lengths
from sim.workload.trace_rows import counts
from sim.workload.traces import TraceFormatError, detect_format, read_trace

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
POISSON = {"process": "poisson", "rate": 5.0}


def rows_of(name: str) -> list[dict[str, str]]:
    with (FIXTURES / name).open(newline="") as handle:
        return list(csv.DictReader(handle))


def requests(trace: object, seed: int = 0, **workload: object) -> list:
    cfg = WorkloadConfig.model_validate({"trace": trace, **workload})
    return list(make_requests(cfg, seed, base_dir=FIXTURES))


# ---------------------------------------------------------------- named formats


@pytest.mark.parametrize(("name", "fmt", "prompt", "output"), [
    ("azure_2023.csv", "azure", "ContextTokens", "GeneratedTokens"),
    ("burstgpt.csv", "burstgpt", "Request tokens", "Response tokens"),
    ("vidur_lengths.csv", "vidur", "num_prefill_tokens", "num_decode_tokens"),
])
def test_a_named_csv_format_is_detected_and_read_row_for_row(
        name: str, fmt: str, prompt: str, output: str) -> None:
    path = FIXTURES / name
    assert detect_format(path) == fmt
    rows = rows_of(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = read_trace(path)
    assert len(caught) == (fmt == "burstgpt")  # its failed request has 0 response tokens
    assert trace.prompt_tokens.tolist() == [int(r[prompt]) for r in rows]
    assert trace.output_tokens.tolist() == [max(int(r[output]), 1) for r in rows]
    assert trace.arrivals_given == (fmt != "vidur")


def test_azure_date_times_and_burstgpt_seconds_become_arrivals_from_zero() -> None:
    azure = read_trace(FIXTURES / "azure_2023.csv")
    np.testing.assert_allclose(azure.arrival_s, [0.0, 0.25, 0.9, 0.9, 2.65], atol=1e-9)
    with pytest.warns(UserWarning):
        burst = read_trace(FIXTURES / "burstgpt.csv", "burstgpt", time_scale=2.0)
    assert burst.arrival_s.tolist() == [0.0, 2.0, 2.0, 4.5]


def test_burstgpt_failed_request_reads_as_one_token_with_a_warning_and_keeps_its_row() -> None:
    with pytest.warns(UserWarning, match=r"burstgpt\.csv: 1 rows have Response tokens 0 \(first "
                      r"at line 3\); each is read as 1 token"):
        reqs = requests({"path": "burstgpt.csv"})
    rows = rows_of("burstgpt.csv")
    assert [r.request_id for r in reqs] == list(range(len(rows)))
    assert [r.prompt_tokens for r in reqs] == [int(r["Request tokens"]) for r in rows]
    assert reqs[1].output_tokens == 1


def test_mooncake_fixture_keeps_rows_and_hash_ids() -> None:
    reqs = requests("mooncake.jsonl")
    assert [r.arrival_s for r in reqs] == [0.0, 0.0, 2.38]
    assert [r.prefix_block_ids for r in reqs] == [(0, 1, 2), (0, 3), (0, 1, 2, 4)]


def test_a_length_only_trace_takes_its_arrivals_from_the_workload() -> None:
    with pytest.raises(ValueError, match=r"workload\.arrivals: .*vidur_lengths\.csv has no "
                       r"arrived_at; set workload\.arrivals"):
        requests("vidur_lengths.csv")
    reqs = requests("vidur_lengths.csv", seed=4, arrivals=POISSON)
    rows = rows_of("vidur_lengths.csv")
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in rows]
    gaps = np.diff([r.arrival_s for r in reqs])
    assert reqs[0].arrival_s == 0.0 and (gaps > 0).all()  # Poisson, not the file's zeros
    assert [r.arrival_s for r in requests("vidur_lengths.csv", 4, arrivals=POISSON)] == [
        r.arrival_s for r in reqs]
    assert [r.arrival_s for r in requests("vidur_lengths.csv", 5, arrivals=POISSON)] != [
        r.arrival_s for r in reqs]


def test_vidur_arrived_at_is_used_when_present(tmp_path: Path) -> None:
    path = tmp_path / "v.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n1.5,10,2\n4.0,20,3\n")
    trace = read_trace(path)
    assert trace.arrivals_given and trace.arrival_s.tolist() == [0.0, 2.5]


# ---------------------------------------------------------------- any CSV, by a column mapping


OWN = {"arrival_s": "sent_at", "prompt_tokens": "input_len", "output_tokens": "output_len"}


def test_any_csv_replays_through_a_column_mapping() -> None:
    reqs = requests({"path": "own_columns.csv", "columns": OWN, "time_scale": 0.5})
    rows = rows_of("own_columns.csv")
    t0 = float(rows[0]["sent_at"])
    assert [r.arrival_s for r in reqs] == pytest.approx(
        [(float(r["sent_at"]) - t0) / 0.5 for r in rows])
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (int(r["input_len"]), int(r["output_len"])) for r in rows]


def test_a_mapping_without_arrivals_uses_the_arrival_process() -> None:
    lengths = {"prompt_tokens": "input_len", "output_tokens": "output_len"}
    reqs = requests({"path": "own_columns.csv", "columns": lengths}, arrivals=POISSON)
    assert [r.prompt_tokens for r in reqs] == [128, 64, 900, 32]
    assert reqs[2].arrival_s > reqs[1].arrival_s  # the file's tie at 1.25 s is not used


def test_arrival_s_null_replays_a_timed_trace_at_the_arrival_process() -> None:
    cols = {"arrival_s": None}
    reqs = requests({"path": "azure_2023.csv", "columns": cols}, arrivals=POISSON)
    rows = rows_of("azure_2023.csv")
    assert [r.prompt_tokens for r in reqs] == [int(r["ContextTokens"]) for r in rows]
    assert reqs[3].arrival_s != reqs[2].arrival_s  # the file's tie is gone: Poisson times


def test_a_named_arrival_column_must_exist_and_mappings_fit_csv_only(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"own_columns\.csv:1: expected a header with "
                       r"input_len, output_len, when"):
        requests({"path": "own_columns.csv", "columns": {**OWN, "arrival_s": "when"}})
    with pytest.raises(ValidationError, match="columns: maps the columns of a CSV"):
        WorkloadConfig.model_validate(
            {"trace": {"path": "m.jsonl", "format": "mooncake", "columns": OWN}})
    with pytest.raises(ValueError, match=r"trace\.columns: .* read as 'mooncake'"):
        requests({"path": "mooncake.jsonl", "columns": OWN})
    with pytest.raises(ValidationError, match="prompt_tokens: a replay needs a column"):
        WorkloadConfig.model_validate({"trace": {"path": "x.csv",
                                                 "columns": {"prompt_tokens": None}}})
    with pytest.raises(ValidationError, match="colour"):
        WorkloadConfig.model_validate({"trace": {"path": "x.csv", "columns": {"colour": "c"}}})


def test_an_unknown_header_shows_the_mapping_form(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    message = str(err.value)
    assert "mine.csv:1: expected a header with prompt_tokens, output_tokens" in message
    assert "trace: {path: FILE, columns: {prompt_tokens: COL, output_tokens: COL" in message
    assert "burstgpt: Request tokens, Response tokens" in message


def test_a_bare_trace_path_is_the_path_form() -> None:
    bare = WorkloadConfig.model_validate({"trace": "azure_2023.csv"})
    assert bare.trace == WorkloadConfig.model_validate(
        {"trace": {"path": "azure_2023.csv"}}).trace
    assert len(requests("azure_2023.csv")) == 5


def test_set_reaches_into_a_bare_trace_path() -> None:
    from sim.config.loader import apply_overrides

    raw = apply_overrides({"workload": {"trace": "x.csv"}}, ["workload.trace.time_scale=2"])
    assert raw["workload"]["trace"] == {"path": "x.csv", "time_scale": 2}


# ---------------------------------------------------------------- empirical lengths


def test_empirical_lengths_from_any_named_column() -> None:
    def draws(spec: dict) -> set[int]:
        cfg = WorkloadConfig.model_validate({
            "arrivals": POISSON, "num_requests": 400,
            "prompt_tokens": spec, "output_tokens": {"dist": "fixed", "value": 1}})
        return {r.prompt_tokens for r in make_requests(cfg, 0, base_dir=FIXTURES)}

    with pytest.warns(UserWarning, match="Response tokens 0"):
        assert draws({"dist": "empirical", "trace": "burstgpt.csv",
                      "column": "Response tokens"}) == {96, 1, 310, 45}
    assert draws({"dist": "empirical", "trace": "burstgpt.csv",
                  "column": "Total tokens"}) == {516, 1210, 375, 925}
    assert draws({"dist": "empirical", "trace": "mooncake.jsonl",
                  "column": "output_length"}) == {30, 5, 70}
    assert draws({"dist": "empirical", "trace": "own_columns.csv",
                  "column": "input_len"}) == {128, 64, 900, 32}
    with pytest.raises(TraceFormatError, match=r"own_columns\.csv:1: expected a header with "
                       r"nope"):
        draws({"dist": "empirical", "trace": "own_columns.csv", "column": "nope"})
    with pytest.raises(TraceFormatError, match=r"own_columns\.csv:2: expected user as a "
                       r"non-negative integer, got 'alice'"):
        draws({"dist": "empirical", "trace": "own_columns.csv", "column": "user"})


# ---------------------------------------------------------------- content rules


@pytest.mark.parametrize(("name", "text", "where"), [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.5,3,8\n"
     "2023-11-16 18:17:03.9,4,2\n", r"a\.csv:3: TIMESTAMP '2023-11-16 18:17:03\.9' is earlier "
     r"than line 2's '2023-11-16 18:17:04\.5'"),
    ("p.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n\n2,1,1\n1.5,1,1\n",
     r"p\.csv:5: arrival_s '1\.5' is earlier than line 4's '2'"),
    ("m.jsonl", '{"timestamp": 9, "input_length": 5, "output_length": 1}\n'
     '{"timestamp": 3, "input_length": 5, "output_length": 1}\n',
     r"m\.jsonl:2: timestamp 3 is earlier than line 1's 9"),
    ("t.jsonl", '{"prompt": "a", "arrival_s": 2}\n{"prompt": "b", "arrival_s": 1}\n',
     r"t\.jsonl:2: arrival_s 1 is earlier than line 1's 2"),
])
def test_arrivals_that_go_back_are_an_error_naming_the_line_and_value(
        tmp_path: Path, name: str, text: str, where: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=where + r".*must not go back.*sort the rows"):
        read_trace(path)


def test_cli_exits_2_on_a_trace_that_goes_back_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n5,10,2\n1,10,2\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({"name": "back", "workload": {"trace": "t.csv"}}))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "t.csv:3: arrival_s '1' is earlier than line 2's '5'" in err
    assert "Traceback" not in err and not out.exists()


def test_zero_prompts_warn_once_per_column_and_ids_still_match_rows(tmp_path: Path) -> None:
    (tmp_path / "z.csv").write_text("arrival_s,prompt_tokens,output_tokens\n"
                                    "0,5,0\n1,0,3\n2,0,0\n3,7,7\n")
    cfg = WorkloadConfig.model_validate({"trace": "z.csv"})
    with pytest.warns(UserWarning) as caught:
        reqs = list(make_requests(cfg, 0, base_dir=tmp_path))
    assert sorted(str(w.message).split(": ", 1)[1] for w in caught) == [
        "2 rows have output_tokens 0 (first at line 2); each is read as 1 token, the least a "
        "request has",
        "2 rows have prompt_tokens 0 (first at line 3); each is read as 1 token, the least a "
        "request has"]
    assert [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0, 0.0, 5, 1), (1, 1.0, 1, 3), (2, 2.0, 1, 1), (3, 3.0, 7, 7)]


# ---------------------------------------------------------------- shipped traces


@pytest.mark.parametrize("name", sorted(BUILTIN_TRACES))
def test_empirical_lengths_are_the_traces_lengths(name: str) -> None:
    """A CSV trace's prompt or output column is read alone for an empirical draw (no arrival
    times parsed): the same values, zeros and all, as the whole trace's lengths."""
    trace = load_trace(f"builtin:{name}", None)
    for column in ("prompt", "output"):
        spec = length_spec(EmpiricalConfig(dist="empirical", trace=f"builtin:{name}"), column)
        assert spec.dist.values == tuple(trace_lengths(trace, column).tolist())


def test_every_builtin_trace_loads_and_is_package_data() -> None:
    lengths = {"azure_code": 8_819, "azure_conv": 19_366, "mooncake_conv": 12_031,
               "synthetic_conv": 2_000}
    assert set(BUILTIN_TRACES) == set(lengths)
    for name, rows in lengths.items():
        assert len(load_trace(f"builtin:{name}", None)) == rows
    data = ROOT / "sim" / "workload"
    pyproject = (ROOT / "pyproject.toml").read_text()
    globs = re.findall(r'"([^"]+)"', re.search(r'"sim\.workload" = \[(.*)\]', pyproject)[1])
    shipped = [p.relative_to(data).as_posix() for p in (data / "data").rglob("*")
               if p.is_file() and p.suffix != ".py"]
    assert "data/traces/README.md" in shipped
    assert [f for f in shipped if not any(fnmatch(f, g) for g in globs)] == []
    readme = (data / "data" / "traces" / "README.md").read_text()
    for needle in ("CC-BY 4.0", "Apache License 2.0", "Splitwise", "Mooncake", "azure_code",
                   "azure_conv", "mooncake_conv"):
        assert needle in readme


def test_an_unknown_builtin_lists_the_shipped_ones() -> None:
    with pytest.raises(FileNotFoundError, match="builtin:azure_code, builtin:azure_conv, "
                       "builtin:mooncake_conv"):
        load_trace("builtin:azure", None)


def test_cli_shows_a_zero_length_warning_as_one_line_and_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(
        {"name": "burst", "workload": {"trace": str(FIXTURES / "burstgpt.csv")}}))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet",
                 "--no-plots"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "Response tokens 0" in line] == [
        f"warning: {FIXTURES / 'burstgpt.csv'}: 1 rows have Response tokens 0 (first at line 3);"
        " each is read as 1 token, the least a request has"]
    assert not [line for line in err if "at_least_one(" in line]  # no source line below it


def _compare_base(tmp_path: Path, workload: dict) -> object:
    from sim.experiments.compare import load_spec

    spec = tmp_path / "c.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "c", "scenario": {"name": "c", "workload": workload},
        "variants": [{"name": "a", "set": {"kv.block_size": 16}},
                     {"name": "b", "set": {"kv.block_size": 32}}],
        "rates": [2.0, 8.0]}))
    return load_spec(spec)


def test_compare_speeds_up_a_bare_trace_and_sets_the_rate_of_an_untimed_one(
        tmp_path: Path) -> None:
    timed = _compare_base(tmp_path, {"trace": str(FIXTURES / "azure_2023.csv")})
    variant = timed.spec.variants[0]
    span_s = 2.65  # 5 arrivals over 2.65 s: 4 / 2.65 req/s at time_scale 1
    assert timed.scenario(variant, 8.0).workload.trace.time_scale == pytest.approx(
        8.0 / (4 / span_s))
    untimed = _compare_base(tmp_path, {"trace": str(FIXTURES / "vidur_lengths.csv"),
                                       "arrivals": POISSON})
    scenario = untimed.scenario(untimed.spec.variants[0], 8.0)
    assert scenario.workload.arrivals.rate == 8.0 and scenario.workload.trace.time_scale == 1.0


# ---------------------------------------------------------------- the reader's two paths


@pytest.mark.parametrize(("body", "lines"), [
    ("0,5,1\n1,007,2\n2,12,3\n", [2, 3, 4]),            # one line a row: sliced whole
    ("0,5,1\n\n1,007,2\n2,12,3\n", [2, 4, 5]),          # a blank row: row by row
    ('0,5,1\n1,007,"2"\n2,12,3,extra\n', [2, 3, 4]),    # quotes and a surplus field
    ('0,"5",1\n1,007,"2\n"\n2,12,3\n', [2, 4, 5]),      # a quoted newline: row by row,
                                                       # a row's line is where it ends
])
def test_both_readers_give_the_same_cells_and_the_files_own_line_numbers(
        tmp_path: Path, body: str, lines: list[int]) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + body, newline="")
    got_lines, (prompts, outputs) = read_cells(path, ["prompt_tokens", "output_tokens"])
    assert got_lines == lines
    assert prompts == ["5", "007", "12"]
    assert counts(prompts, got_lines, path, "prompt_tokens").tolist() == [5, 7, 12]
    assert [o.strip() for o in outputs] == ["1", "2", "3"]


@pytest.mark.parametrize("cells", [["1", "007", "42"], ["+3", " 12", "4"], ["1_000", "2"],
                                   ["9" * 8, "0"], ["\u0661\u0662", "3"]])
def test_token_counts_read_as_numpy_reads_them(tmp_path: Path, cells: list[str]) -> None:
    got = counts(cells, list(range(2, 2 + len(cells))), tmp_path / "t.csv", "prompt_tokens")
    assert got.dtype == np.int64
    assert got.tolist() == np.asarray(cells, dtype=np.str_).astype(np.int64).tolist()
