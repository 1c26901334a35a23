"""Student's t quantile in plain Python, so a run's confidence intervals need no scipy.

A run computes a few t quantiles (one per interval, degrees of freedom =
batches or replications - 1); importing scipy.stats for them would cost a
simulation more start-up time than the simulation itself. The CDF comes from
the regularized incomplete beta function (evaluated by its continued fraction,
Lentz's method), and the quantile by bisection, to double precision (past
10,000 degrees of freedom, the Cornish-Fisher expansion around the normal);
tests/test_statistics_t.py checks it against scipy. A quantile costs some fifty CDF
evaluations (~1 ms), and a run's summary asks for the same one for every metric's
interval (~25 times, one df), so `t_ppf` remembers its answers: a pure function, the
same value either way.
"""

from __future__ import annotations

import functools
import math

_EPS = 1e-15
_LARGE_DF = 1e4  # beyond it the continued fraction converges slowly; the expansion is exact
_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=1024)
def t_ppf(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for 0 < p < 1 and df > 0 (bisection to the last bit)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    if df > _LARGE_DF:  # Cornish-Fisher around the normal quantile: error O(df^-3)
        from statistics import NormalDist  # only here: no run's start-up pays for it

        z = NormalDist().inv_cdf(p)
        return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
                + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
