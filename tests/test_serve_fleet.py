"""`servesim serve --replicas N` and its front port (issue 47 item 7), all on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sim.config.scenario import Scenario
from sim.serve.fleet import BackgroundFleet, Fleet, offset_endpoint
from sim.serve.server import simulated_served
from sim.text import load_tokenizer
from sim.world.router import build_router

openai = pytest.importorskip("openai")

ROOT = Path(__file__).parent.parent
CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}


def scenario() -> Scenario:
    return Scenario.model_validate({"name": "fleet", "model": "tiny",
                                    "hardware": {"gpu": CPU_HW},
                                    "latency": {"step_overhead_ms": 1.0},
                                    "kv": {"prefix_caching": True, "block_size": 4},
                                    "output": {"plots": False}})


def generated(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("vllm:generation_tokens_total"))
    return float(line.rsplit(" ", 1)[1])


def fleet(n: int, policy: str | None) -> Fleet:
    tok = load_tokenizer("byte")
    served = [simulated_served(scenario(), tok) for _ in range(n)]
    return Fleet(served, "127.0.0.1", 0, None if policy is None else build_router(policy),
                 0 if policy else None)


def test_offset_endpoint_is_vllms_rank_offset() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv-1"


def test_each_replica_is_its_own_server() -> None:
    with BackgroundFleet(fleet(3, None)) as urls:
        assert len(urls) == 3 and len(set(urls)) == 3
        for i, url in enumerate(urls):
            r = httpx.post(url + "/v1/completions", timeout=30,
                           json={"prompt": "hello", "max_tokens": 2 + i})
            assert r.json()["usage"]["completion_tokens"] == 2 + i
        assert [generated(u) for u in urls] == [2.0, 3.0, 4.0]


def test_the_front_routes_with_the_simulators_policies() -> None:
    with BackgroundFleet(fleet(3, "round_robin")) as urls:
        front, replicas = urls[-1], urls[:-1]
        picks = [httpx.post(front + "/v1/completions", timeout=30, json={
            "prompt": f"p{i}", "max_tokens": 2}).headers["servesim-replica"] for i in range(6)]
        assert sorted(picks) == ["0", "0", "1", "1", "2", "2"]
        assert [generated(u) for u in replicas] == [4.0, 4.0, 4.0]
        c = openai.OpenAI(base_url=front + "/v1", api_key="none", max_retries=0, timeout=30)
        pieces = [ch.choices[0].text for ch in c.completions.create(
            model="tiny", prompt="x", max_tokens=5, stream=True)]
        assert len(pieces) == 5
        assert httpx.get(front + "/health", timeout=30).status_code == 200
    with BackgroundFleet(fleet(3, "prefix_aware")) as urls:
        front = urls[-1]
        long = "a shared system prompt that spans several blocks. " * 3
        first = httpx.post(front + "/v1/completions", timeout=30,
                           json={"prompt": long + "q0", "max_tokens": 2})
        later = [httpx.post(front + "/v1/completions", timeout=30, json={
            "prompt": long + f"q{i}", "max_tokens": 2}).headers["servesim-replica"]
                 for i in range(1, 4)]
        assert later == [first.headers["servesim-replica"]] * 3  # where its prefix is cached


def test_the_cli_starts_a_fleet_and_writes_each_replica(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "sim.cli", "serve", "--replicas", "2", "--port", "0",
           "--router-port", "0", "--set", "output.plots=false", "--out", str(tmp_path / "o")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("routing" in x for x in lines):
            lines.append(proc.stderr.readline())
        front = re.search(r"routing \(round_robin\) on (http://\S+)/v1", "".join(lines))
        assert front, lines
        r = httpx.post(front.group(1) + "/v1/completions", timeout=30,
                       json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 0
    assert (tmp_path / "o" / "replica-0" / "summary.json").exists()
    assert (tmp_path / "o" / "replica-1" / "summary.json").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "--replicas", "0"], "--replicas: must be >= 1"),
    (["serve", "--replicas", "2", "--engine"], "--replicas: the engine backend"),
    (["serve", "--kv-events-config", "{nope"], "--kv-events-config: not valid JSON"),
    (["serve", "--kv-events-config", '{"enable_kv_cache_events": true, "replay_endpoint": '
      '"tcp://*:1"}'], "replay_endpoint"),
    (["serve", "--router-port", "-1"], "--router-port"),
    (["load", "http://127.0.0.1:9", "--rate", "-2"], "--rate"),
])
def test_bad_fleet_input_is_one_line_and_exit_2(args: list[str], message: str,
                                                tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sim.cli", *args, "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
