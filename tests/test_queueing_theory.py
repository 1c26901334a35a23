"""The simulator against queueing theory: M/D/1 and M/G/1 (Pollaczek-Khinchine), a bulk-service
queue solved as an exact Markov chain, and Little's law on random workloads.

With `latency: {model: fixed}` every step takes tau; with one sequence at a time
and no chunking a request of output length O holds the server for O steps (its
prefill emits the first token), so a replica is an M/G/1 queue with service
S = O tau. Fixed seeds: each check passes or fails the same way every run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from sim.config.scenario import Scenario
from sim.experiments.run import run_scenario

STEP_MS = 10.0


# the engine's queue alone: no frontend before and after it (sim.config.frontend)
NO_FRONTEND = {"api_server_ms": 0, "tokenize_us_per_token": 0, "detokenize_us_per_token": 0,
               "stream_us_per_token": 0}


def _scenario(rate: float, output: dict, n: int, scheduler: dict, seed: int = 0) -> Scenario:
    return Scenario.model_validate({
        "name": "queueing", "seed": seed, "scheduler": scheduler, "frontend": NO_FRONTEND,
        "latency": {"model": "fixed", "step_ms": STEP_MS},
        "workload": {"arrivals": {"process": "poisson", "rate": rate}, "num_requests": n,
                     "prompt_tokens": {"dist": "fixed", "value": 16}, "output_tokens": output}})


ONE_AT_A_TIME = {"policy": "continuous", "max_num_seqs": 1, "chunked_prefill": False}


def pollaczek_khinchine_wait_s(rate: float, mean_s: float, second_moment_s2: float) -> float:
    """Mean wait in queue of M/G/1: lambda E[S^2] / (2 (1 - rho))."""
    rho = rate * mean_s
    return rate * second_moment_s2 / (2 * (1 - rho))


@pytest.mark.parametrize("rho", [0.5, 0.7, 0.85])
def test_md1_mean_wait_is_pollaczek_khinchine(rho: float) -> None:
    service_s = 4 * STEP_MS / 1e3  # fixed output of 4 tokens: M/D/1
    rate = rho / service_s
    summary = run_scenario(_scenario(rate, {"dist": "fixed", "value": 4}, 20_000, ONE_AT_A_TIME),
                           show_progress=False).summary
    ci = summary["ci95"]["mean_queue_ms"]
    theory_ms = pollaczek_khinchine_wait_s(rate, service_s, service_s**2) * 1e3
    assert ci["lo"] <= theory_ms <= ci["hi"], (rho, theory_ms, ci)
    assert ci["half_width"] < 0.15 * theory_ms  # a CI that could miss
    assert summary["sustained"] is True


def test_mg1_mean_wait_with_uniform_output_lengths() -> None:
    low, high = 1, 7  # S = O tau, O uniform on 1..7
    tau = STEP_MS / 1e3
    mean_o = (low + high) / 2
    second_o = ((high - low + 1) ** 2 - 1) / 12 + mean_o**2
    rate = 0.7 / (mean_o * tau)
    summary = run_scenario(_scenario(rate, {"dist": "uniform", "low": low, "high": high},
                                     20_000, ONE_AT_A_TIME), show_progress=False).summary
    ci = summary["ci95"]["mean_queue_ms"]
    theory_ms = pollaczek_khinchine_wait_s(rate, mean_o * tau, second_o * tau**2) * 1e3
    assert ci["lo"] <= theory_ms <= ci["hi"], (theory_ms, ci)
    # the M/D/1 wait at the same mean would be outside: the variance of S matters
    md1_ms = pollaczek_khinchine_wait_s(rate, mean_o * tau, (mean_o * tau) ** 2) * 1e3
    assert not ci["lo"] <= md1_ms <= ci["hi"]


def bulk_service_wait_s(rate: float, batch: int, service_s: float, states: int = 200) -> float:
    """Mean wait before service when a server takes exactly `batch` customers at a time (waiting
    for a full batch) and serves them together for a fixed `service_s`.

    The queue left at departures is a Markov chain: n -> max(n - B, 0) + A, A ~ Poisson(rate x
    service_s). Over one departure-to-departure cycle (renewal reward): from n >= B a batch
    starts at once, leaving n - B waiting through the service; from n < B the queue grows
    n..B-1 one exponential gap each, then a full batch starts. Arrivals during a service add
    rate x service_s^2 / 2 of waiting. L_q = E[waiting area] / E[cycle]; W_q = L_q / rate.
    """
    a = stats.poisson.pmf(np.arange(states), rate * service_s)
    p = np.zeros((states, states))
    for n in range(states):
        left = max(n - batch, 0)
        p[n, left:] = a[: states - left]
        p[n, -1] += 1.0 - p[n].sum()  # the tail lumped into the last state
    balance = p.T - np.eye(states)
    balance[-1] = 1.0  # pi P = pi, with sum(pi) = 1 in place of one redundant equation
    pi = np.linalg.solve(balance, np.eye(states)[-1])
    n = np.arange(states)
    full = n >= batch
    fill_area = np.array([sum(j / rate for j in range(k, batch)) for k in range(batch)])
    area = (pi[full] * (n[full] - batch) * service_s).sum() + (pi[:batch] * fill_area).sum() \
        + rate * service_s**2 / 2
    cycle = service_s + (pi[:batch] * (batch - n[:batch]) / rate).sum()
    assert batch / cycle == pytest.approx(rate, rel=1e-6)  # the chain's throughput is lambda
    return area / cycle / rate


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_static_batching_is_the_bulk_service_queue(rho: float) -> None:
    batch, output = 4, 4
    service_s = output * STEP_MS / 1e3
    rate = rho * batch / service_s
    static = {"policy": "static", "batch_size": batch, "max_output_tokens": output}
    summary = run_scenario(_scenario(rate, {"dist": "fixed", "value": output}, 20_000, static),
                           show_progress=False).summary
    ci = summary["ci95"]["mean_queue_ms"]
    theory_ms = bulk_service_wait_s(rate, batch, service_s) * 1e3
    assert ci["lo"] <= theory_ms <= ci["hi"], (rho, theory_ms, ci)
    assert ci["half_width"] < 0.1 * theory_ms


def test_bulk_chain_with_batch_one_is_md1() -> None:
    service_s = 0.04
    rate = 0.7 / service_s
    assert bulk_service_wait_s(rate, 1, service_s) == pytest.approx(
        pollaczek_khinchine_wait_s(rate, service_s, service_s**2), rel=1e-6)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(rate=st.floats(1.0, 60.0), max_num_seqs=st.sampled_from([1, 4, 16, 256]),
       n=st.integers(30, 200), seed=st.integers(0, 2**16), step_ms=st.floats(2.0, 40.0),
       mean_output=st.floats(5.0, 200.0), chunked=st.booleans())
def test_littles_law_on_random_workloads(rate: float, max_num_seqs: int, n: int, seed: int,
                                         step_ms: float, mean_output: float,
                                         chunked: bool) -> None:
    """Mean requests in the system, from the recorder's time series (each step's batch plus
    those waiting after it), = throughput x mean E2E latency, from the per-request columns.

    The series counts a request that arrives during a step from the step's start, so it
    may exceed lambda W by at most one step per arrival (n tau / span), never fall short.
    Continuous batching only: request-level batching holds requests waiting while no step
    runs, and the series is sampled at steps.
    """
    scenario = Scenario.model_validate({
        "name": "little", "seed": seed,
        "scheduler": {"max_num_seqs": max_num_seqs, "chunked_prefill": chunked},
        "frontend": NO_FRONTEND,
        "latency": {"model": "fixed", "step_ms": step_ms},
        "workload": {"arrivals": {"process": "poisson", "rate": rate}, "num_requests": n,
                     "prompt_tokens": {"dist": "lognormal", "mean": 500, "cv": 1.0, "min": 4,
                                       "max": 4000},
                     "output_tokens": {"dist": "lognormal", "mean": mean_output, "cv": 1.0,
                                       "min": 1, "max": 1000}}})
    result = run_scenario(scenario, show_progress=False)
    series = result.recorder.steps_frame()
    r = result.recorder.request_arrays()
    span_s = np.nanmax(r["finish_s"]) - r["arrival_s"].min()
    in_system = float(((series["mean_waiting"] + series["mean_batch_size"])
                       * series["busy_s"]).sum()) / span_s
    assert r["finished"].all()
    little = r["finished"].sum() / span_s * np.nanmean(r["e2el_s"])
    assert little * (1 - 1e-9) <= in_system <= little + n * step_ms / 1e3 / span_s
    assert math.isclose(in_system, little, rel_tol=0.1)


def test_fixed_latency_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    for sets, field in ((["latency.model=fixed"], "latency.step_ms"),
                        (["latency.step_ms=5"], "latency.step_ms"),
                        (["latency.model=fixed", "latency.step_ms=5",
                          "latency.compute_efficiency=0.5"], "latency.compute_efficiency"),
                        (["latency.model=fixed", "latency.step_ms=0"], "step_ms")):
        args = ["run", "--quiet", "--no-plots", "--out", "/nonexistent/never"]
        assert main([*args, *(x for s in sets for x in ("--set", s))]) == 2
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err, err


def test_fixed_latency_prices_every_step_alike() -> None:
    result = run_scenario(_scenario(5.0, {"dist": "fixed", "value": 3}, 20, ONE_AT_A_TIME),
                          show_progress=False)
    assert result.latency_name == "fixed"
    # one sequence at a time, 3 steps each: every E2E latency is a whole number of steps
    e2el_steps = result.recorder.request_arrays()["e2el_s"] / (STEP_MS / 1e3)
    assert np.all(e2el_steps >= 3 - 1e-9)
    service = result.recorder.request_arrays()
    busy = service["finish_s"] - service["first_scheduled_s"]
    np.testing.assert_allclose(busy, 3 * STEP_MS / 1e3)
