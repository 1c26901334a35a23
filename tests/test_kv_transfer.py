"""KV transfers: the price on an idle link, fair sharing among transfers in flight, the SimPy
link against the pure reference, and the conservation ledger."""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.catalogue import get_link, get_model
from sim.config.costs import kv_bytes_per_token
from sim.config.link import Link
from sim.core.kv_transfer import KVTransfer, TransferLedger
from sim.latency.kv_transfer import (
    kv_shard_bytes,
    kv_transfer_s,
    layerwise_remaining_bytes,
    shared_finish_s,
)
from sim.world.link_sim import KVLinks, SharedLink

LINK = Link("rdma", 4.0e10, 1.0e-5, line_rate_gbit_per_s=400)


def test_idle_link_costs_latency_plus_bytes_over_bandwidth() -> None:
    nbytes = 3.0e8
    assert kv_transfer_s(LINK, nbytes) == pytest.approx(1.0e-5 + nbytes / 4.0e10, rel=1e-12)
    assert shared_finish_s(LINK, [2.0], [nbytes]) == [pytest.approx(2.0 + 1.0e-5 + 7.5e-3)]
    assert kv_transfer_s(LINK, 0.0) == 0.0


def test_free_link_costs_its_latency_only() -> None:
    free = Link("rdma", None, 2.0e-5, line_rate_gbit_per_s=400)
    assert kv_transfer_s(free, 1.0e12) == pytest.approx(2.0e-5)
    assert shared_finish_s(free, [0.0, 0.0], [1e9, 1e9]) == [pytest.approx(2.0e-5)] * 2


def test_shard_bytes_follow_the_models_kv_over_tp() -> None:
    model = get_model("llama-3-8b")
    assert kv_shard_bytes(model, 1000, 2) == 1000 * kv_bytes_per_token(model, 2)
    assert kv_shard_bytes(model, 1000, 2) == pytest.approx(kv_shard_bytes(model, 1000, 1) / 2)


def test_sharing_the_link_slows_every_transfer() -> None:
    nbytes = 4.0e8  # 10 ms alone
    alone = shared_finish_s(LINK, [0.0], [nbytes])[0]
    two = shared_finish_s(LINK, [0.0, 0.0], [nbytes, nbytes])
    assert two[0] == pytest.approx(1.0e-5 + 2 * nbytes / 4.0e10)
    assert min(two) > alone
    # a later, small transfer shares only while it is there: the big one is delayed by it
    late = shared_finish_s(LINK, [0.0, 0.004], [nbytes, 4.0e7])
    assert late[1] == pytest.approx(0.004 + 1.0e-5 + 2 * 4.0e7 / 4.0e10)
    assert late[0] == pytest.approx(alone + 4.0e7 / 4.0e10)


def test_layerwise_overlap_leaves_at_least_the_last_layer() -> None:
    assert layerwise_remaining_bytes(3.2e8, 32, 0.0, LINK) == 3.2e8
    assert layerwise_remaining_bytes(3.2e8, 32, 1.0, LINK) == pytest.approx(1.0e7)
    assert layerwise_remaining_bytes(3.2e8, 32, 0.004, LINK) == pytest.approx(3.2e8 - 1.6e8)


def _world_finish(link: Link, starts: list[float], sizes: list[float]) -> list[float]:
    env = simpy.Environment()
    shared = SharedLink(env, link)
    done = [math.nan] * len(starts)

    def issue(i: int):  # noqa: ANN202
        yield env.timeout(starts[i])
        yield shared.send(sizes[i])
        done[i] = env.now

    for i in range(len(starts)):
        env.process(issue(i))
    env.run()
    return done


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.05), st.floats(1.0, 5.0e8)), min_size=1,
                max_size=8), st.sampled_from(["rdma-400", "pcie5", "nvlink4"]))
def test_world_link_equals_the_reference(issues: list[tuple[float, float]], name: str) -> None:
    link = get_link(name)
    starts, sizes = [s for s, _ in issues], [b for _, b in issues]
    want = shared_finish_s(link, starts, sizes)
    got = _world_finish(link, starts, sizes)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    # the link never moves faster than its bandwidth: the last finish bounds the total
    assert max(got) - min(starts) >= sum(sizes) / link.bandwidth_bytes_per_s * (1 - 1e-9)


def test_ledger_counts_a_moving_block_once() -> None:
    ledger = TransferLedger()
    ledger.place(7, "prefill-0", 5)
    assert ledger.blocks_at("prefill-0") == 5
    ledger.start(KVTransfer(7, 5, 1e6, "prefill-0", "decode-1"))
    assert ledger.blocks_at("prefill-0") == 0 and ledger.blocks_in_flight() == 5
    assert ledger.where(7) == "in flight"
    ledger.land(7)
    assert ledger.blocks_at("decode-1") == 5 and ledger.blocks_in_flight() == 0
    with pytest.raises(AssertionError):
        ledger.start(KVTransfer(7, 4, 1e6, "decode-1", "host"))  # not the blocks it holds
    with pytest.raises(ValueError):
        KVTransfer(1, 1, 1.0, "host", "host")


def test_an_owners_links_share_each_named_link_and_keep_others_apart() -> None:
    """KVLinks (a replica's links): two loads on "host" share it, one on "disk" does not
    slow them; each landing is reported with its time in flight; an unknown name fails."""
    env = simpy.Environment()
    host, disk = get_link("pcie5"), Link("pcie", 7e9, 1e-4, generation=4)
    landed: dict[tuple[int, str], float] = {}
    links = KVLinks(env, {"host": host, "disk": disk},
                    lambda t, s: landed.__setitem__((t.request_id, t.link), s))
    size = 4.0e8
    moves = [KVTransfer(i, 8, size, link, "gpu", link, sync=i == 0)
             for i, link in ((0, "host"), (1, "host"), (2, "disk"))]
    sync = links.issue(moves)  # the async ones go now, alone
    assert sync == (moves[0],)  # the sync one is the step's (send_step)
    step = links.send_step(sync)
    assert step.alone_s == kv_transfer_s(host, size)  # what the step's price holds
    late: list[float] = []

    def stepping():  # noqa: ANN202 - the step's priced end, then its lateness
        yield env.timeout(step.alone_s)
        late.append((yield from step.late_s(env)))

    env.process(stepping())
    env.run()
    shared = shared_finish_s(host, [0.0, 0.0], [size, size])
    assert landed[(0, "host")] == pytest.approx(shared[0])
    assert landed[(1, "host")] == pytest.approx(shared[1])
    assert shared[0] > kv_transfer_s(host, size)  # later than alone
    assert late == [pytest.approx(shared[0] - step.alone_s)] and late[0] > 0
    assert landed[(2, "disk")] == pytest.approx(kv_transfer_s(disk, size))
    with pytest.raises(ValueError, match="'nvme'"):
        links.link("nvme")


def test_a_steps_moves_alone_on_their_links_are_never_late() -> None:
    """A step's sync moves with the links to themselves: one transfer per link (the host
    link's two moves go together), priced as the slowest link, and 0.0 late to the bit."""
    env = simpy.Environment()
    host, disk = get_link("pcie5"), Link("pcie", 7e9, 1e-4, generation=4)
    landed: list[tuple[int, float]] = []
    links = KVLinks(env, {"host": host, "disk": disk},
                    lambda t, s: landed.append((t.request_id, s)))
    moves = (KVTransfer(0, 8, 3.0e8, "gpu", "swap", "host", sync=True),
             KVTransfer(1, 8, 1.0e8, "swap", "gpu", "host", sync=True),
             KVTransfer(2, 8, 1.0e8, "disk", "gpu", "disk", sync=True))
    step = links.send_step(moves)
    assert step.alone_s == max(kv_transfer_s(host, 4.0e8), kv_transfer_s(disk, 1.0e8))
    late: list[float] = []

    def stepping():  # noqa: ANN202
        yield env.timeout(step.alone_s)
        late.append((yield from step.late_s(env)))

    env.process(stepping())
    env.run()
    assert late == [0.0]
    assert sorted(r for r, _ in landed) == [0, 1, 2]
    by_id = dict(landed)
    assert by_id[0] == by_id[1] == pytest.approx(kv_transfer_s(host, 4.0e8))
    assert by_id[2] == pytest.approx(kv_transfer_s(disk, 1.0e8))
