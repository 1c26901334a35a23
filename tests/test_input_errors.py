"""Issue 46's hostile inputs, one test each: a clear error (exit 2, the field, the value cut
to ~60 characters, what is allowed, no traceback) or a note where the input is legitimate.

Every case runs through the CLI's entry point (`sim.cli.main`) as a user would type it.
"""

from __future__ import annotations

import json
import tracemalloc
import warnings
from pathlib import Path

import pytest

from sim.cli import main

SMALL = """
workload:
  arrivals: {process: poisson, rate: 4}
  prompt_tokens: {dist: fixed, value: 100}
  output_tokens: {dist: fixed, value: 10}
  num_requests: 12
"""
TRACE = "workload:\n  trace: t.csv\n"
LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
         "vocab_size": 128256, "max_position_embeddings": 8192}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SMALL)
    (tmp_path / "tr.yaml").write_text(TRACE)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def user_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error a command prints; fails unless it exits 2 with a short message."""
    code, out, err = cli(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in err and len(err) < 700, err
    assert err.startswith(("error: ", "servesim ")), err
    return err


def run_args(scenario: str, *extra: str) -> list[str]:
    return ["run", scenario, "--no-plots", "--quiet", "--out", "out", *extra]


def write_trace(tmp: Path, text: str, name: str = "t.csv") -> None:
    (tmp / name).write_text(text)


# Tracebacks


def test_a_vanishing_rate_is_refused_with_the_bound(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    for rate in ("1e-300", "1e-20"):
        err = user_error(capsys, *run_args("s.yaml", "--set",
                                           f"workload.arrivals.rate={rate}"))
        assert "workload.arrivals.rate" in err and "at most 1e+08 s" in err, err
        assert "step start" not in err


def test_a_trace_length_of_ten_to_the_thirty(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    write_trace(tmp_path, f"arrival_s,prompt_tokens,output_tokens\n0,{10**30},5\n1,10,5\n")
    err = user_error(capsys, *run_args("tr.yaml"))
    assert "t.csv:2" in err and "prompt_tokens" in err and "at most 100,000,000" in err, err


@pytest.mark.parametrize("content, expected", [
    (b"request_id,state,ttft_ms\n0,finished,1\n", "requests.csv:1: the header lacks"),
    (b"", "the file is empty"),
    (bytes(range(128, 256)) * 4, "not a text file"),
])
def test_explain_on_a_broken_requests_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          content: bytes, expected: str) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "requests.csv").write_bytes(content)
    err = user_error(capsys, "explain", "run")
    assert expected in err, err


# Memory without bound


def test_a_billion_layers_is_refused_before_it_allocates(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**LLAMA,
                                                            "num_hidden_layers": 10**9}))
    tracemalloc.start()
    try:
        err = user_error(capsys, "capacity", "--config", "m/config.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "num_hidden_layers" in err and "at most 4,096" in err, err
    assert peak < 200 * 2**20


def test_a_device_as_the_scenario_is_not_read(capsys: pytest.CaptureFixture[str]) -> None:
    err = user_error(capsys, "run", "/dev/zero")
    assert "/dev/zero" in err and "not a regular file" in err, err


# Silently accepted


def test_a_duplicate_yaml_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("seed: 1\nseed: 2\n" + SMALL)
    err = user_error(capsys, *run_args("d.yaml"))
    assert "'seed' given twice" in err and "line 1" in err and "line 2" in err, err


def test_a_boolean_is_not_an_integer(capsys: pytest.CaptureFixture[str]) -> None:
    for setting in ("scheduler.max_num_seqs=true", "workload.prompt_tokens.value=false",
                    "seed=yes"):
        err = user_error(capsys, *run_args("s.yaml", "--set", setting))
        assert setting.split("=")[0] + ":" in err and "true/false" in err, err
    code, _, err = cli(capsys, *run_args("s.yaml", "--set", "kv.prefix_caching=true"))
    assert code == 0, err  # a boolean field still takes one


def test_a_trace_column_given_twice(capsys: pytest.CaptureFixture[str], tmp_path: Path
                                    ) -> None:
    write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,1,1,2\n")
    err = user_error(capsys, *run_args("tr.yaml"))
    assert "t.csv:1" in err and "'prompt_tokens' appears 2 times" in err, err


@pytest.mark.parametrize("rows, line", [("-5,10,10\n-4,10,10\n", 2),
                                        ("0,10,10\n3,10,10\n1,10,10\n", 4)])
def test_negative_or_backwards_trace_times(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           rows: str, line: int) -> None:
    write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n" + rows)
    err = user_error(capsys, *run_args("tr.yaml"))
    assert f"t.csv:{line}: arrival_s" in err, err
    assert ("negative" if line == 2 else "earlier than") in err, err


def test_an_inconsistent_head_size_is_a_note(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**LLAMA, "hidden_size": 4000,
                                                            "num_attention_heads": 48}))
    code, _, err = cli(capsys, "capacity", "--config", "m/config.json")
    assert code == 0, err
    assert "hidden_size 4000" in err and "num_attention_heads 48" in err, err
    assert "head_dim taken as 83" in err, err


def test_a_truncated_requests_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = cli(capsys, "run", "s.yaml", "--no-plots", "--quiet", "--out", "run")
    assert code == 0, err
    requests = tmp_path / "run" / "requests.csv"
    lines = requests.read_text().splitlines(keepends=True)
    requests.write_text("".join(lines[:6]))  # whole rows cut: only summary.json knows
    err = user_error(capsys, "explain", "run")
    assert "5 request rows" in err and "counts 12" in err, err
    requests.write_text("".join(lines[:5]) + lines[5][:20])  # cut inside a row
    err = user_error(capsys, "explain", "run")
    assert "requests.csv:6:" in err and "cut short" in err, err


def test_a_set_key_given_twice(capsys: pytest.CaptureFixture[str]) -> None:
    err = user_error(capsys, *run_args("s.yaml", "--set", "seed=1", "--set", "seed=2"))
    assert "--set 'seed': given twice" in err, err


# Messages


@pytest.mark.parametrize("target, expected", [("adir", "is a directory"),
                                              ("/dev/zero", "not a regular file")])
def test_a_trace_that_is_no_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                 target: str, expected: str) -> None:
    (tmp_path / "adir").mkdir()
    err = user_error(capsys, *run_args("tr.yaml", "--set", f"workload.trace={target}"))
    assert expected in err and "not found" not in err, err


def test_a_binary_trace_names_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path
                                       ) -> None:
    (tmp_path / "t.csv").write_bytes(b"\x00\xff" * 500)
    err = user_error(capsys, *run_args("tr.yaml"))
    assert "t.csv" in err and "not a text file" in err, err


@pytest.mark.parametrize("where", ["set", "yaml", "trace", "jsonl", "config"])
def test_a_5000_digit_number_is_not_echoed(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           where: str) -> None:
    huge = "9" * 5000
    if where == "set":
        err = user_error(capsys, *run_args("s.yaml", "--set", f"seed={huge}"))
    elif where == "yaml":
        (tmp_path / "h.yaml").write_text(f"seed: {huge}\n" + SMALL)
        err = user_error(capsys, *run_args("h.yaml"))
    elif where == "trace":
        write_trace(tmp_path, f"arrival_s,prompt_tokens,output_tokens\n0,{huge},1\n")
        err = user_error(capsys, *run_args("tr.yaml"))
    elif where == "jsonl":
        write_trace(tmp_path, f'{{"timestamp": 0, "input_length": {huge}, '
                    '"output_length": 1}\n', "t.jsonl")
        err = user_error(capsys, *run_args("tr.yaml", "--set", "workload.trace=t.jsonl"))
    else:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text(
            json.dumps(LLAMA).replace("8192", huge))
        err = user_error(capsys, "capacity", "--config", "m/config.json")
    assert huge[:100] not in err and "set_int_max_str_digits" not in err, err


def test_a_zero_slo_shows_the_value(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "slo.yaml").write_text("slo:\n  ttft_ms: 0\n" + SMALL)
    err = user_error(capsys, *run_args("slo.yaml"))
    assert "slo.ttft_ms: Input should be greater than 0 (got 0)" in err, err


@pytest.mark.parametrize("setting", ["workload.arrivals.rate=1e-300",
                                     "workload.trace.time_scale=1e-300"])
def test_no_numpy_cast_warning_reaches_the_user(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path, setting: str) -> None:
    write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,10,5\n10,10,5\n")
    scenario = "tr.yaml" if "trace" in setting else "s.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would surface as an exception
        err = user_error(capsys, *run_args(scenario, "--set", setting))
    assert "invalid value" not in err and "at most 1e+08 s" in err, err


def test_a_run_that_serves_nothing_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "run", "s.yaml", "--no-plots", "--out", "out", "--set",
                         "workload.prompt_tokens.value=9000")
    assert code == 2, err
    assert "Benchmark duration" not in out + err
    assert "every request was rejected" in err and "max_model_len" in err, err


def test_a_sweep_point_that_serves_nothing_exits_2_after_writing(
        capsys: pytest.CaptureFixture[str]) -> None:
    """As `run`: the grid point where every request was rejected is named with the reason,
    the exit code is 2, and the table keeps every point (nothing lost)."""
    code, out, err = cli(capsys, "sweep", "s.yaml", "--grid",
                         "workload.prompt_tokens.value=100,9000", "--jobs", "1", "--quiet",
                         "--out", "sw")
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert "workload.prompt_tokens.value=9000" in err and "every request was rejected" in err
    assert "value=100:" not in err and "max_model_len" in err, err
    assert len(Path("sw/sweep.csv").read_text().splitlines()) == 3  # header + both points


def test_a_compare_variant_that_serves_nothing_exits_2_after_writing(
        capsys: pytest.CaptureFixture[str]) -> None:
    scenario = "".join(f"  {line}\n" for line in SMALL.strip().splitlines())
    Path("c.yaml").write_text("scenario:\n" + scenario + """variants:
  - name: fits
    set: {}
  - name: too_short
    set: {scheduler.max_model_len: 50}
rates: [2]
""")
    code, out, err = cli(capsys, "compare", "c.yaml", "--jobs", "1", "--quiet", "--no-plots",
                         "--out", "cmp")
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert "'too_short' at 2 req/s" in err and "every request was rejected" in err, err
    assert "'fits'" not in err
    assert Path("cmp/compare.csv").exists()


# Item 7: the same percentile, a partial workload


def test_explain_prints_the_runs_p99(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "run", "--no-plots", "--quiet", "--out", "run", "--set",
                       "workload.num_requests=200", "--set", "workload.arrivals.rate=12")
    assert code == 0, err
    p99 = json.loads(Path("run/summary.json").read_text())["p99_ttft_ms"]
    code, out, err = cli(capsys, "explain", "run")
    assert code == 0, err
    assert f"p99 {p99:.1f} ms" in out, out


def test_a_partial_workload_merges_with_the_default(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("workload:\n  num_requests: 7\n  arrivals: {rate: 2}\n")
    code, _, err = cli(capsys, "run", "p.yaml", "--no-plots", "--quiet", "--out", "out")
    assert code == 0, err
    summary = json.loads(Path("out/summary.json").read_text())
    assert summary["completed"] + summary["rejected"] == 7
    (tmp_path / "q.yaml").write_text("workload:\n  prompt_tokens: {value: 100}\n")
    err = user_error(capsys, *run_args("q.yaml"))
    assert "workload.prompt_tokens.dist: missing" in err, err


def test_a_spelled_out_workload_takes_nothing_from_the_default(tmp_path: Path) -> None:
    from sim.config.loader import load_scenario

    (tmp_path / "w.yaml").write_text(SMALL.replace("{dist: fixed, value: 100}",
                                                   "{dist: lognormal, mean: 300, cv: 1}"))
    workload = load_scenario(tmp_path / "w.yaml")[0].workload
    assert workload.prompt_tokens.max is None and workload.num_requests == 12
    partial = load_scenario(tmp_path / "s.yaml", ["workload.arrivals.rate=2"])[0].workload
    assert partial.arrivals.rate == 2 and partial.arrivals.process == "poisson"
