"""The plain-Python Student t quantile against scipy's, over the range the intervals use."""

import pytest

from sim.results.stats.student_t import incomplete_beta, t_cdf, t_ppf

stats = pytest.importorskip("scipy.stats")
special = pytest.importorskip("scipy.special")


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 10, 19, 30, 63, 199, 1000, 10**6])
@pytest.mark.parametrize("p", [0.6, 0.9, 0.95, 0.975, 0.995, 0.9995])
def test_t_quantile_is_scipys(df: int, p: float) -> None:
    assert t_ppf(p, df) == pytest.approx(float(stats.t.ppf(p, df)), rel=1e-10, abs=1e-12)
    assert t_ppf(1 - p, df) == pytest.approx(float(stats.t.ppf(1 - p, df)), rel=1e-10)


@pytest.mark.parametrize("a,b,x", [(0.5, 0.5, 0.3), (2.5, 0.5, 0.9), (10.0, 0.5, 0.99),
                                   (500.0, 0.5, 0.999), (1.0, 3.0, 0.2)])
def test_incomplete_beta_is_scipys(a: float, b: float, x: float) -> None:
    assert incomplete_beta(a, b, x) == pytest.approx(float(special.betainc(a, b, x)), rel=1e-12)


def test_cdf_is_symmetric_and_bad_input_is_refused() -> None:
    assert t_cdf(0.0, 5) == pytest.approx(0.5)
    assert t_cdf(-2.0, 5) == pytest.approx(1 - t_cdf(2.0, 5))
    with pytest.raises(ValueError, match="0 < p < 1"):
        t_ppf(1.0, 5)


def test_a_remembered_quantile_is_the_one_computed_afresh() -> None:
    for df in (3, 19, 19, 199):
        assert t_ppf(0.975, df) == t_ppf.__wrapped__(0.975, df)
    assert t_ppf(0.025, 19) == -t_ppf.__wrapped__(0.975, 19)
