"""KV-cache events as vLLM publishes them: BlockStored, BlockRemoved, AllBlocksCleared.

Why: KV-aware routers (llm-d's inference scheduler, Dynamo's router) subscribe
to a vLLM server's KV events to know which prefixes each replica holds. The
wire format is vLLM 0.32's (vllm/distributed/kv_events.py): a ZMQ PUB socket
sends three frames per batch, (topic, 8-byte big-endian sequence number,
payload), and the payload is msgpack of `[ts, [event, ...], data_parallel_rank]`
with each event a map whose first key is `type` (msgspec's tagged structs).
Block hashes are the pool's block names (sim/core/prefix.py), signed 64-bit
integers, which vLLM's schema allows (`ExternalBlockHash = bytes | int`).

How, without touching the pool: after every step an observer compares the
pool's set of cached block names with the set it last published, and sends
what left (BlockRemoved) and what came (BlockStored, with the parent's name and
the block's token ids, as vLLM does). It reads the pool and changes nothing,
so plans are the same with events on or off. A block named and evicted
within one step is never published; the subscriber's set still equals the
pool's after every batch. AllBlocksCleared is sent when the server stops: its
cache is gone. Default off; `--kv-events-config` turns it on with vLLM's JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sim.core.kv import KVManager
from sim.core.prefix import block_hashes

OWN_INDEX_MASK = (1 << 24) - 1  # sim.core.prefix.OWN_INDEX_BITS
ALLOWED = {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint",
           "buffer_steps", "hwm", "max_queue_size", "topic"}


class KVEventsConfigError(ValueError):
    """A --kv-events-config the server cannot use; the message names the field."""


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's KVEventsConfig fields that servesim honours (buffer_steps and max_queue_size
    size vLLM's replay buffer and queue; servesim publishes inline and keeps neither)."""

    endpoint: str = "tcp://*:5557"
    topic: str = ""
    hwm: int = 100_000


def parse_config(text: str | None) -> KVEventsConfig | None:
    """`--kv-events-config` JSON: None (events off) unless enable_kv_cache_events is true."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise KVEventsConfigError(f"--kv-events-config: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise KVEventsConfigError("--kv-events-config: must be a JSON object")
    unknown = sorted(set(raw) - ALLOWED)
    if unknown:
        raise KVEventsConfigError(f"--kv-events-config: unknown field {unknown[0]!r}; "
                                  f"allowed: {', '.join(sorted(ALLOWED))}")
    if raw.get("replay_endpoint") is not None:
        raise KVEventsConfigError("--kv-events-config: replay_endpoint: replay is not served "
                                  "by servesim; leave it out")
    if raw.get("publisher", "zmq") not in ("zmq", "null"):
        raise KVEventsConfigError(f"--kv-events-config: publisher: must be 'zmq' or 'null', "
                                  f"got {raw['publisher']!r}")
    if not raw.get("enable_kv_cache_events") or raw.get("publisher") == "null":
        return None
    endpoint, topic, hwm = raw.get("endpoint", "tcp://*:5557"), raw.get("topic", ""), \
        raw.get("hwm", 100_000)
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise KVEventsConfigError(f"--kv-events-config: endpoint: must be a ZMQ address such "
                                  f"as tcp://*:5557, got {endpoint!r}")
    if not isinstance(topic, str):
        raise KVEventsConfigError("--kv-events-config: topic: must be a string")
    if isinstance(hwm, bool) or not isinstance(hwm, int) or hwm < 0:
        raise KVEventsConfigError(f"--kv-events-config: hwm: must be an integer >= 0, got "
                                  f"{hwm!r}")
    return KVEventsConfig(endpoint, topic, hwm)


def cached_names(kv: KVManager) -> dict[int, int]:
    """The pool's cached blocks: name -> the block hits take (read only)."""
    prefix = getattr(kv, "_prefix", None)  # a contiguous pool has no prefix cache
    return {} if prefix is None else prefix.cached


def stored_event(name: int, parent: int | None, tokens: list[int], block_size: int
                 ) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [name], "parent_block_hash": parent,
            "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "group_idx": 0}


def removed_event(names: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": names, "medium": "GPU", "group_idx": 0}


def encode_batch(ts: float, events: list[dict[str, Any]], rank: int = 0) -> bytes:
    """A batch as vLLM's msgspec encoder writes it (array-like, tagged events)."""
    import msgpack

    return msgpack.packb([float(ts), events, rank], use_bin_type=True)


class CacheObserver:
    """Diffs the pool's cached names after each step into vLLM's events."""

    def __init__(self, kv: KVManager, send: Callable[[list[dict[str, Any]]], None],
                 tokens_of: Callable[[int], tuple[list[int], Any] | None]) -> None:
        """`tokens_of(request_id)` -> (its prompt + output token ids so far, its Request),
        or None when the loop no longer holds it."""
        self.kv, self.send, self.tokens_of = kv, send, tokens_of
        self.published: set[int] = set()
        self._chains: dict[int, tuple[int, ...]] = {}

    def _chain(self, rid: int) -> tuple[int, ...]:
        """The content names of a held request's prompt blocks (memoised while it is held)."""
        chain = self._chains.get(rid)
        if chain is None:
            held = self.tokens_of(rid)
            chain = () if held is None else block_hashes(held[1], self.kv.block_size)
            if held is not None:
                self._chains[rid] = chain
        return chain

    def _describe(self, name: int, ids: list[int]) -> tuple[tuple[int, int], int | None,
                                                            list[int]]:
        """Block `name`'s place (for parents-first order), parent name and token ids: a
        prompt block of one of the step's requests (content name), else a request's own
        block (see sim/core/prefix.py), whose parent is the block before it."""
        size = self.kv.block_size
        for rid in ids:
            chain = self._chain(rid)
            if name in chain:
                i = chain.index(name)
                held = self.tokens_of(rid)
                tokens = [] if held is None else held[0][i * size:(i + 1) * size]
                return (0, i), (chain[i - 1] if i else None), tokens
        if name < 0:
            rid, i = (-name - 1) >> 24, (-name - 1) & OWN_INDEX_MASK
            chain = self._chain(rid)
            parent = None if i == 0 else (chain[i - 1] if i - 1 < len(chain) else name + 1)
            held = self.tokens_of(rid)
            tokens = [] if held is None else held[0][i * size:(i + 1) * size]
            return (1, i), parent, tokens
        return (2, 0), None, []

    def observe(self, request_ids: Iterable[int]) -> None:
        """After a step (its requests still held): publish what the cache gained and lost."""
        now = set(cached_names(self.kv))
        removed = sorted(self.published - now)
        added = now - self.published
        if not removed and not added:
            return
        ids = list(request_ids)
        events = [removed_event(removed)] if removed else []
        described = sorted(((self._describe(name, ids), name) for name in added),
                           key=lambda item: (item[0][0], item[1]))
        for (_, parent, tokens), name in described:
            events.append(stored_event(name, parent, tokens, self.kv.block_size))
        self.published = now
        self.send(events)
        for rid in [r for r in self._chains if self.tokens_of(r) is None]:
            del self._chains[rid]

    def clear(self) -> None:
        """The server stops: its cache is gone."""
        self.published = set()
        self.send([{"type": "AllBlocksCleared"}])


class ZmqPublisher:
    """A PUB socket: binds a wildcard or ipc/inproc address, connects to any other (vLLM's
    rule); frames (topic, sequence, payload)."""

    def __init__(self, config: KVEventsConfig, rank: int = 0) -> None:
        import zmq

        self._zmq = zmq
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        endpoint = config.endpoint
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self.endpoint = endpoint
        self._topic = config.topic.encode("utf-8")
        self._seq = 0
        self._rank = rank

    def send(self, events: list[dict[str, Any]]) -> None:
        payload = encode_batch(time.time(), events, self._rank)
        self._pub.send_multipart((self._topic, self._seq.to_bytes(8, "big"), payload),
                                 flags=self._zmq.NOBLOCK)
        self._seq += 1

    def close(self) -> None:
        self._pub.close(linger=500)
