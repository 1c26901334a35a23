"""A Link in the SimPy world: transfers in flight share its bandwidth as they come and go.

The price of one transfer is a pure function (sim.latency.kv_transfer); this is its
scheduling. A transfer waits out the link's latency alone, then joins the transfers
moving bytes, each of which gets bandwidth / n (processor sharing). Whenever one joins
or finishes, the bytes left are drained to now (`drain`) and one timer is set for the
next finish (`next_finish_s`); a stale timer (someone joined since) does nothing. The
finish times equal `shared_finish_s` for the same issues (tests/test_kv_transfer.py).
A free link (`bandwidth: null`) delivers after its latency.

`KVLinks` is one owner's links (a replica's host and disk links), each a SharedLink made
when a transfer first names it: it sends a scheduler's KVTransfers (tier loads) and tells
the owner when each landed, so concurrent loads on one link share its bandwidth.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

import simpy

from sim.config.link import Link
from sim.core.kv_transfer import KVTransfer
from sim.latency.kv_transfer import drain, next_finish_s


class SharedLink:
    """One link the world's transfers share; `send` returns the event of its arrival."""

    __slots__ = ("env", "link", "_moving", "_last_s", "_version", "_ids",
                 "bytes_sent", "busy_s", "_busy_since")

    def __init__(self, env: simpy.Environment, link: Link) -> None:
        self.env = env
        self.link = link
        self._moving: dict[int, list] = {}  # id -> [bytes left, arrival event]
        self._last_s = 0.0
        self._version = 0
        self._ids = itertools.count()
        self.bytes_sent = 0.0  # per-shard bytes delivered
        self.busy_s = 0.0  # time with bytes moving
        self._busy_since: float | None = None

    @property
    def num_in_flight(self) -> int:
        return len(self._moving)

    def send(self, shard_bytes: float) -> simpy.Event:
        """Issue a transfer of `shard_bytes` now; the event fires when it has arrived."""
        done = self.env.event()
        if not shard_bytes:
            done.succeed()
            return done
        self.env.process(self._transfer(float(shard_bytes), done))
        return done

    def _transfer(self, shard_bytes: float, done: simpy.Event):  # noqa: ANN202
        if self.link.latency_s:
            yield self.env.timeout(self.link.latency_s)
        if self.link.bandwidth_bytes_per_s is None:
            self.bytes_sent += shard_bytes
            done.succeed()
            return
        self._advance()
        if self._busy_since is None:
            self._busy_since = self.env.now
        self._moving[next(self._ids)] = [shard_bytes, done, shard_bytes]
        self._rearm()

    def _advance(self) -> None:
        """Drain every moving transfer to now."""
        now = self.env.now
        if self._moving and now > self._last_s:
            bw = self.link.bandwidth_bytes_per_s
            assert bw is not None
            entries = list(self._moving.values())
            for entry, left in zip(entries, drain([e[0] for e in entries], bw, now - self._last_s),
                                   strict=True):
                entry[0] = left
        self._last_s = now

    def _rearm(self) -> None:
        self._version += 1
        if not self._moving:
            if self._busy_since is not None:
                self.busy_s += self.env.now - self._busy_since
                self._busy_since = None
            return
        bw = self.link.bandwidth_bytes_per_s
        assert bw is not None
        wait_s = next_finish_s([e[0] for e in self._moving.values()], bw)
        timer = self.env.timeout(wait_s)
        version = self._version
        timer.callbacks.append(lambda _event: self._finish(version))

    def _finish(self, version: int) -> None:
        if version != self._version:
            return  # someone joined or left since this timer was set
        self._advance()
        first = min(self._moving, key=lambda k: self._moving[k][0])
        for key in [k for k, e in self._moving.items() if e[0] <= 0.0 or k == first]:
            _left, done, total = self._moving.pop(key)
            self.bytes_sent += total
            done.succeed()
        self._rearm()


class KVLinks:
    """An owner's named links, each shared by the KV moves over it (sim.core.kv_transfer).

    `landed(transfer, in_flight_s)` is called as each transfer arrives (the scheduler's
    kv_landed, and a wake for the owner)."""

    __slots__ = ("env", "links", "landed", "_shared")

    def __init__(self, env: simpy.Environment, links: Mapping[str, Link],
                 landed: Callable[[KVTransfer, float], None]) -> None:
        self.env = env
        self.links = links
        self.landed = landed
        self._shared: dict[str, SharedLink] = {}

    def link(self, name: str) -> SharedLink:
        """The shared link `name` (made on first use)."""
        shared = self._shared.get(name)
        if shared is None:
            link = self.links.get(name)
            if link is None:
                raise ValueError(f"a KV transfer crosses link {name!r}; this owner has "
                                 f"{sorted(self.links) or 'none'}")
            shared = self._shared[name] = SharedLink(self.env, link)
        return shared

    def send(self, transfers: Iterable[KVTransfer]) -> list[simpy.Event]:
        """Issue `transfers` now, each on its link; returns the landings of the sync ones
        (what a step waits for)."""
        held = []
        for transfer in transfers:
            landing = self.env.process(self._move(transfer))
            if transfer.sync:
                held.append(landing)
        return held

    def issue(self, moves: Sequence[KVTransfer]) -> tuple[KVTransfer, ...]:
        """Send the async `moves` a schedule() issued now; return the sync ones, which the
        plan's step sends as it starts and waits for (a replica's and a DP rank's rule)."""
        sync = tuple(t for t in moves if t.sync)
        if len(sync) < len(moves):
            self.send(t for t in moves if not t.sync)
        return sync

    def _move(self, transfer: KVTransfer):  # noqa: ANN202 - a SimPy process generator
        issued_s = self.env.now
        yield self.link(transfer.link).send(transfer.shard_bytes)
        self.landed(transfer, self.env.now - issued_s)
