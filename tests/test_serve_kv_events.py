"""KV-cache events over ZMQ in vLLM's schema (issue 47 item 6).

A plain ZMQ SUB socket (bound to 127.0.0.1; the server's PUB connects to it, by
vLLM's rule for a non-wildcard endpoint) rebuilds the server's cached-block set
from the events, and it must equal the pool's own set at the end of a run with
prefix caching and evictions.
"""

from __future__ import annotations

import json
import queue
import threading
import time

import httpx
import pytest

from sim.assemble import build_replica, kv_budget, synchronous
from sim.config.scenario import Scenario
from sim.core.drive import run_steps
from sim.core.request import Request
from sim.serve.kv_events import (
    CacheObserver,
    KVEventsConfigError,
    encode_batch,
    parse_config,
    removed_event,
    stored_event,
)
from sim.serve.server import BackgroundServer, simulated_served
from sim.text import load_tokenizer

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install servesim[events])")
msgpack = pytest.importorskip("msgpack",
                              reason="msgpack is not installed (pip install servesim[events])")

CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}
# vLLM 0.32.0's own encoding (msgspec, vllm.distributed.kv_events.KVEventBatch) of
# KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[123, -5], parent_block_hash=None,
# token_ids=[1, 2, 3, 4], block_size=2, lora_id=None, medium="GPU", lora_name=None,
# group_idx=0), BlockRemoved(block_hashes=[123], medium="GPU", group_idx=0),
# AllBlocksCleared()], data_parallel_rank=0), recorded in its venv
VLLM_BYTES = bytes.fromhex(
    "93cb3ff80000000000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865"
    "73927bfbb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c"
    "6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a9"
    "67726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865"
    "73917ba66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73"
    "436c656172656400")


def scenario() -> Scenario:
    return Scenario.model_validate({
        "name": "kv-events", "model": "tiny", "hardware": {"gpu": CPU_HW},
        "latency": {"step_overhead_ms": 1.0}, "output": {"plots": False},
        "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 64},
        "kv": {"num_blocks": 24, "block_size": 4, "prefix_caching": True}})


def test_the_wire_format_is_vllms_byte_for_byte() -> None:
    events = [{**stored_event(123, None, [1, 2, 3, 4], 2), "block_hashes": [123, -5]},
              removed_event([123]), {"type": "AllBlocksCleared"}]
    assert encode_batch(1.5, events, 0) == VLLM_BYTES


def test_config_is_vllms_json() -> None:
    assert parse_config(None) is None
    assert parse_config('{"enable_kv_cache_events": false}') is None
    config = parse_config('{"enable_kv_cache_events": true, "publisher": "zmq", '
                          '"endpoint": "tcp://127.0.0.1:5999", "topic": "kv", "hwm": 10}')
    assert (config.endpoint, config.topic, config.hwm) == ("tcp://127.0.0.1:5999", "kv", 10)
    for bad, field in (('{"enable_kv_cache_events": true, "endpoint": 5}', "endpoint"),
                       ('{"enable": true}', "enable"), ("[1]", "object"),
                       ('{"replay_endpoint": "tcp://*:1"}', "replay_endpoint")):
        with pytest.raises(KVEventsConfigError, match=field):
            parse_config(bad)


def test_events_never_change_the_plans() -> None:
    sc = synchronous(scenario())

    def plans(observe: bool) -> list:
        parts = build_replica(sc, kv_budget(sc))
        sent: list = []
        observer = CacheObserver(parts.kv, sent.extend, lambda _rid: None)
        requests = [Request(i, 0.004 * i, 10 + i % 3, 5, tuple(range(i % 4, 10 + i % 3 + i % 4)))
                    for i in range(20)]
        check = (lambda plan, _s: observer.observe(plan.request_ids)) if observe else None
        _, out = run_steps(parts.scheduler, requests, step_s=lambda _shape: 0.002, check=check)
        assert not observe or sent
        return out

    assert plans(True) == plans(False)


class Subscriber(threading.Thread):
    """A SUB socket bound to 127.0.0.1, owned and polled by its own thread: a socket
    handles its connections (and sends its subscription) only while its thread calls it."""

    def __init__(self, topic: bytes) -> None:
        super().__init__(daemon=True)
        self.topic, self.batches = topic, []
        self.port: queue.Queue[int] = queue.Queue()
        self.connected = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.port.put(sub.bind_to_random_port("tcp://127.0.0.1"))
        try:
            while not self.stop.is_set():
                if monitor.poll(0):
                    monitor.recv_multipart()
                    self.connected.set()
                if sub.poll(20):
                    topic, seq, payload = sub.recv_multipart()
                    self.batches.append((topic, int.from_bytes(seq, "big"),
                                         msgpack.unpackb(payload)))
        finally:
            monitor.close()
            sub.close(linger=0)

    def quiet(self, for_s: float) -> None:
        """Wait until no batch has come for `for_s` seconds."""
        seen = -1
        while seen != len(self.batches):
            seen = len(self.batches)
            time.sleep(for_s)


def test_a_sub_socket_rebuilds_the_pools_cached_set() -> None:
    subscriber = Subscriber(b"kv")
    subscriber.start()
    port = subscriber.port.get(timeout=10)
    config = parse_config(json.dumps({"enable_kv_cache_events": True,
                                      "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}))
    s = simulated_served(scenario(), load_tokenizer("byte"), kv_events=config)
    kv = s.loop.stepper.kv
    try:
        with BackgroundServer(s) as url:
            assert subscriber.connected.wait(10), "the publisher never connected"
            time.sleep(1.0)  # the subscription reaches the PUB side (its I/O thread)

            def send(i: int) -> None:
                prompt = "shared system prompt! " * (1 + i % 2) + f"user {i % 5}"
                httpx.post(url + "/v1/completions", timeout=60,
                           json={"prompt": prompt, "max_tokens": 3 + i % 4, "n": 1 + i % 2})

            threads = [threading.Thread(target=send, args=(i,)) for i in range(14)]
            for t in threads:
                t.start()
                time.sleep(0.02)
            for t in threads:
                t.join(60)
            subscriber.quiet(0.5)
            pool = s.loop.stepper and {kv.block_hash(b) for b in range(kv.num_blocks)} - {None}
            during = len(subscriber.batches)
            evictions = kv.num_evictions
        subscriber.quiet(0.5)  # the AllBlocksCleared of the shutdown
    finally:
        subscriber.stop.set()
        subscriber.join(10)
    batches = subscriber.batches
    assert all(topic == b"kv" and rank == 0 and ts > 0 for topic, _, (ts, _, rank) in batches)
    assert [seq for _, seq, _ in batches] == list(range(len(batches)))  # nothing lost
    assert len(batches) == during + 1
    cached: set[int] = set()
    for _, _, (_, events, _) in batches[:-1]:
        for event in events:
            if event["type"] == "BlockStored":
                assert event["block_size"] == 4 and event["medium"] == "GPU"
                assert event["parent_block_hash"] is None or \
                    event["parent_block_hash"] in cached
                cached.update(event["block_hashes"])
            else:
                assert event["type"] == "BlockRemoved"
                assert set(event["block_hashes"]) <= cached
                cached.difference_update(event["block_hashes"])
    assert evictions > 0
    assert any(e["type"] == "BlockRemoved" for _, _, (_, b, _) in batches for e in b)
    assert cached == pool and pool
    assert batches[-1][2][1] == [{"type": "AllBlocksCleared"}]
    roots = [e for _, _, (_, b, _) in batches for e in b if e["type"] == "BlockStored"
             and e["parent_block_hash"] is None]
    assert {bytes(e["token_ids"]).decode() for e in roots} == {"shar"}
