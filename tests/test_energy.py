"""Energy per inference: the record measure() keeps (energy_record, from what the C++ loop read at the
timed region's edges), the row's per-item figures, the report and the plot -- on the CPU through the real
path (no NVML here: empty with the reason) and a fake counter at the boundary; on a GPU, the counter
itself against the power readings taken beside it."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt.report.results import Results, Row
from gpuopt.timing.measurement import ENERGY_METHODS, Measurement, energy_record


class FakeMeter:
    def __init__(self, limit_w=700.0):
        self.limit_w = limit_w

    def power_limit_w(self):
        return self.limit_w


def _raw(energy, n=100, cps=4, mode="throughput"):
    return {"samples_ms": [1.0] * n, "calls_per_sample": cps, "mode": mode, "energy": energy}


def test_the_counter_gives_joules_per_call_power_and_the_share_of_the_limit():
    e = energy_record(_raw({"joules": 700.0, "window_s": 2.0, "aligned": True, "reason": ""}), None,
                      meter=FakeMeter(), reason="", idle_power_w=70.0, min_energy_s=1.0)
    assert e["method"] == "nvml-energy-counter" and e["aligned"] and e["calls"] == 400
    assert e["joules_per_call"] == pytest.approx(700.0 / 400) and e["avg_power_w"] == pytest.approx(350.0)
    assert e["share_of_power_limit"] == pytest.approx(0.5) and e["idle_power_w"] == 70.0


def test_a_short_fixed_run_is_estimated_from_power_and_says_so():
    clocks = {"power_w_mean": 300.0, "power_samples": 5}
    e = energy_record(_raw({"joules": 10.0, "window_s": 0.1, "aligned": False, "reason": "a fixed number of samples"}),
                      clocks, meter=FakeMeter(), reason="", idle_power_w=None, min_energy_s=1.0)
    assert e["method"] == "power-x-time-estimate" and e["joules"] == pytest.approx(30.0) and not e["aligned"]
    assert "shorter than min_energy_s=1" in e["reason"] and "5 power readings" in e["reason"]
    # Long enough: the counter's figure stands, with the reason for the unaligned end.
    e = energy_record(_raw({"joules": 600.0, "window_s": 2.0, "aligned": False, "reason": "a fixed number of samples"}),
                      clocks, meter=FakeMeter(), reason="", idle_power_w=None, min_energy_s=1.0)
    assert e["method"] == "nvml-energy-counter" and e["joules"] == 600.0 and "fixed" in e["reason"]


def test_no_counter_falls_back_to_power_samples_and_nothing_gives_no_joules_never_zero():
    clocks = {"power_w_mean": 250.0, "power_samples": 12}
    no_counter = {"joules": None, "window_s": 1.2, "aligned": False, "reason": "the energy counter could not be read"}
    e = energy_record(_raw(no_counter), clocks, meter=FakeMeter(), reason="", idle_power_w=None, min_energy_s=1.0)
    assert e["method"] == "nvml-power-samples" and e["joules"] == pytest.approx(300.0)
    e = energy_record(_raw(no_counter), None, meter=FakeMeter(), reason="", idle_power_w=None, min_energy_s=1.0)
    assert e["method"] is None and e["joules"] is None and e["joules_per_call"] is None
    assert "could not be read" in e["reason"]
    e = energy_record(_raw(None, mode="latency"), clocks, meter=FakeMeter(), reason="", idle_power_w=None,
                      min_energy_s=1.0)
    assert e["method"] is None and "interleaved" in e["reason"]
    assert set(ENERGY_METHODS) == {"nvml-energy-counter", "nvml-power-samples", "power-x-time-estimate"}


def test_on_the_cpu_energy_is_empty_with_the_reason_and_nothing_fails():
    m = gpuopt.measure(lambda: None, mode="host", max_time_s=0.1)
    assert m.energy["method"] is None and m.energy["joules"] is None and "off the GPU" in m.energy["reason"]
    assert gpuopt.measure(lambda: None, mode="host", max_time_s=0.1, energy=False).energy is None
    assert Measurement.from_dict(m.to_dict()).energy == m.energy
    with pytest.raises(TypeError, match="energy must be True or False, got 'yes'"):
        gpuopt.measure(lambda: None, mode="host", energy="yes")
    with pytest.raises(ValueError, match=r"min_energy_s must be in \[0, 60\] seconds .* got -1"):
        gpuopt.measure(lambda: None, mode="host", min_energy_s=-1)


def _row(config, batch, joules_per_call):
    m = Measurement.from_samples([1.0, 1.0, 1.1], mode="throughput")
    m.energy = {"method": "nvml-energy-counter", "joules": 10.0, "window_s": 1.0, "aligned": True, "calls": 10,
                "joules_per_call": joules_per_call, "avg_power_w": 350.0, "power_limit_w": 700.0,
                "share_of_power_limit": 0.5, "idle_power_w": 70.0, "reason": ""}
    return Row.measured(m, model="m", config=config, batch_size=batch, mode="throughput", items_per_call=batch,
                        item_unit="images")


def test_rows_report_and_plot_the_energy_per_item():
    r = Results([_row("fp32", 8, 4.0), _row("fp32", 16, 6.0), _row("fp16", 8, 2.0), _row("fp16", 16, 3.0)])
    row = r.find("m", "fp16", 16, "throughput")
    assert row.energy["joules_per_item"] == pytest.approx(3.0 / 16)
    assert row.energy["items_per_joule"] == pytest.approx(16 / 3.0)
    flat = r.to_csv()
    assert "joules_per_item" in flat.splitlines()[0] and "nvml-energy-counter" in flat
    md = r.to_markdown()
    assert "### Energy (throughput mode" in md and "0.188 / 5.3 / 350 W, 50%" in md
    assert "the GPU idled at 70 W" in md
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    from gpuopt.report import plots

    fig = plots.energy_vs_batch(r, "m")
    ys = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    plt.close(fig)
    assert ys["fp16"] == pytest.approx([8 / 2.0, 16 / 3.0]) and ys["fp32"] == pytest.approx([8 / 4.0, 16 / 6.0])
    with pytest.raises(ValueError, match="has a measured energy"):
        plots.energy_vs_batch(Results([Row.measured(Measurement.from_samples([1.0, 1.1]), model="m", config="fp32",
                                                    batch_size=1, mode="throughput")]), "m")


@pytest.mark.gpuopt_gpu
def test_gpu_energy_counter_covers_the_sampled_calls():
    """A ~2 s bf16 GEMM loop: the counter's energy over a window aligned to its steps, at least the
    minimum window; its joules per call are the average power x the time per call (the window holds
    exactly the sampled calls), the power lies between idle and the limit. (The counter against 20 ms
    power readings over the same window is benchmarks/energy.py's target.)"""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    m = gpuopt.measure(lambda: a @ a, mode="throughput", min_time_s=2.0, max_time_s=4.0, min_energy_s=2.0)
    e = m.energy
    assert e["method"] == "nvml-energy-counter" and e["aligned"], e
    assert e["window_s"] >= 2.0 and e["joules"] > 0 and e["calls"] == m.n * m.calls_per_sample
    mean_s = sum(m.samples_ms) / m.n / 1e3
    assert e["joules_per_call"] == pytest.approx(e["avg_power_w"] * mean_s, rel=0.05), (e, mean_s)
    assert e["idle_power_w"] and e["idle_power_w"] < e["avg_power_w"] <= 1.05 * e["power_limit_w"], e
    r = gpuopt.benchmark("tiny-cnn", batch_sizes=[64], configs=["fp32"], modes=["throughput"], parity=False,
                         progress=False, max_time_s=1.5, min_energy_s=0.5)
    row = r.rows[0]
    assert row.ok and row.energy["joules_per_item"] > 0 and row.energy["items_per_joule"] > 0, row.energy
    assert row.energy["joules_per_item"] == pytest.approx(row.energy["joules_per_call"] / 64)


# ---- compare(metric="energy") ----------------------------------------------------------------------------
def _with_energy(joules_per_call, ms=1.0, label=None):
    m = Measurement.from_samples([ms, ms * 1.01, ms * 0.99], mode="throughput", label=label)
    m.energy = {"method": "nvml-energy-counter", "joules": joules_per_call * 3, "window_s": 1.0, "aligned": True,
                "calls": 3, "joules_per_call": joules_per_call, "avg_power_w": 300.0, "power_limit_w": 700.0,
                "share_of_power_limit": 0.43, "idle_power_w": 70.0, "reason": ""}
    return m


def test_energy_of_two_measurements_is_a_ratio_without_an_interval():
    c = gpuopt.compare(_with_energy(0.3, label="fp32"), _with_energy(0.1, label="fp16"), metric="energy")
    assert c.metric == "energy" and c.speedup == pytest.approx(3.0)
    assert c.baseline_joules == pytest.approx(0.3) and c.candidate_joules == pytest.approx(0.1)
    assert c.verdict == "no significant difference" and "one energy reading per Measurement" in c.notes[0]
    assert "3.000x fewer joules per call" in str(c) and "300 mJ -> 100 mJ per call" in str(c)
    assert gpuopt.Comparison.from_dict(c.to_dict()).baseline_joules == pytest.approx(0.3)


def test_energy_of_two_callables_alternates_rounds_and_bootstraps_the_pairs(monkeypatch):
    calls = []

    def fake_measure(fn, *, label=None, **options):
        assert options["energy"] is True and options["mode"] == "throughput"
        calls.append(label)
        jitter = 1 + 0.01 * (len(calls) % 3)
        return _with_energy(fn() * jitter, label=label)

    monkeypatch.setattr("gpuopt.timing.measurement.measure", fake_measure)
    c = gpuopt.compare(lambda: 0.4, lambda: 0.2, metric="energy", rounds=8, mode="throughput",
                       labels=("fp32", "fp16"))
    assert calls[:4] == ["fp32", "fp16", "fp16", "fp32"] and len(calls) == 16  # A B, B A, ...
    assert c.rounds == 8 and c.interleaved and c.verdict == "less energy" and c.speedup == pytest.approx(2.0, rel=0.03)
    assert c.ci[0] > 1.5 and c.candidate_measurement is not None
    c = gpuopt.compare(lambda: 0.2, lambda: 0.4, metric="energy", rounds=8, mode="throughput")
    assert c.verdict == "more energy" and c.speedup < 1


def test_energy_comparison_errors_name_the_problem():
    with pytest.raises(ValueError, match="metric must be one of time, energy, got 'power'"):
        gpuopt.compare(lambda: None, lambda: None, metric="power")
    with pytest.raises(ValueError, match=r"rounds must be an integer in \[2, 1000\].*got 1"):
        gpuopt.compare(lambda: None, lambda: None, metric="energy", rounds=1)
    with pytest.raises(TypeError, match="rounds applies to metric='energy'"):
        gpuopt.compare(lambda: None, lambda: None, rounds=4)
    with pytest.raises(ValueError, match="needs a GPU mode"):
        gpuopt.compare(lambda: None, lambda: None, metric="energy", mode="host")
    no_energy = Measurement.from_samples([1.0, 1.1])
    with pytest.raises(ValueError, match="the baseline has no energy reading: it was measured without energy"):
        gpuopt.compare(no_energy, _with_energy(0.1), metric="energy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without a GPU")
def test_energy_comparison_without_a_gpu_says_why():
    with pytest.raises(ValueError, match="the baseline has no energy reading: no energy off the GPU"):
        gpuopt.compare(lambda: None, lambda: None, metric="energy", rounds=2, min_time_s=0.0, max_time_s=0.05)


@pytest.mark.gpuopt_gpu
def test_gpu_energy_comparison_finds_the_smaller_gemm_uses_less_energy():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    c = gpuopt.compare(lambda: a @ a, lambda: b @ b, metric="energy", rounds=6, mode="throughput",
                       max_time_s=0.5, min_energy_s=0.3, labels=("4096", "2048"))
    # 8x fewer FLOPs per call: several times fewer joules, whatever the clocks do.
    assert c.verdict == "less energy" and c.ci[0] > 3, c
    assert c.baseline_joules > c.candidate_joules > 0 and c.rounds == 6
