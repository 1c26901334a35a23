"""What the published pictures say: axis labels with units, one colour per series across
panels, legends that explain every colour, titles that count right."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from sim.plots.compare import field_label, sweep_figure, value_label
from sim.plots.run import timeseries_figure
from sim.plots.timeline import merge_runs, plot_request_timeline

GRID = ["workload.prompt_tokens.value", "workload.arrivals.rate"]


def sweep_table() -> pd.DataFrame:
    rows = []
    for rate in (0.02, 100.0):
        for prompt in (3840, 7936, 16128, 32512):
            scale = prompt / 1000 * (3 if rate > 1 else 1)
            rows.append({GRID[0]: prompt, GRID[1]: rate, "max_num_running": 32 / scale,
                         "median_ttft_ms": 10 * scale, "p99_ttft_ms": 20 * scale,
                         "median_tpot_ms": 7 + scale, "p99_tpot_ms": 9 + scale,
                         "output_throughput": 1000 / scale})
    return pd.DataFrame(rows)


def test_sweep_gives_each_series_one_colour_in_every_panel() -> None:
    fig = sweep_figure(sweep_table(), GRID)
    colour_of: dict[str, set[str]] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            series = line.get_label().rsplit(" req/s", 1)[0]  # "arrival rate 0.02"
            colour_of.setdefault(series, set()).add(to_hex(line.get_color()))
            assert (line.get_linestyle() == "--") == line.get_label().endswith("p99")
    assert set(colour_of) == {"arrival rate 0.02", "arrival rate 100"}
    assert all(len(colours) == 1 for colours in colour_of.values()), colour_of
    assert len(set.union(*colour_of.values())) == 2


def test_sweep_axes_name_the_field_and_its_unit() -> None:
    fig = sweep_figure(sweep_table(), GRID)
    for ax in fig.axes:
        assert ax.get_xlabel() == "prompt length (tokens)"
        assert "(" in ax.get_ylabel() and ax.get_ylabel() != ax.get_title()
        assert all("." not in t.get_text() for t in ax.get_xticklabels())
    assert "workload." not in fig.get_suptitle()
    assert fig.get_suptitle() == "Sweep over prompt length and arrival rate"


def test_field_labels_fall_back_to_the_unit_in_the_name() -> None:
    assert field_label("workload.arrivals.rate") == "arrival rate (req/s)"
    assert field_label("scheduler.max_wait_ms") == "max batch wait (ms)"
    assert field_label("slo.e2el_ms") == "e2el (ms)"
    assert field_label("kv.prefix_caching") == "prefix caching (kv.prefix_caching)"
    assert value_label("workload.arrivals.rate", 0.5) == "arrival rate 0.5 req/s"
    assert value_label("kv.prefix_caching", True) == "prefix caching True"


def series_frame(buckets: int = 10) -> pd.DataFrame:
    t = np.arange(buckets, dtype=np.float64)
    ones = np.ones(buckets)
    return pd.DataFrame({"t_start_s": t, "t_end_s": t + 1, "mean_batch_size": ones,
                         "max_batch_size": 2 * ones, "mean_waiting": ones,
                         "max_waiting": ones, "mean_kv_blocks_used": 100 * ones,
                         "max_kv_blocks_used": 200 * ones, "mean_kv_slots_held": 1600 * ones,
                         "mean_kv_live_tokens": 1500 * ones})


def test_timeseries_names_what_a_hundred_percent_is() -> None:
    fig = timeseries_figure(series_frame(), kv_blocks_total=28568, kv_pool_tokens=457088)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert "KV used (% of 28,568 KV blocks)" in labels
    assert "% of 457,088 KV token slots" in labels
    kv_axis = fig.axes[labels.index("KV used (% of 28,568 KV blocks)")]
    assert max(np.max(line.get_ydata()) for line in kv_axis.get_lines()) == pytest.approx(
        200 / 28568 * 100)


def timeline_frame(kinds: list[str], request_id: int = 0) -> pd.DataFrame:
    rows, t = [], 0.0
    for kind in kinds:
        rows.append({"request_id": request_id, "kind": kind, "start_s": t, "end_s": t + 0.01,
                     "new_tokens": 1, "context_tokens": 10, "emits": kind == "decode"})
        t += 0.01
    rows.append({"request_id": request_id, "kind": "finish", "start_s": t, "end_s": t,
                 "new_tokens": 0, "context_tokens": 10, "emits": False})
    return pd.DataFrame(rows)


def legend_texts(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_timeline_legend_explains_both_greens_and_counts_in_the_singular() -> None:
    frame = timeline_frame(["queue", "prefill", "decode", "stalled", "decode", "decode"])
    fig = plot_request_timeline(frame)
    assert fig.get_suptitle() == "Request timelines (1 traced request)"
    texts = legend_texts(fig)
    assert "decode: one token per step" in texts
    assert "stalled: in the batch, no token this step" in texts
    assert "stalled" not in texts and "decode" not in texts  # not bare kind names
    two = pd.concat([frame, timeline_frame(["prefill", "decode"], request_id=1)])
    assert plot_request_timeline(two).get_suptitle() == "Request timelines (2 traced requests)"


def test_back_to_back_steps_are_joined_for_the_whole_request_view() -> None:
    assert merge_runs([(2.0, 1.0), (0.0, 1.0), (1.0, 1.0), (3.5, 0.5)]) == [
        (0.0, 3.0), (3.5, 0.5)]
    assert merge_runs([]) == []
