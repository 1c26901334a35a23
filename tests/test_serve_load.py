"""`servesim load` against `servesim serve` (in process and through the CLI), and the engine
backend behind the same server."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from test_serve import MODEL, client, scenario

from sim.serve.fidelity import compare, replayed_requests, write_report
from sim.serve.load import load_summary, run_load
from sim.serve.server import BackgroundServer, simulated_served
from sim.text import load_tokenizer
from sim.workload import make_requests

WORKLOAD = {"arrivals": {"process": "poisson", "rate": 40.0},
            "prompt_tokens": {"dist": "uniform", "low": 8, "high": 120},
            "output_tokens": {"dist": "uniform", "low": 2, "high": 24}, "num_requests": 30}


def test_load_replays_the_workload_exactly_and_compares_with_the_simulator(tmp_path: Path
                                                                            ) -> None:
    sc = scenario(workload=WORKLOAD)
    tok = load_tokenizer("byte")
    workload = list(make_requests(sc.workload, sc.seed))
    served = simulated_served(sc, tok)
    with BackgroundServer(served) as url:
        recorder, measured = run_load(url, workload, tok)
    frame = recorder.requests_frame()
    assert (frame["status"] == "finished").all() and len(frame) == 30
    # the server saw exactly the scenario's prompt and output lengths
    server = served.loop.recorder.requests_frame()
    assert Counter(zip(server["prompt_tokens"], server["output_tokens"], strict=True)) == \
        Counter((r.prompt_tokens, r.output_tokens) for r in workload)
    assert [m.usage_completion for m in measured] == [r.output_tokens for r in workload]
    assert all(len(m.chunk_s) == r.output_tokens for m, r in zip(measured, workload,
                                                                 strict=True))
    # the client's clock starts before the server's stamp: its TTFT is never the shorter
    assert frame["ttft_ms"].median() >= server["ttft_ms"].median()
    summary = load_summary(recorder, measured, url)
    assert summary["completed"] == 30 and summary["median_itl_ms"] > 0
    fidelity = compare(sc, url, summary, frame, replayed_requests(measured, workload))
    rows = {r["key"]: r for r in fidelity.rows()}
    assert rows["median_tpot_ms"]["simulated"] > 0 and rows["median_tpot_ms"]["measured"] > 0
    assert fidelity.simulated["completed"] == 30
    written = write_report(fidelity, tmp_path, plots=True)
    assert {p.name for p in written} == {"fidelity.json", "fidelity.md",
                                         "fidelity_requests.csv", "latency_cdf.png"}
    assert "| TPOT p50 (ms) |" in (tmp_path / "fidelity.md").read_text()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sim.cli", *args]


def test_cli_serve_then_load_then_ctrl_c_writes_what_was_served(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(scenario(workload={**WORKLOAD, "num_requests": 12}).model_dump(
        mode="json", exclude_none=True)))
    server = subprocess.Popen(_cli("serve", str(spec), "--port", "0", "--out",
                                   str(tmp_path / "served")),
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        port = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert port, line
        url = f"http://127.0.0.1:{port.group(1)}"
        load = subprocess.run(_cli("load", url, str(spec), "--compare", "--quiet", "--out",
                                   str(tmp_path / "load")),
                              capture_output=True, text=True, timeout=120)
        assert load.returncode == 0, load.stderr
        server.send_signal(signal.SIGINT)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
    served = json.loads((tmp_path / "served" / "summary.json").read_text())
    measured = json.loads((tmp_path / "load" / "summary.json").read_text())
    assert served["completed"] == measured["completed"] == 12
    assert served["total_output_tokens"] == measured["total_output_tokens"]
    assert (tmp_path / "load" / "fidelity" / "fidelity.md").is_file()
    assert (tmp_path / "served" / "requests.csv").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["load", "localhost:8000"], "url: must be http"),
    (["load", "http://127.0.0.1:9", "--max-concurrency", "0"], "--max-concurrency"),
    (["serve", "--port", "70000"], "--port: must be 0..65535"),
    (["serve", "--tokenizer", "no-such-tokenizer"], "--tokenizer"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path
                                          ) -> None:
    done = subprocess.run(_cli(*args, "--out", str(tmp_path / "o")), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_load_against_nothing_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(_cli("load", "http://127.0.0.1:9", "--quiet", "--out",
                               str(tmp_path / "o"), "--set", "workload.num_requests=2"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot list models" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()


def test_the_engine_behind_the_server_streams_real_samples() -> None:
    pytest.importorskip("torch")
    from test_engine_loop import scenario as engine_scenario

    from sim.cli.serve_engine import build_engine_stepper
    from sim.serve.app import ServedModel
    from sim.serve.loop import ServeLoop
    from sim.serve.server import Served

    sc = engine_scenario()
    tok = load_tokenizer("byte")
    stepper, budget, max_len = build_engine_stepper(sc, tok)
    loop = ServeLoop(stepper, tok)
    served = Served(loop, ServedModel(MODEL, max_len), sc, budget, "engine")
    with BackgroundServer(served) as url:
        c = client(url)
        greedy = c.completions.create(model=MODEL, prompt="abc", max_tokens=6, temperature=0)
        pieces = [ch.choices[0].text for ch in c.completions.create(
            model=MODEL, prompt="abc", max_tokens=6, temperature=0, stream=True)
            if ch.choices]
        sampled = [c.completions.create(model=MODEL, prompt="abc", max_tokens=6,
                                        temperature=1.0, seed=7).choices[0].text
                   for _ in range(2)]
    assert greedy.usage.completion_tokens == 6
    assert "".join(pieces) == greedy.choices[0].text  # same greedy tokens, streamed
    assert len(pieces) == 6
    assert sampled[0] == sampled[1]  # a seed fixes the sample
    frame = loop.recorder.requests_frame()
    assert len(frame) == 4 and (frame["status"] == "finished").all()
    assert stepper.kv.num_used_blocks == 0
