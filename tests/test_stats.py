"""The C++ statistics against numpy and scipy on random data. Only the tests that need scipy are
skipped without it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuopt import Comparison, Measurement, compare
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


def _median_ci_ranks_ref(n: int, confidence: float) -> tuple[int, int, float, bool]:
    """Plain-Python reference of the order-statistics median interval: the largest 1-based rank j with
    P(B <= j - 1) <= alpha / 2, B ~ Bin(n, 1/2); else [min, max] with its coverage 1 - 2 * 0.5^n."""
    best, best_cdf = 0, 0.0
    for j in range(1, n // 2 + 2):
        if 2 * j > n + 1:
            break
        cdf_j = sum(math.comb(n, k) for k in range(j)) / 2**n  # P(B <= j - 1)
        if cdf_j > (1 - confidence) / 2:
            break
        best, best_cdf = j, cdf_j
    if best == 0:
        return 0, n - 1, 1 - 2 * 0.5**n, False
    return best - 1, n - best, 1 - 2 * best_cdf, True


def test_bootstrap_interval_agrees_with_a_numpy_bootstrap(np_rng):
    # Below 40 samples the C++ bootstrap resamples single samples: a plain percentile bootstrap,
    # then widened where it is narrower than the two medians' own intervals propagated to the ratio.
    a = np_rng.lognormal(np.log(1.05), 0.05, 30)
    b = np_rng.lognormal(0.0, 0.05, 30)
    resamples = 20000
    ia = np_rng.integers(0, len(a), (resamples, len(a)))
    ib = np_rng.integers(0, len(b), (resamples, len(b)))
    ratios = np.median(a[ia], axis=1) / np.median(b[ib], axis=1)
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    ratio = np.median(a) / np.median(b)

    def log_half(x):
        r_lo, r_hi, _, _ = _median_ci_ranks_ref(len(x), 0.95)
        s, m = np.sort(x), np.median(x)
        return max(np.log(m / s[r_lo]), np.log(s[r_hi] / m))

    spread = math.hypot(log_half(a), log_half(b))
    lo, hi = min(lo, ratio * math.exp(-spread)), max(hi, ratio * math.exp(spread))
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


# ---- issue 12: honest intervals and comparisons -------------------------------------------------

@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_ci_level_is_the_coverage_reached_plain_python(confidence):
    # Needs nothing but Python: the reference the scipy test below double-checks.
    for n in range(1, 60):
        s = _C.summarize(np.linspace(1.0, 2.0, n).tolist(), confidence)
        _, _, coverage, attained = _median_ci_ranks_ref(n, confidence)
        assert s["ci_requested"] == confidence
        assert s["ci_attained"] == (attained or n >= 40), n
        expected = confidence if s["ci_attained"] else coverage
        assert s["ci_level"] == pytest.approx(expected, abs=1e-12), n
    assert _C.summarize([1.0], confidence)["ci_level"] == 0.0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8])
def test_ci_level_matches_scipy_binomial(n, scipy_stats):
    s = _C.summarize(np.linspace(1.0, 2.0, n).tolist(), 0.95)
    # [min, max] covers the median unless all samples fall on one side of it.
    coverage = 1 - 2 * scipy_stats.binom.pmf(0, n, 0.5)
    assert s["ci_level"] == pytest.approx(0.95 if coverage >= 0.95 else coverage, abs=1e-12)


def test_too_few_samples_say_so_instead_of_95_percent():
    one = Measurement.from_samples([1.0], stop_reason="max_time")
    assert (one.ci_level, one.ci_text()) == (0.0, "no interval (1 sample)")
    assert "±0.00%" not in repr(one)
    assert "no 95% CI of the median: no interval (1 sample) (stopped by max_time after 1 sample)" in one.warnings[-1]
    two = Measurement.from_samples([1.0, 1.2])
    assert two.ci_level == 0.5 and two.ci_requested == 0.95
    assert two.ci_text() == "±9.09% (50% CI: only 2 samples)"
    assert "[50% CI 1 ms .. 1.2 ms: only 2 samples]" in repr(two)
    ten = Measurement.from_samples(np.linspace(1.0, 1.1, 10).tolist())
    assert ten.ci_level == 0.95 and ten.ci_text() == f"±{ten.ci_rel:.2%}"
    # A file saved when ci_level was the requested level, reached or not, is read with the truth.
    d = two.to_dict()
    del d["ci_requested"]
    d["ci_level"] = 0.95
    assert (Measurement.from_dict(d).ci_level, Measurement.from_dict(d).ci_requested) == (0.5, 0.95)


def test_a_comparison_of_too_few_samples_is_never_significant():
    a, b = Measurement.from_samples([2.0, 2.0]), Measurement.from_samples([1.0] * 30)
    c = compare(a, b)
    assert c.verdict == "no significant difference"
    assert "too few samples for a 95% interval" in c.notes[0]


independent_sets = st.lists(st.floats(min_value=0.5, max_value=2.0), min_size=2, max_size=300)


@settings(max_examples=150, deadline=None)
@given(independent_sets, independent_sets, st.integers(0, 2**63 - 1))
def test_speedup_interval_is_never_narrower_than_its_inputs(a, b, seed):
    """The guarantee (exact, not approximate): for unpaired medians at the same confidence,
    rel_halfwidth(speedup, lo, hi) >= max(ci_rel of baseline, ci_rel of candidate)."""
    ma, mb = Measurement.from_samples(a), Measurement.from_samples(b)
    c = compare(ma, mb, seed=seed, resamples=200)
    assert _C.rel_halfwidth(c.speedup, *c.ci) >= max(ma.ci_rel, mb.ci_rel) * (1 - 1e-12)


def test_batch_correlated_measurements_give_a_speedup_as_uncertain_as_they_are(np_rng):
    # The case: medians known to +-10% from their batches (level shifts lasting 50 samples)
    # must not give a speedup known to +-1%.
    def shifted(scale):
        levels = np_rng.normal(0.0, 0.08, 40).repeat(50)
        return (scale * (1.0 + levels + np_rng.normal(0.0, 0.001, levels.size))).tolist()

    ma, mb = Measurement.from_samples(shifted(1.5)), Measurement.from_samples(shifted(1.0))
    assert ma.ci_method == "batch-medians"
    c = compare(ma, mb)
    half = _C.rel_halfwidth(c.speedup, *c.ci)
    assert half >= max(ma.ci_rel, mb.ci_rel)
    # A plain per-sample bootstrap (numpy) is several times too narrow here.
    x, y = np.asarray(ma.samples_ms), np.asarray(mb.samples_ms)
    ix, iy = np_rng.integers(0, x.size, (2000, x.size)), np_rng.integers(0, y.size, (2000, y.size))
    plain = np.quantile(np.median(x[ix], axis=1) / np.median(y[iy], axis=1), [0.025, 0.975])
    assert _C.rel_halfwidth(c.speedup, *plain) < 0.7 * half


def test_quantiles_are_plain_floats_like_do_bench(np_rng):
    x = np_rng.lognormal(0.0, 0.1, 101)
    m = Measurement.from_samples(x.tolist())
    q = m.quantiles()
    assert q == pytest.approx(np.quantile(x, [0.5, 0.2, 0.8]).tolist(), rel=1e-12)
    assert all(type(v) is float for v in q)
    assert m.quantiles(0.9) == pytest.approx([np.quantile(x, 0.9)], rel=1e-12)
    with pytest.raises(ValueError, match=r"q must lie in \[0, 1\], got 1.5"):
        m.quantiles((0.5, 1.5))
    with pytest.raises(TypeError, match="q must be a number or a sequence of numbers"):
        m.quantiles("median")


def _t_ppf_reference(p: float, df: int, scipy_stats=None) -> float:
    if scipy_stats is not None:
        return float(scipy_stats.t.ppf(p, df))
    assert df == 2, "closed form for 2 degrees of freedom only"
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


@pytest.mark.parametrize("use_scipy", [False, True])
def test_run_to_run_spread_matches_a_reference(np_rng, use_scipy, request):
    sps = request.getfixturevalue("scipy_stats") if use_scipy else None
    rounds = [np_rng.lognormal(0.0, 0.01, 3), 1000 * np_rng.lognormal(0.0, 0.01, 3)] if sps is None else \
        [np_rng.lognormal(0.0, 0.01, int(k)) for k in np_rng.integers(2, 8, 4)]
    if sps is None:
        rounds = rounds[:1]  # df = 2: the closed form
    logs = [np.log(r) for r in rounds]
    df = sum(len(x) - 1 for x in logs)
    sd = math.sqrt(sum(((x - x.mean()) ** 2).sum() for x in logs) / df)
    expected = math.expm1(_t_ppf_reference(0.975, df, sps) * sd * math.sqrt(2))
    from gpuopt import RunToRun

    r = RunToRun.from_round_medians([x.tolist() for x in rounds])
    assert r.rel == pytest.approx(expected, rel=1e-3 if df > 4 else 2e-2)
    assert (r.source, r.workloads, r.rounds) == ("calibration", len(rounds), min(len(x) for x in rounds))
    assert r.describe().startswith(f"±{r.rel:.1%} (A/A calibration, {r.rounds} rounds")


def test_cross_run_compare_is_widened_by_the_run_to_run_band(np_rng):
    from gpuopt import RunToRun

    a = Measurement.from_samples(np_rng.lognormal(np.log(1.03), 0.002, 300).tolist())
    b = Measurement.from_samples(np_rng.lognormal(0.0, 0.002, 300).tolist())
    same_run = compare(a, b)
    assert same_run.verdict == "faster" and same_run.run_to_run is None
    cross = compare(a, b, run_to_run=RunToRun.default(a))  # host timings: 5%
    assert cross.verdict == "no significant difference"
    assert cross.ci == same_run.ci  # the statistical interval is unchanged
    assert cross.judged_ci[0] == pytest.approx(cross.speedup / 1.05, rel=1e-12)
    assert cross.cross_run_note == ("cross-run comparison: widened by run-to-run spread ±5.0% (a default, no A/A "
                                    "calibration of this environment)")
    assert cross.cross_run_note in str(cross)
    assert compare(a, b, run_to_run=0.02).verdict == "faster"  # 3% exceeds a 2% band
    assert Comparison.from_dict(cross.to_dict()).judged_ci == cross.judged_ci
    with pytest.raises(TypeError, match="run_to_run applies to Measurements from separate runs"):
        compare(lambda: None, lambda: None, run_to_run=0.02, mode="host", max_time_s=0.05)
    with pytest.raises(ValueError, match=r"run-to-run rel must be a finite fraction >= 0 \(0.02 is 2%\), got -0.1"):
        compare(a, b, run_to_run=-0.1)


def test_calibrate_measures_separate_rounds():
    from gpuopt import calibrate

    x = torch.randn(32, 32)
    r = calibrate([lambda: x @ x, lambda: x + x], rounds=3, pause_s=0, mode="host", max_time_s=0.05,
                  min_time_s=0.01)
    assert (r.source, r.rounds, r.workloads) == ("calibration", 3, 2)
    assert 0 <= r.rel < math.inf  # a busy CPU can drift by more than 100% between runs
    with pytest.raises(ValueError, match="rounds must be an integer >= 3"):
        calibrate(lambda: None, rounds=2)
    with pytest.raises(TypeError, match="workloads must be a callable or a non-empty list of callables"):
        calibrate([], rounds=3)


def test_grid_shows_many_measurements_in_one_unit_with_their_intervals():
    from gpuopt.report import Results, Row, grid

    fast = Measurement.from_samples(np.linspace(0.0095, 0.0105, 41).tolist())  # ~10 us
    slow = Measurement.from_samples([2.0, 2.2, 2.4])  # 3 samples: a 75% interval
    text = grid({("matmul", "fp32"): slow, ("matmul", "bf16"): fast, ("copy", "fp32"): fast})
    lines = text.splitlines()
    assert lines[0].split() == ["fp32", "bf16"] and set(lines[1]) == {"-"}
    assert lines[2].split() == ["matmul", "2.2e+03", f"±{slow.ci_rel:.1%}", "(75%", "CI)", "10", f"±{fast.ci_rel:.1%}"]
    assert lines[3].split() == ["copy", "10", f"±{fast.ci_rel:.1%}", "-"]
    assert lines[4] == "median in us; ±: the 95% interval of the median"
    with pytest.raises(TypeError, match=r"cell \('a', 'b'\) must be a gpuopt.Measurement, got float"):
        grid({("a", "b"): 1.0})
    res = Results([Row.measured(fast, model="m", config=c, batch_size=b, mode="latency") for c in ("x", "y")
                   for b in (1, 8)])
    assert res.grid().splitlines()[1].split() == ["batch", "1", "batch", "8"]
    with pytest.raises(ValueError, match="mode 'throughput' has no measured cell; measured modes: latency"):
        res.grid("throughput")
