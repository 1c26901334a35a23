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


# -- one test per published plot: its legend texts and axis labels read back from the artists


def axis_legend(ax) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None, f"no legend on {ax.get_title()!r}"
    return [t.get_text() for t in legend.get_texts()]


def test_timeseries_every_panel_has_a_legend_and_held_shows_above_live() -> None:
    fig = timeseries_figure(series_frame(), kv_blocks_total=28568, kv_pool_tokens=457088)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:3] == ["Running batch per step", "Waiting queue length", "KV cache occupancy"]
    for ax in fig.axes[:3]:
        assert axis_legend(ax) == ["bucket max", "time-weighted mean"]
        assert "(" in ax.get_ylabel()  # a unit or what 100% is
    held_live = fig.axes[3]
    assert set(axis_legend(held_live)) == {"held, not live (waste)", "held", "live tokens"}
    lines = {line.get_label(): line for line in held_live.get_lines()}
    held, live = lines["held"], lines["live tokens"]
    # drawn over live, in another style: a held line equal to live stays visible
    assert held.get_zorder() > live.get_zorder()
    assert held.get_linestyle() != live.get_linestyle()
    assert held.get_linewidth() < live.get_linewidth()
    assert fig.axes[-1].get_xlabel() == "simulated time (s)"


def compare_table() -> pd.DataFrame:
    rows = []
    for name, cap in (("static", 3.0), ("continuous", 20.0)):
        for rate in (1.0, 8.0, 32.0):
            got = min(rate, cap)
            rows.append({"variant": name, "offered_rate": rate, "request_throughput": got,
                         "window_throughput": got, "window_throughput_lo": got - 5.0,
                         "window_throughput_hi": got + 1.0, "sustained": rate <= cap,
                         "output_throughput": 200 * got})
    return pd.DataFrame(rows)


def test_compare_throughput_error_bars_stay_at_or_above_zero() -> None:
    from sim.plots.compare import throughput_figure

    fig = throughput_figure(compare_table())
    ax_req, ax_tok = fig.axes
    assert ax_req.get_xlabel() == "offered rate (req/s)"
    assert ax_req.get_ylabel() == "achieved (req/s)"
    assert ax_tok.get_ylabel() == "output throughput (tok/s)"
    assert set(axis_legend(ax_req)) == {"static", "continuous", "achieved = offered"}
    assert set(axis_legend(ax_tok)) == {"static", "continuous"}
    lows = [seg[:, 1].min() for coll in ax_req.collections
            if hasattr(coll, "get_segments") for seg in coll.get_segments()]
    assert lows and min(lows) >= 0.0  # lo = got - 5 in the table: cut at 0, not drawn below


def test_sweep_ticks_are_the_swept_values_and_the_ci_band_is_labelled() -> None:
    table = sweep_table()
    for column in ("p99_ttft_ms", "p99_tpot_ms"):
        table[f"window_{column}_lo"] = table[column] * 0.9
        table[f"window_{column}_hi"] = table[column] * 1.1
    table.loc[table[GRID[1]] > 1, "window_p99_ttft_ms_lo"] = np.nan  # no CI for the burst
    fig = sweep_figure(table, GRID)
    ttft = fig.axes[1]
    assert [t.get_text() for t in ttft.get_xticklabels()] == ["3,840", "7,936", "16,128",
                                                               "32,512"]
    texts = axis_legend(ttft)
    assert "95% CI (window)" in texts and "no CI (window too short)" in texts
    assert ttft.get_xlabel() == "prompt length (tokens)" and ttft.get_ylabel() == "TTFT (ms)"


def test_slots_static_panel_runs_until_its_last_request() -> None:
    from sim.config.loader import load_scenario
    from sim.experiments.slots import record_slots
    from sim.plots.slots import plot_slot_timelines

    scenario, base_dir = load_scenario(None, [])
    recorders = {p: record_slots(scenario, p, base_dir=base_dir) for p in
                 ("static", "continuous")}
    for rec in recorders.values():
        assert rec.num_finished == 40 and rec.steps_seen == len(rec.steps)
    assert len(recorders["static"].steps) > 200  # what the old cut dropped
    fig = plot_slot_timelines(recorders)
    static_ax = fig.axes[0]
    assert static_ax.get_title().startswith(f"static: {len(recorders['static'].steps)} steps")
    assert static_ax.get_ylabel() == "batch slot"
    assert fig.axes[-1].get_xlabel() == "engine step"
    assert "padded slot" in legend_texts(fig)


def replica_frames(n: int) -> list[pd.DataFrame]:
    frame = series_frame(40)
    frame["mean_running"] = frame["mean_batch_size"]
    return [frame.copy() for _ in range(n)]  # identical: lines that coincide exactly


def test_load_balance_replica_lines_differ_in_more_than_colour() -> None:
    from sim.plots.run import load_balance_figure

    fig = load_balance_figure(replica_frames(4))
    for ax in fig.axes:
        assert axis_legend(ax) == [f"replica {i}" for i in range(4)]
        styles = {(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
        assert len(styles) == 4  # told apart without colour
    assert [ax.get_ylabel() for ax in fig.axes] == ["requests", "batch size (seqs)"]
    assert fig.axes[-1].get_xlabel() == "simulated time (s)"


def test_plan_draws_the_slo_bounds() -> None:
    from sim.plots.plan import plan_figure

    table = pd.DataFrame([{"gpu": "h200", "tp": 8, "replicas": 3, "cost": 24,
                           "p99_ttft_ms": 500.0, "p99_ttft_ms_lo": 450.0,
                           "p99_ttft_ms_hi": 550.0, "p99_tpot_ms": 70.0,
                           "p99_tpot_ms_lo": 65.0, "p99_tpot_ms_hi": 75.0}])
    fig = plan_figure(table, "GPUs", "p99", ttft_slo_ms=2000.0, tpot_slo_ms=100.0)
    _, ax_ttft, ax_tpot = fig.axes
    assert axis_legend(ax_ttft) == ["SLO: p99 TTFT <= 2000 ms", "p99 TTFT, 95% CI"]
    assert axis_legend(ax_tpot) == ["SLO: p99 TPOT <= 100 ms", "p99 TPOT, 95% CI"]
    slo = [line for line in ax_ttft.get_lines() if line.get_label().startswith("SLO")]
    assert list(slo[0].get_xdata()) == [2000.0, 2000.0]
    assert ax_ttft.get_xlabel() == "p99 TTFT (ms)" and ax_tpot.get_xlabel() == "p99 TPOT (ms)"
    assert fig.axes[0].get_xlabel() == "GPUs"
