"""The prefix cache's host offload tier: evicted blocks spill (LRU), a hit loads them back
and is priced as a host copy, a tier of 0 is no tier bit for bit, and mistakes exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config.scenario import Scenario
from sim.core.offload_tier import OffloadTier
from sim.core.paged import PagedBlockManager
from sim.core.request import Request
from sim.experiments.run import run_scenario

CHAT: dict[str, Any] = {
    "arrivals": {"process": "poisson", "rate": 4.0},
    "prompt_tokens": {"dist": "lognormal", "mean": 1500, "cv": 0.5, "min": 64, "max": 3000},
    "output_tokens": {"dist": "lognormal", "mean": 150, "cv": 0.5, "min": 4, "max": 400},
    "conversations": {"turns": 6, "user_tokens": {"dist": "fixed", "value": 200},
                      "think_time_s": 20.0},
    "num_requests": 300}


def _chat(offload_gib: float | None) -> dict[str, Any]:
    kv: dict[str, Any] = {"prefix_caching": True, "num_blocks": 3000}
    if offload_gib is not None:
        kv["offload_host_gib"] = offload_gib
    scenario = Scenario.model_validate({"seed": 2, "kv": kv, "workload": CHAT})
    return run_scenario(scenario, show_progress=False).summary


def _plain(summary: dict[str, Any]) -> str:
    drop = ("simulation_wall_s",)
    return json.dumps({k: v for k, v in summary.items() if k not in drop}, sort_keys=True)


def test_a_tier_of_zero_is_no_tier_bit_for_bit() -> None:
    none, zero = _chat(None), _chat(0.0)
    assert "kv_offload" not in zero
    assert _plain(zero) == _plain(none)


def test_a_host_tier_turns_evictions_into_hits_and_prices_the_loads() -> None:
    none, big = _chat(None), _chat(64.0)
    offload = big["kv_offload"]
    host = offload["tiers"]["host"]
    assert host["loaded_blocks"] > 0 and host["written_blocks"] > 0
    assert list(offload["tiers"]) == ["host"]  # no disk tier unless asked
    assert big["prefix_hit_rate"] > none["prefix_hit_rate"]
    assert big["mean_ttft_ms"] < none["mean_ttft_ms"]
    # every loaded block's bytes (all shards) cross the host link, and the loads cost time
    block_bytes = 64 * 2**30 // host["capacity_blocks"]  # the tier is 64 GiB of blocks
    assert host["bytes_from_host"] == pytest.approx(host["loaded_blocks"] * block_bytes)
    assert host["bytes_to_host"] == pytest.approx(host["written_blocks"] * block_bytes)
    assert offload["load_s"] > 0 and offload["validated"] is False
    assert offload["load"] == "sync"
    # the hit log's buckets add up to the loaded blocks
    assert sum(offload["hits_over_time"]["host"]) == host["loaded_blocks"]


def test_lru_drops_the_oldest_and_a_hit_refreshes() -> None:
    tier = OffloadTier(3)
    tier.spill([1, 2, 3])
    tier.load([1])  # 1 is now the most recent
    tier.spill([4])
    assert 2 not in tier and 1 in tier and len(tier) == 3
    assert tier.run_length([1, 3, 4, 9]) == 3
    assert tier.num_dropped_blocks == 1


def _request(rid: int, ids: tuple[int, ...]) -> Request:
    return Request(rid, 0.0, len(ids) * 16, 4, prefix_block_ids=ids, prefix_unit_tokens=16)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=8), min_size=1, max_size=25),
       st.integers(1, 30))
def test_evicted_blocks_come_back_from_the_tier(prompts: list[list[int]], tier_blocks: int
                                                ) -> None:
    """Blocks stay conserved with a tier; what the tier loads is what the GPU evicted."""
    kv = PagedBlockManager(12, 16, enable_prefix_cache=True, offload_blocks=tier_blocks)
    plain = PagedBlockManager(12, 16, enable_prefix_cache=True)
    for rid, ids in enumerate(prompts):
        req = _request(rid, tuple(ids))
        want = kv.cached_prefix_tokens(req)
        assert want >= plain.cached_prefix_tokens(req)  # the tier only adds
        got = kv.allocate(rid, req.prompt_tokens, request=req)
        plain_got = plain.allocate(rid, req.prompt_tokens, request=req)
        if got >= 0:
            assert got == min(want, (req.prompt_tokens - 1) // 16 * 16)
            kv.cache_computed(rid, req.prompt_tokens)
            kv.free(rid)
        if plain_got >= 0:
            plain.cache_computed(rid, req.prompt_tokens)
            plain.free(rid)
        kv.check_invariants()
    assert kv.offload is not None and len(kv.offload) <= tier_blocks


def test_a_tier_smaller_than_a_block_is_refused(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kv: {prefix_caching: true, offload_host_gib: 1.0e-9}\n")
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--quiet"])
    text = capsys.readouterr()
    assert code == 2
    assert "kv.offload_host_gib" in text.err + text.out
    assert "Traceback" not in text.err + text.out


def _offload(disk: bool) -> dict[str, Any]:
    hits = {"bucket_s": 2.0, "start_s": [0.0, 2.0, 4.0], "gpu": [10, 4, 0],
            "host": [0, 6, 8]}
    if disk:
        hits["disk"] = [0, 0, 12]
    return {"load": "sync", "hits_over_time": hits}


@pytest.mark.parametrize("disk", [False, True])
def test_the_tier_plot_names_each_tier_and_its_units(disk: bool) -> None:
    from sim.plots.kv_tiers import kv_tiers_figure

    fig = kv_tiers_figure(_offload(disk))
    (ax,) = fig.axes
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["GPU prefix cache", "host tier"] + (["disk tier"] if disk else [])
    assert legend.get_title().get_text() == "served from"
    assert ax.get_xlabel() == "time (s)"
    assert ax.get_ylabel() == "blocks hit per second"
    assert "sync loads" in ax.get_title()
    # the stack's top is every tier's blocks over the bucket's width
    top = ax.collections[-1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(max(sum(c) for c in zip(*[
        _offload(disk)["hits_over_time"][n] for n in ("gpu", "host", "disk")
        if n in _offload(disk)["hits_over_time"]], strict=True)) / 2.0)


@pytest.mark.parametrize("offload_gib", [0, 64])
def test_kv_tiers_png_only_with_a_tier(tmp_path: Path, offload_gib: int) -> None:
    path = tmp_path / "chat.yaml"
    path.write_text(json.dumps({"seed": 2, "kv": {"prefix_caching": True, "num_blocks": 3000,
                                                  "offload_host_gib": offload_gib},
                                "workload": {**CHAT, "num_requests": 60}}))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    assert (out / "timeseries.png").exists()
    assert (out / "kv_tiers.png").exists() == bool(offload_gib)
