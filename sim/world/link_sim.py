"""A Link in the SimPy world: transfers in flight share its bandwidth as they come and go.

The price of one transfer is a pure function (sim.latency.kv_transfer); this is its
scheduling. A transfer waits out the link's latency alone, then joins the transfers
moving bytes, each of which gets bandwidth / n (processor sharing). Whenever one joins
or finishes, the bytes left are drained to now (`drain`) and one timer is set for the
next finish (`next_finish_s`); a stale timer (someone joined since) does nothing. The
finish times equal `shared_finish_s` for the same issues (tests/test_kv_transfer.py).
A free link (`bandwidth: null`) delivers after its latency.

`KVLinks` is one owner's links (a replica's host and disk links), each a SharedLink made
when a transfer first names it: it sends a scheduler's KVTransfers (swaps, tier loads) and
tells the owner when each landed, so concurrent moves on one link share its bandwidth.
An async move is sent alone when issued; a step's sync moves go as one transfer per link
when the step starts (`send_step`), and the step, priced with their idle-link time
(`StepMoves.alone_s`, which the latency model adds), ends later only by what sharing a
link with other moves cost them (`StepMoves.late_s`): exactly 0 when they had the links
to themselves, so a replica alone with its swaps runs as if no link were simulated.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import simpy

from sim.config.link import Link
from sim.core.kv_transfer import KVTransfer
from sim.latency.kv_transfer import drain, link_bytes, next_finish_s, step_moves_s


class Arrival(simpy.Event):
    """A transfer's arrival; `shared` once it has shared its link's bandwidth with another."""

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__(env)
        self.shared = False


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

    def send(self, shard_bytes: float) -> Arrival:
        """Issue a transfer of `shard_bytes` now; the event fires when it has arrived, with
        whether it shared the bandwidth with another transfer on the way (`shared`)."""
        done = Arrival(self.env)
        if not shard_bytes:
            done.succeed(False)
            return done
        self.env.process(self._transfer(float(shard_bytes), done))
        return done

    def _transfer(self, shard_bytes: float, done: Arrival):  # noqa: ANN202
        if self.link.latency_s:
            yield self.env.timeout(self.link.latency_s)
        if self.link.bandwidth_bytes_per_s is None:
            self.bytes_sent += shard_bytes
            done.succeed(False)
            return
        self._advance()
        if self._busy_since is None:
            self._busy_since = self.env.now
        if self._moving:  # each now shares the bandwidth with another
            done.shared = True
            for entry in self._moving.values():
                entry[1].shared = True
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
            done.succeed(done.shared)
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

    def send(self, transfers: Iterable[KVTransfer]) -> None:
        """Issue `transfers` now, each on its link, alone (async moves: their requests wait)."""
        for transfer in transfers:
            self._move((transfer,), transfer.shard_bytes, transfer.link)

    def issue(self, moves: Sequence[KVTransfer]) -> tuple[KVTransfer, ...]:
        """Send the async `moves` a schedule() issued now; return the sync ones, which the
        plan's step sends as it starts (send_step) (a replica's and a DP rank's rule)."""
        sync = tuple(t for t in moves if t.sync)
        if len(sync) < len(moves):
            self.send(t for t in moves if not t.sync)
        return sync

    def send_step(self, moves: Sequence[KVTransfer]) -> StepMoves:
        """Send a step's sync `moves` now, each link's as one transfer of their bytes (the
        step's copies go together), priced alone by sim.latency.kv_transfer.step_moves_s."""
        arrivals = [self._move(tuple(t for t in moves if t.link == name), shard_bytes, name)
                    for name, shard_bytes in link_bytes(moves).items()]
        step = StepMoves(self.env.now, step_moves_s(self.links, moves), arrivals)
        for arrival in arrivals:
            arrival.callbacks.append(lambda _event: step.landed_s.append(self.env.now))
        return step

    def _move(self, transfers: tuple[KVTransfer, ...], shard_bytes: float, name: str
              ) -> Arrival:
        """One transfer of `shard_bytes` on link `name`, issued now; each of `transfers` is
        reported landed with it. Returns the link's arrival event."""
        issued_s = self.env.now
        arrival = self.link(name).send(shard_bytes)

        def report(_event: simpy.Event) -> None:
            for transfer in transfers:
                self.landed(transfer, self.env.now - issued_s)

        arrival.callbacks.append(report)
        return arrival


@dataclass(slots=True)
class StepMoves:
    """A step's sync KV moves in flight: sent at `start_s`, `alone_s` on idle links (what
    the step's price holds); one arrival per link, each `shared` once it has shared the
    link's bandwidth with another transfer; `landed_s`: when each arrived."""

    start_s: float
    alone_s: float
    arrivals: list[Arrival]
    landed_s: list[float] = field(default_factory=list)

    def late_s(self, env: simpy.Environment) -> Generator[simpy.Event, object, float]:
        """At the step's priced end: how much later than `alone_s` after the start the last
        move landed, waiting for those still moving, when any shared a link with other
        transfers; 0.0 when none did (the step's price already holds them, to the bit)."""
        if not any(arrival.shared for arrival in self.arrivals):
            return 0.0
        yield env.all_of(self.arrivals)
        late_s = max(self.landed_s) - self.start_s - self.alone_s
        return late_s if late_s > 0.0 else 0.0
