"""The C++ statistics against numpy and scipy on random data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuopt import _C

scipy_stats = pytest.importorskip("scipy.stats")

samples = st.lists(
    st.floats(min_value=1e-4, max_value=1e4, allow_nan=False, allow_infinity=False), min_size=1, max_size=400
)


@settings(max_examples=200, deadline=None)
@given(samples, st.floats(min_value=0.0, max_value=1.0))
def test_quantile_matches_numpy(data, q):
    assert _C.quantile(data, q) == pytest.approx(np.quantile(data, q), rel=1e-12, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(samples)
def test_summary_matches_numpy(data):
    s = _C.summarize(data)
    x = np.asarray(data)
    assert s["n"] == len(x)
    assert s["mean"] == pytest.approx(x.mean(), rel=1e-9)
    assert s["std"] == pytest.approx(x.std(ddof=1) if len(x) > 1 else 0.0, rel=1e-6, abs=1e-9)
    for key, q in [("p25", 25), ("p50", 50), ("p75", 75), ("p90", 90), ("p95", 95), ("p99", 99)]:
        assert s[key] == pytest.approx(np.percentile(x, q), rel=1e-12)
    assert s["iqr"] == pytest.approx(np.percentile(x, 75) - np.percentile(x, 25), rel=1e-9, abs=1e-12)
    assert s["mad"] == pytest.approx(np.median(np.abs(x - np.median(x))), rel=1e-12, abs=1e-12)
    assert s["min"] == x.min() and s["max"] == x.max()
    assert s["ci_lo"] <= s["p50"] <= s["ci_hi"]


@pytest.mark.parametrize("n", [6, 7, 10, 31, 100, 257, 1000, 12345])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_median_ci_ranks_match_scipy_binomial(n, confidence):
    lo, hi, coverage, attained = _C.median_ci_ranks(n, confidence)
    # Reference: the largest 1-based rank j with P(B <= j-1) <= alpha/2, B ~ Bin(n, 1/2).
    alpha = 1 - confidence
    j = max((j for j in range(1, n // 2 + 1) if scipy_stats.binom.cdf(j - 1, n, 0.5) <= alpha / 2), default=0)
    if j == 0:
        assert not attained
        return
    assert attained
    assert (lo, hi) == (j - 1, n - j)
    assert coverage == pytest.approx(1 - 2 * scipy_stats.binom.cdf(j - 1, n, 0.5), rel=1e-9)
    assert coverage >= confidence


def test_order_statistics_ci_agrees_with_scipy_quantile_test():
    x = np.random.default_rng(5).lognormal(0.0, 0.3, 301)
    lo, hi, _, _ = _C.median_ci_ranks(len(x), 0.95)
    ref = scipy_stats.quantile_test(x, q=np.median(x), p=0.5).confidence_interval(0.95)
    xs = np.sort(x)
    assert xs[lo] == pytest.approx(ref.low, rel=1e-12)
    assert xs[hi] == pytest.approx(ref.high, rel=1e-12)


def test_summary_ci_is_the_envelope_of_order_statistics_and_batch_medians():
    x = np.random.default_rng(6).lognormal(0.0, 0.1, 400)
    s = _C.summarize(x.tolist())
    lo, hi, _, _ = _C.median_ci_ranks(len(x), 0.95)
    xs = np.sort(x)
    b_lo, b_hi = _C.batch_median_ci(x.tolist(), 0.95, _C.batch_count(len(x)))
    assert s["ci_lo"] == pytest.approx(min(xs[lo], b_lo)) and s["ci_hi"] == pytest.approx(max(xs[hi], b_hi))
    assert s["ci_method"] in ("order-statistics", "batch-medians")
    assert _C.summarize(x[:30].tolist())["ci_method"] == "order-statistics"  # too few to batch


@pytest.mark.parametrize("df", [7, 9, 15, 29])
@pytest.mark.parametrize("p", [0.9, 0.975, 0.995])
def test_student_t_quantile_matches_scipy(p, df):
    assert _C.student_t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), abs=6e-3)


def test_batch_ci_widens_for_correlated_samples():
    rng = np.random.default_rng(8)
    x = np.zeros(2000)
    for i in range(1, len(x)):  # AR(1), strong correlation between neighbours
        x[i] = 0.97 * x[i - 1] + rng.normal(0, 0.003)
    s = _C.summarize((1.0 + x).tolist())
    assert s["ci_method"] == "batch-medians"
    lo, hi, _, _ = _C.median_ci_ranks(len(x), 0.95)
    xs = np.sort(1.0 + x)
    assert (s["ci_hi"] - s["ci_lo"]) > 2 * (xs[hi] - xs[lo])


def test_outliers_are_counted_by_mad():
    x = np.random.default_rng(1).normal(10.0, 0.1, 500)
    base = _C.summarize(x.tolist())["outliers"]
    planted = _C.summarize(np.concatenate([x, [20.0, 30.0, 40.0]]).tolist())["outliers"]
    assert planted == base + 3


def test_bootstrap_speedup_recovers_a_known_ratio():
    rng = np.random.default_rng(2)
    slow = rng.lognormal(np.log(1.2), 0.02, 300)
    fast = rng.lognormal(0.0, 0.02, 300)
    ratio, lo, hi = _C.bootstrap_speedup(slow.tolist(), fast.tolist())
    assert ratio == pytest.approx(np.median(slow) / np.median(fast))
    assert lo < ratio < hi
    assert lo > 1.15 and hi < 1.25


def test_bad_statistics_input_names_the_parameter():
    with pytest.raises(ValueError, match="confidence must be in"):
        _C.summarize([1.0, 2.0], 1.5)
    with pytest.raises(ValueError, match="resamples must be >= 100, got 5"):
        _C.bootstrap_speedup([1.0], [1.0], 0.95, 5)
    with pytest.raises(ValueError, match="finite"):
        _C.summarize([1.0, float("nan")])


def test_bootstrap_of_a_tail_quantile():
    rng = np.random.default_rng(4)
    base = rng.lognormal(0.0, 0.05, 500)
    tail = np.concatenate([rng.lognormal(0.0, 0.05, 450), rng.lognormal(np.log(1.5), 0.05, 50)])
    rng.shuffle(tail)  # slow calls spread over the run (clustered ones widen the block bootstrap)
    ratio, lo, hi = _C.bootstrap_speedup(tail.tolist(), base.tolist(), q=0.95)
    assert ratio == pytest.approx(np.quantile(tail, 0.95) / np.quantile(base, 0.95))
    assert lo > 1.2  # the tail got slower, significantly
    mratio, mlo, mhi = _C.bootstrap_speedup(tail.tolist(), base.tolist())
    assert mlo < 1.05  # the median barely moved
    with pytest.raises(ValueError, match=r"q must be in \(0, 1\)"):
        _C.bootstrap_speedup(base.tolist(), base.tolist(), q=1.0)
