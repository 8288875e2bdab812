"""The C++ statistics against numpy and scipy on random data. Only the tests that need scipy are
skipped without it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuopt import Measurement, compare
from gpuopt._ext import _C


@pytest.fixture
def scipy_stats():
    return pytest.importorskip("scipy.stats")

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
def test_median_ci_ranks_match_scipy_binomial(n, confidence, scipy_stats):
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


def test_order_statistics_ci_agrees_with_scipy_quantile_test(scipy_stats):
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
def test_student_t_quantile_matches_scipy(p, df, scipy_stats):
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


def _rel_halfwidth(x: np.ndarray, lo: float, hi: float) -> float:
    med = float(np.median(x))
    return max(med - lo, hi - med) / med


def _attained(n: int, confidence: float) -> bool:
    """Whether the median's CI reaches its confidence: the range [min, max] covers the median with
    probability 1 - 2 * 0.5**n; from 40 samples on the batch-medians interval always applies."""
    return n >= 40 or 2.0 * 0.5**n <= 1.0 - confidence


def test_ci_rel_and_target_met_match_numpy(np_rng):
    outcomes = set()
    for _ in range(200):
        n = int(np_rng.integers(2, 400))
        confidence = float(np_rng.choice([0.9, 0.95, 0.99]))
        target = float(np_rng.uniform(0.002, 0.05))
        x = np_rng.lognormal(0.0, np_rng.uniform(0.005, 0.1), n)
        s = _C.summarize(x.tolist(), confidence, target)
        ref = _rel_halfwidth(x, s["ci_lo"], s["ci_hi"])
        assert s["ci_rel"] == pytest.approx(ref, rel=1e-12), (n, confidence)
        assert s["ci_attained"] == _attained(n, confidence), (n, confidence)
        assert s["target_met"] == (_attained(n, confidence) and ref <= target), (n, confidence, target)
        m = Measurement.from_samples(x.tolist(), confidence=confidence, target_rel_ci=target)
        assert (m.ci_rel, m.target_met) == (s["ci_rel"], s["target_met"])
        outcomes.add(s["target_met"])
    assert outcomes == {True, False}  # both sides of the target were exercised


def test_ci_rel_of_a_saved_measurement_without_it_comes_from_cpp():
    m = Measurement.from_samples([1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.0, 1.3])
    d = m.to_dict()
    del d["ci_rel"]  # saved by gpuopt 0.1
    assert Measurement.from_dict(d).ci_rel == m.ci_rel == _C.rel_halfwidth(m.p50, *m.ci95)
    assert m.ci_rel == pytest.approx(_rel_halfwidth(np.asarray(m.samples_ms), *m.ci95), rel=1e-12)


def _verdict(ratio: float, lo: float, hi: float, min_effect: float) -> str:
    """compare()'s documented rule."""
    if lo > 1.0 and ratio >= 1.0 + min_effect:
        return "faster"
    if hi < 1.0 and ratio <= 1.0 / (1.0 + min_effect):
        return "slower"
    return "no significant difference"


def test_verdict_matches_numpy_on_random_data(np_rng):
    seen = set()
    for _ in range(60):
        n = int(np_rng.integers(20, 300))
        effect = float(np_rng.choice([1.0, 1.004, 0.996, 1.02, 0.98, 1.1, 0.9]))
        min_effect = float(np_rng.choice([0.0, 0.01, 0.05]))
        a = np_rng.lognormal(np.log(effect), 0.01, n)
        b = np_rng.lognormal(0.0, 0.01, int(np_rng.integers(20, 300)))
        seed = int(np_rng.integers(0, 2**63))
        r = _C.compare_samples(a.tolist(), b.tolist(), min_effect=min_effect, seed=seed)
        assert r["ratio"] == pytest.approx(np.median(a) / np.median(b), rel=1e-12)
        assert r["lo"] <= r["ratio"] <= r["hi"]
        assert r["verdict"] == _verdict(r["ratio"], r["lo"], r["hi"], min_effect), (r, min_effect)
        c = compare(Measurement.from_samples(a.tolist()), Measurement.from_samples(b.tolist()),
                    min_effect=min_effect, seed=seed)
        assert (c.speedup, *c.ci, c.verdict) == (r["ratio"], r["lo"], r["hi"], r["verdict"])
        seen.add(r["verdict"])
    assert seen == {"faster", "slower", "no significant difference"}


@pytest.mark.parametrize(
    "base, cand, min_effect, verdict",
    [
        (1.25, 1.0, 0.25, "faster"),  # exactly 1 + min_effect, interval [1.25, 1.25]
        (1.25, 1.0, 0.26, "no significant difference"),
        (1.0, 1.25, 0.25, "slower"),  # exactly 1 / (1 + min_effect)
        (1.0, 1.25, 0.26, "no significant difference"),
        (1.0, 1.0, 0.0, "no significant difference"),  # the interval [1, 1] is not above 1
    ],
)
def test_verdict_edges(base, cand, min_effect, verdict):
    r = _C.compare_samples([base] * 50, [cand] * 50, min_effect=min_effect)
    assert (r["ratio"], r["lo"], r["hi"]) == (base / cand,) * 3
    assert r["verdict"] == verdict


def test_bootstrap_interval_agrees_with_a_numpy_bootstrap(np_rng):
    # Below 40 samples the C++ bootstrap resamples single samples: a plain percentile bootstrap.
    a = np_rng.lognormal(np.log(1.05), 0.05, 30)
    b = np_rng.lognormal(0.0, 0.05, 30)
    resamples = 20000
    ia = np_rng.integers(0, len(a), (resamples, len(a)))
    ib = np_rng.integers(0, len(b), (resamples, len(b)))
    ratios = np.median(a[ia], axis=1) / np.median(b[ib], axis=1)
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    r = _C.compare_samples(a.tolist(), b.tolist(), resamples=resamples, seed=int(np_rng.integers(0, 2**63)))
    width = hi - lo
    assert abs(r["lo"] - lo) < 0.1 * width and abs(r["hi"] - hi) < 0.1 * width, (r, lo, hi)


def test_compare_samples_names_bad_arguments():
    with pytest.raises(ValueError, match=r"min_effect must be in \[0, 1\), got 1.5"):
        _C.compare_samples([1.0], [1.0], min_effect=1.5)
    with pytest.raises(ValueError, match="paired samples must have equal counts, got 2 and 1"):
        _C.compare_samples([1.0, 2.0], [1.0], paired=True)
    with pytest.raises(ValueError, match=r"target_rel_ci must be in \(0, 1\), got 0"):
        _C.summarize([1.0, 2.0], 0.95, 0.0)
