"""exact.py against scipy.stats, the reference it replaces (scipy.stats is imported here, in the tests
only): the same p, rho and trimmed mean on random, tied and constant data, every alternative, 1-D and
vectorised over claims."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commdiag.analyse import exact


@pytest.fixture(scope="module")
def sp():
    """scipy.stats, imported when a test here runs, not when the suite is collected (2.8 s of CPU)."""
    from scipy import stats

    return stats


def draws(rng, n, kind):
    if kind == "continuous":
        return rng.normal(size=n)
    if kind == "ties":
        return rng.integers(0, 4, size=n).astype(float)  # many ties, as rounded launch values have
    return np.full(n, 1.5)  # constant


@pytest.mark.parametrize("alternative", ["less", "greater", "two-sided"])
@pytest.mark.parametrize("kind", ["continuous", "ties", "constant"])
def test_mann_whitney_p_is_scipys_exact_p(alternative, kind, sp):
    rng = np.random.default_rng(7)
    for n1 in range(1, 13):
        for n2 in (1, 2, 3, 5, 8, 13):
            x, y = draws(rng, n1, kind), draws(rng, n2, kind) + (0.3 if kind == "continuous" else 0)
            want = sp.mannwhitneyu(x, y, alternative=alternative, method="exact").pvalue
            assert exact.mann_whitney_p(x, y, alternative) == pytest.approx(want, rel=1e-12, abs=1e-300)


def test_mann_whitney_p_vectorised_over_claims_and_at_sizes_beyond_int64_counts(sp):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(40, 9)), rng.normal(0.4, 1, size=(40, 7))
    got = exact.mann_whitney_p(x, y, "two-sided")
    want = sp.mannwhitneyu(x, y, alternative="two-sided", method="exact", axis=-1).pvalue
    assert got.shape == (40,) and np.allclose(got, want, rtol=1e-12, atol=0)
    # a 1-D y against every row of x (broadcast), as compare does
    assert np.allclose(exact.mann_whitney_p(x, y[0], "less"),
                       sp.mannwhitneyu(x, y[0], alternative="less", method="exact", axis=-1).pvalue,
                       rtol=1e-12, atol=0)
    # C(80, 40) > 2**63: the counts stay exact integers; the smallest p is the one arrangement's share
    a, b = np.arange(40.0), np.arange(40.0) + 100
    assert exact.mann_whitney_p(a, b, "less") == 1 / math.comb(80, 40)
    big_x, big_y = rng.normal(size=40), rng.normal(0.5, 1, size=40)
    assert exact.mann_whitney_p(big_x, big_y, "two-sided") == pytest.approx(
        sp.mannwhitneyu(big_x, big_y, method="exact").pvalue, rel=1e-9)


def test_mann_whitney_p_propagates_nan_and_refuses_an_unknown_alternative():
    assert math.isnan(exact.mann_whitney_p([1.0, math.nan], [2.0, 3.0], "less"))
    with pytest.raises(ValueError):
        exact.mann_whitney_p([1.0], [2.0], "sideways")


def test_u_tail_is_a_distribution():
    for n1, n2 in ((1, 1), (3, 4), (6, 6), (2, 11)):
        tail = exact.u_tail(n1, n2)
        assert tail[0] == 1.0 and tail[-1] == 0.0 and len(tail) == n1 * n2 + 2
        assert np.all(np.diff(tail) <= 0)
        pmf = -np.diff(tail)
        assert np.allclose(pmf, pmf[::-1])  # U is symmetric about n1*n2/2


@pytest.mark.parametrize("kind", ["continuous", "ties"])
def test_spearman_is_scipys_rho_and_p(kind, sp):
    rng = np.random.default_rng(11)
    for n in (3, 5, 6, 9, 20, 41):
        x = np.arange(n, dtype=float)
        y = draws(rng, n, kind) + (0.05 * x if kind == "continuous" else 0)
        want = sp.spearmanr(x, y)
        rho, p = exact.spearman(x, y)
        assert rho == pytest.approx(want.statistic, rel=1e-12, abs=1e-15)
        assert p == pytest.approx(want.pvalue, rel=1e-9, abs=1e-300)
    assert exact.spearman(range(6), range(6)) == (1.0, 0.0)
    rho, p = exact.spearman(range(6), [2.0] * 6)
    assert math.isnan(rho) and math.isnan(p)


def test_trim_mean_is_scipys(sp):
    rng = np.random.default_rng(5)
    for n in (1, 2, 5, 19, 20, 21, 100, 1001):
        a = rng.lognormal(size=n)
        for cut in (0.0, 0.05, 0.1, 0.25):
            assert exact.trim_mean(a, cut) == sp.trim_mean(a, cut)


def test_normal_functions_match_scipy(sp):
    for z in (-8.0, -2.5, -0.3, 0.0, 1.0, 3.7):
        assert exact.normal_cdf(z) == pytest.approx(sp.norm.cdf(z), rel=1e-13)
    for q in (1e-12, 1e-6, 0.005, 0.2, 0.5, 0.8, 0.995):
        assert exact.normal_ppf(q) == pytest.approx(sp.norm.ppf(q), rel=1e-12, abs=1e-15)
        assert exact.normal_isf(q) == pytest.approx(sp.norm.isf(q), rel=1e-12, abs=1e-15)


def test_no_verdict_path_imports_scipy_stats():
    """The point of exact.py: report, compare and the verdicts run without scipy.stats' import."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from commdiag.analyse import certify, compare, paired, report, stats, verdict\n"
            "from commdiag.ab import verdict as abv\n"
            "stats.rank_test([1., 2., 3.], [4., 5., 6.]); stats.drift(list(enumerate([3., 1., 4., 1., 5., 9.])))\n"
            "paired.power(0.1, 0.05, 0.01, 'less', 30)\n"
            "print('scipy.stats' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_nan_propagates_as_in_scipy_and_the_cached_distribution_cannot_be_changed(sp):
    x, y = [0.0, 1, 2, 3, 4, 5], [1.0, 2, math.nan, 4, 5, 6]
    rho, p = exact.spearman(x, y)
    assert math.isnan(rho) and math.isnan(p) and math.isnan(sp.spearmanr(x, y).pvalue)
    assert math.isnan(exact.trim_mean([1.0, math.nan, 3, 4, 5], 0.2))
    assert math.isnan(sp.trim_mean([1.0, math.nan, 3, 4, 5], 0.2))
    tail = exact.u_tail(3, 3)
    with pytest.raises(ValueError):
        tail *= 0  # shared by every later call: read-only
    assert exact.mann_whitney_p([4.0, 5, 6], [1.0, 2, 3], "less") == 1.0
