"""/metrics against vLLM 0.32's own families (issue 47 item 4).

The reference is tests/fixtures/vllm_metric_families_0.32.0.json: the families
vLLM 0.32.0's PrometheusStatLogger registers, with their types, label names and
bucket bounds, read from vLLM's own registry (see its `_source`). The served
text is parsed here without prometheus_client (not a dependency).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from sim.config.scenario import Scenario
from sim.serve.app import ServedModel
from sim.serve.metrics import token_buckets
from sim.serve.server import BackgroundServer, Served, simulated_served
from sim.text import load_tokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metric_families_0.32.0.json"
CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, dict]:
    """family -> {type, samples: [(name, labels, value)]}, by the exposition format's rules."""
    families: dict[str, dict] = defaultdict(lambda: {"type": None, "samples": []})
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            current = name
            families[name]["type"] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, line
            name, labels, value = m.group(1), dict(LABEL.findall(m.group(2) or "")), m.group(3)
            assert current is not None and name.startswith(current), (current, name)
            families[current]["samples"].append((name, labels, float(value)))
    return dict(families)


def scenario() -> Scenario:
    return Scenario.model_validate({
        "name": "metrics", "model": "tiny", "hardware": {"gpu": CPU_HW},
        "latency": {"step_overhead_ms": 2.0}, "output": {"plots": False},
        "kv": {"prefix_caching": True, "block_size": 4}})


def test_families_names_labels_and_buckets_are_vllms() -> None:
    reference = json.loads(FIXTURE.read_text())
    assert reference["vllm_version"] == "0.32.0"
    s = simulated_served(scenario(), load_tokenizer("byte"))
    with BackgroundServer(s) as url:
        httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3}, timeout=30)
        served = parse(httpx.get(url + "/metrics", timeout=30).text)
    names = {f["name"].removesuffix("_total") if f["type"] == "counter" else f["name"]: f
             for f in reference["families"]}
    assert set(served) == set(names)
    for name, ref in names.items():
        fam = served[name]
        assert fam["type"] == ref["type"], name
        labels = set().union(*(set(lab) for _, lab, _ in fam["samples"])) - {"le"}
        if name == "vllm:cache_config_info":  # vLLM labels every CacheConfig field
            assert {"engine", "block_size", "num_gpu_blocks", "enable_prefix_caching"} <= labels
            assert labels <= set(ref["labels"])
        else:
            assert labels == set(ref["labels"]), name
        for label, values in ref.get("label_values", {}).items():
            assert {lab[label] for _, lab, _ in fam["samples"]} == set(values), name
        if ref["type"] == "histogram":
            les = [lab["le"] for n, lab, _ in fam["samples"] if n.endswith("_bucket")]
            assert les[-1] == "+Inf"
            bounds = [float(b) for b in les[:-1]]
            if ref["buckets"][-1] == 5000.0:  # the request-token series, up to the context
                assert list(token_buckets(8192)) == ref["buckets"]
                assert bounds == list(token_buckets(s.model.max_model_len)), name
            else:
                assert bounds == ref["buckets"], name
    assert all(lab.get("engine") == "0" and lab.get("model_name") == "tiny"
               for name, fam in served.items() if name not in (
                   "vllm:cache_config_info", "vllm:admission_rejections")
               for _, lab, _ in fam["samples"])


def values(text: str) -> dict[tuple[str, frozenset], float]:
    return {(n, frozenset((k, v) for k, v in lab.items() if k not in ("model_name", "engine"))):
            value for fam in parse(text).values() for n, lab, value in fam["samples"]}


def one(vals: dict, name: str, **labels: str) -> float:
    return vals[(name, frozenset(labels.items()))]


def test_request_histograms_stop_reasons_and_n_count_as_vllm_does() -> None:
    s = simulated_served(scenario(), load_tokenizer("byte"))
    # the loop's stop handling is the engine backend's; on the simulated passage it shows
    engine_like = Served(s.loop, ServedModel("tiny", s.model.max_model_len, None, "engine"),
                         s.scenario, s.budget, s.latency_name)
    with BackgroundServer(engine_like) as url:
        lengths = httpx.post(url + "/v1/completions", json={
            "prompt": "abcdefghi", "max_tokens": 4, "n": 2}, timeout=30).json()
        stopped = httpx.post(url + "/v1/completions", json={
            "prompt": "abcdefghi", "max_tokens": 40, "stop": ["language"]}, timeout=30).json()
        vals = values(httpx.get(url + "/metrics", timeout=30).text)
    assert [c["finish_reason"] for c in lengths["choices"]] == ["length", "length"]
    assert stopped["choices"][0] == {"index": 0, "text": "Serving a ", "logprobs": None,
                                     "finish_reason": "stop"}
    assert one(vals, "vllm:request_success_total", finished_reason="length") == 2
    assert one(vals, "vllm:request_success_total", finished_reason="stop") == 1
    assert one(vals, "vllm:request_success_total", finished_reason="abort") == 0
    # n: observed once per HTTP request, when its last choice finishes
    assert one(vals, "vllm:request_params_n_count") == 2
    assert one(vals, "vllm:request_params_n_sum") == 3
    assert one(vals, "vllm:request_max_num_generation_tokens_sum") == 4 + stopped["usage"][
        "completion_tokens"]
    assert one(vals, "vllm:e2e_request_latency_seconds_count") == 3
    assert one(vals, "vllm:request_generation_tokens_sum") == 4 + 4 + stopped["usage"][
        "completion_tokens"]
    assert one(vals, "vllm:generation_tokens_total") == one(
        vals, "vllm:request_generation_tokens_sum")
    # the two choices of one request share the prompt's full blocks (block_size 4, prompt 9:
    # the second choice finds the first's two full blocks, admitted in the same step)
    assert one(vals, "vllm:prefix_cache_hits_total") >= 8
    assert one(vals, "vllm:prompt_tokens_total") == 3 * 9
    assert one(vals, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == one(
        vals, "vllm:prefix_cache_hits_total")
    # the phases add up for every request: queue + prefill + decode = e2e
    phases = sum(one(vals, f"vllm:request_{p}_time_seconds_sum")
                 for p in ("queue", "prefill", "decode"))
    assert phases == pytest.approx(one(vals, "vllm:e2e_request_latency_seconds_sum"))
    assert s.loop.stepper.kv.num_used_blocks == 0  # the stopped request was freed


def test_n_children_share_the_prompts_blocks_in_their_first_step() -> None:
    steps: list = []
    s = simulated_served(scenario(), load_tokenizer("byte"), on_step=steps.append)
    with BackgroundServer(s) as url:
        done = httpx.post(url + "/v1/completions", timeout=30, json={
            "prompt": "abcdefghij", "max_tokens": 3, "n": 3}).json()
        vals = values(httpx.get(url + "/metrics", timeout=30).text)
    assert len(done["choices"]) == 3
    # one prefill step runs all three; the second and third find the first's two full
    # blocks (10 tokens, blocks of 4: vLLM caches a block once it is allocated full)
    assert sorted(steps[0].plan.request_ids) == [0, 1, 2]
    assert sorted(steps[0].plan.num_new_tokens) == [2, 2, 10]  # the siblings compute 2 each
    assert one(vals, "vllm:prefix_cache_hits_total") == 2 * 8
    assert one(vals, "vllm:prefix_cache_queries_total") == 3 * 10
    assert one(vals, "vllm:request_params_n_count") == 1
