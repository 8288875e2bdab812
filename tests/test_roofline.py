"""Roofline: FLOP and byte counts against hand formulas, ceilings and their sources, the bound
classification, the plot, the report sections, and the cross-hardware report (CPU; CI)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from gpuopt import Results
from gpuopt.analysis.datasheet import lookup
from gpuopt.analysis.roofline import (
    compute_ceiling,
    count_bytes,
    count_flops,
    datasheet_ceilings,
    memory_ceiling,
    place,
    plot_roofline,
    roofline_markdown,
    roofline_points,
)
from gpuopt.report.crosshw import cross_hardware_markdown

# ----------------------------------------------------------------------------- counting


@pytest.mark.parametrize("bias", [True, False])
def test_linear_flops_are_2mnk(rng, bias):
    m, k, n = 8, 32, 16
    layer = torch.nn.Linear(k, n, bias=bias)
    assert count_flops(layer, torch.randn(m, k, generator=rng)) == 2 * m * n * k
    # The inputs convention: tuple (positional) and dict (keyword) give the same count.
    assert count_flops(layer, (torch.randn(m, k, generator=rng),)) == 2 * m * n * k
    assert count_flops(layer, {"input": torch.randn(m, k, generator=rng)}) == 2 * m * n * k


@pytest.mark.parametrize("groups, stride, padding", [(1, 1, 0), (2, 2, 1), (4, 1, 1)])
def test_conv2d_flops_match_the_hand_formula(rng, groups, stride, padding):
    n, c_in, c_out, h, w, kh, kw = 3, 4, 8, 15, 13, 3, 5
    conv = torch.nn.Conv2d(c_in, c_out, (kh, kw), stride=stride, padding=padding, groups=groups)
    h_out = (h + 2 * padding - kh) // stride + 1
    w_out = (w + 2 * padding - kw) // stride + 1
    per_image = 2 * c_out * h_out * w_out * c_in * kh * kw / groups
    assert count_flops(conv, torch.randn(n, c_in, h, w, generator=rng)) == n * per_image


def test_flops_of_a_model_add_up_and_run_without_grad(rng):
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 5))
    x = torch.randn(4, 10, generator=rng)
    assert count_flops(model, x) == 2 * 4 * (10 * 20 + 20 * 5)
    assert count_flops(lambda t: model(t).sum(), x) == 2 * 4 * (10 * 20 + 20 * 5)
    with pytest.raises(TypeError, match="model must be an nn.Module or a callable"):
        count_flops(42, x)


def test_resnet50_flops_match_torchvisions_published_figure(rng):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, 224, 224, generator=rng)
    assert count_flops(model, x) == pytest.approx(2 * 4.09e9, rel=0.005)  # torchvision: 4.09 GFLOPS (MACs)
    b = count_bytes(model, x)
    assert b["weight_bytes"] == 4 * sum(p.numel() for p in model.parameters()) + sum(
        t.numel() * t.element_size() for t in model.buffers())
    assert b["max_bytes"] >= b["min_bytes"] > b["weight_bytes"] + b["input_bytes"]


def test_bytes_of_a_tiny_mlp_by_hand(rng):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(2, 8, generator=rng)
    b = count_bytes(model, x)
    weights = 4 * ((8 * 16 + 16) + (16 * 4 + 4))  # fp32
    inputs, outputs = 4 * 2 * 8, 4 * 2 * 4
    activations = 4 * 2 * 16 + 4 * 2 * 16  # Linear 1 and ReLU outputs; Linear 2's is the model output
    assert b["weight_bytes"] == weights and b["input_bytes"] == inputs and b["output_bytes"] == outputs
    assert b["activation_bytes"] == activations and b["leaf_calls"] == 3
    assert b["min_bytes"] == weights + inputs + outputs + 2 * activations == 1456
    # Each leaf call moves its weights, inputs and outputs: for a chain that is the same total.
    per_call = [4 * 144 + inputs + 4 * 32, 4 * 32 + 4 * 32, 4 * 68 + 4 * 32 + outputs]
    assert b["max_bytes"] == sum(per_call) == 1456


class Twice(torch.nn.Module):
    """One Linear applied twice, output returned as a view: weights read twice in the upper estimate."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.lin(x)).unsqueeze(0)


def test_bytes_count_repeated_calls_in_max_and_views_of_outputs_once(rng):
    b = count_bytes(Twice().to(torch.float64), torch.randn(3, 4, generator=rng, dtype=torch.float64))
    weights, io = 8 * 20, 8 * 12
    assert b["activation_bytes"] == io  # the first call's output; the second is the model output (a view of it)
    assert b["min_bytes"] == weights + io + io + 2 * io
    assert b["max_bytes"] == 2 * (weights + io + io)
    assert b["max_bytes"] > b["min_bytes"]


def test_bytes_with_kwargs_buffers_and_half_precision(rng):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(6)
            self.scale = torch.nn.Parameter(torch.ones(6))  # owned by a non-leaf module

        def forward(self, x, *, shift):
            return self.norm(x) * self.scale + shift

    net = Net().eval().half()
    b = count_bytes(net, {"x": torch.randn(5, 6, generator=rng).half(), "shift": torch.randn(6, generator=rng).half()})
    bn = 2 * (6 + 6 + 6 + 6) + 8  # weight, bias, running mean/var (fp16) + num_batches_tracked (int64)
    assert b["weight_bytes"] == bn + 2 * 6
    assert b["input_bytes"] == 2 * 30 + 2 * 6 and b["output_bytes"] == 2 * 30
    assert b["activation_bytes"] == 2 * 30  # BatchNorm's output, consumed by the functional tail
    assert b["min_bytes"] == b["weight_bytes"] + b["input_bytes"] + b["output_bytes"] + 2 * 60
    assert b["max_bytes"] >= b["min_bytes"]
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        count_bytes(lambda x: x, torch.ones(1))


# ----------------------------------------------------------------------------- ceilings

H100 = "NVIDIA H100 80GB HBM3"


def test_compute_ceiling_prefers_measured_and_falls_back_to_the_datasheet():
    measured = {"device": H100, "measured": {"gemm_tflops": {"bf16": 790.0, "fp32": 48.0, "tf32": None},
                                              "fp32_fma_tflops": 60.0, "hbm_copy_gbps": 3000.0},
                "datasheet": None}
    assert compute_ceiling(measured, "bf16-amp") == (790.0, "measured")
    assert compute_ceiling(measured, "bf16") == (790.0, "measured")
    assert compute_ceiling(measured, "fp32") == (60.0, "measured")  # max of GEMM fp32 and FMA
    # Not measured: the datasheet (looked up by the device name when the entry is None).
    h100 = lookup(H100)
    assert compute_ceiling(measured, "tf32") == (h100.tf32_tflops, "datasheet")
    assert compute_ceiling(measured, "fp16-amp") == (h100.fp16_tflops, "datasheet")
    # An explicit datasheet dict is used as given.
    sheet = {"measured": {"gemm_tflops": {"fp16": 0.0}}, "datasheet": {"fp16_tflops": 100.0}}
    assert compute_ceiling(sheet, "fp16") == (100.0, "datasheet")  # a zero measurement is no measurement
    assert compute_ceiling({"measured": {"gemm_tflops": {"fp16": float("nan")}}}, "fp16") == (None, None)
    assert compute_ceiling({}, "fp32") == (None, None) and compute_ceiling(None, "fp32") == (None, None)
    assert compute_ceiling({"device": "Tesla T4"}, "bf16-amp") == (None, None)  # no BF16 hardware
    t4 = lookup("Tesla T4")  # no TF32 hardware: tf32 runs at the FP32 rate
    assert t4.tf32_tflops is None and compute_ceiling({"device": "Tesla T4"}, "tf32") == (t4.fp32_tflops, "datasheet")
    with pytest.raises(ValueError, match="precision must be one of"):
        compute_ceiling(measured, "fp64")
    with pytest.raises(TypeError, match="ceilings must be a dict"):
        compute_ceiling([1, 2], "fp32")


def test_memory_ceiling_prefers_measured_copy_bandwidth():
    assert memory_ceiling({"measured": {"hbm_copy_gbps": 2950.5}, "device": H100}) == (2950.5, "measured")
    assert memory_ceiling({"measured": {"hbm_read_gbps": 3100.0}, "device": H100}) == (
        lookup(H100).memory_bandwidth_gbps, "datasheet")  # a read figure is not the copy ceiling
    a100 = "NVIDIA A100-SXM4-40GB"
    assert memory_ceiling({"device": a100}) == (lookup(a100).memory_bandwidth_gbps, "datasheet")
    assert memory_ceiling({"device": "NVIDIA GeForce GTX 1080", "measured": {}}) == (None, None)
    assert memory_ceiling(None) == (None, None)


def test_datasheet_ceilings():
    c = datasheet_ceilings("NVIDIA L40S")
    assert c["measured"] == {} and c["datasheet"]["key"] == "L40S" and c["device"] == "NVIDIA L40S"
    assert datasheet_ceilings("Mystery GPU")["datasheet"] is None
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device_name is needed"):
            datasheet_ceilings()


# ----------------------------------------------------------------------------- classification

CEILINGS = {"device": "test GPU", "measured": {"gemm_tflops": {"bf16": 800.0, "fp32": 50.0}, "hbm_copy_gbps": 3000.0}}
RIDGE = 800.0 * 1e3 / 3000.0  # FLOP/byte


def test_big_gemm_is_compute_bound():
    n = 4096
    r = place(flops_per_item=2 * n**3, bytes_per_item=3 * 2 * n**2, items_per_s=4000, precision="bf16-amp",
              ceilings=CEILINGS)
    assert r["bound"] == "compute-bound"
    assert r["achieved_tflops"] == pytest.approx(2 * n**3 * 4000 / 1e12)
    assert r["pct_of_compute_ceiling"] == pytest.approx(100 * r["achieved_tflops"] / 800)
    assert r["arithmetic_intensity"] == pytest.approx(n / 3)
    assert r["ridge_point"] == pytest.approx(RIDGE)
    assert r["achieved_gbps"] == pytest.approx(3 * 2 * n**2 * 4000 / 1e9)
    assert r["compute_source"] == r["memory_source"] == "measured"
    assert r["reason"].startswith("compute-bound: ") and "ridge point 266.7" in r["reason"]
    assert "of the 800 TFLOP/s bf16-amp ceiling (measured)" in r["reason"]
    json.dumps(r)


def test_elementwise_op_is_memory_bound_and_a_copy_counts_zero_flops():
    nbytes = 2 * 4 * (64 << 20)  # read + write fp32
    add = place(flops_per_item=64 << 20, bytes_per_item=nbytes, items_per_s=2400e9 / nbytes, precision="fp32",
                ceilings=CEILINGS)
    assert add["bound"] == "memory-bound" and add["pct_of_memory_ceiling"] == pytest.approx(80.0)
    copy = place(flops_per_item=0, bytes_per_item=nbytes, items_per_s=2400e9 / nbytes, precision="fp32",
                 ceilings={"device": H100, "measured": {"hbm_copy_gbps": 3000.0}})
    assert copy["bound"] == "memory-bound" and copy["arithmetic_intensity"] == 0.0
    assert copy["compute_source"] == "datasheet" and copy["achieved_tflops"] == 0.0


def test_low_utilisation_or_a_launch_bound_diagnosis_is_latency_bound():
    small = place(flops_per_item=2 * 64**3, bytes_per_item=3 * 2 * 64**2, items_per_s=50_000, precision="bf16",
                  ceilings=CEILINGS)
    assert small["pct_of_compute_ceiling"] < 25 and small["pct_of_memory_ceiling"] < 25
    assert small["bound"] == "latency/launch-bound" and "below 25% of both ceilings" in small["reason"]
    # A GEMM at 69% of the ceiling, but the timing said the host could not keep up.
    n = 4096
    diag = place(flops_per_item=2 * n**3, bytes_per_item=3 * 2 * n**2, items_per_s=4000, precision="bf16",
                 ceilings=CEILINGS, diagnosis="launch-bound")
    assert diag["bound"] == "latency/launch-bound" and "host" in diag["reason"]
    assert diag["pct_of_compute_ceiling"] == pytest.approx(68.7, abs=0.1)


@pytest.mark.parametrize(
    "kwargs, missing",
    [
        ({"flops_per_item": None}, "no FLOP count"),
        ({"bytes_per_item": None}, "no byte count"),
        ({"items_per_s": None}, "no throughput"),
        ({"ceilings": {}}, "no bf16 compute ceiling, no memory ceiling"),
        ({"ceilings": {"measured": {"gemm_tflops": {"bf16": 800.0}}}}, "no memory ceiling"),
    ],
)
def test_missing_inputs_give_unknown_with_the_reason(kwargs, missing):
    args = {"flops_per_item": 1e9, "bytes_per_item": 1e6, "items_per_s": 1000.0, "precision": "bf16",
            "ceilings": CEILINGS, **kwargs}
    r = place(**args)
    assert r["bound"] == "unknown" and missing in r["reason"]
    assert r["ridge_point"] is None or r["arithmetic_intensity"] is None or r["achieved_tflops"] is None
    assert set(r) >= {"achieved_tflops", "pct_of_compute_ceiling", "achieved_gbps", "pct_of_memory_ceiling",
                      "arithmetic_intensity", "ridge_point", "bound", "reason"}


def test_place_validates_its_arguments():
    with pytest.raises(ValueError, match="flops_per_item must be a finite number >= 0"):
        place(flops_per_item=-1, bytes_per_item=1, items_per_s=1, precision="fp32", ceilings=CEILINGS)
    with pytest.raises(ValueError, match="items_per_s must be a finite number"):
        place(flops_per_item=1, bytes_per_item=1, items_per_s=math.inf, precision="fp32", ceilings=CEILINGS)
    with pytest.raises(ValueError, match="precision must be one of"):
        place(flops_per_item=1, bytes_per_item=1, items_per_s=1, precision="int4", ceilings=CEILINGS)


# ----------------------------------------------------------------------------- plot and report


def test_roofline_plot_writes_png_and_svg(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    ceilings = {"device": H100, "measured": {"gemm_tflops": {"bf16": 790.0}}}
    points = [{"label": "gemm 8192", "arithmetic_intensity": 2730.0, "achieved_tflops": 700.0},
              {"label": "copy", "arithmetic_intensity": 0.01, "achieved_tflops": 0.03},
              {"label": "no count", "arithmetic_intensity": None, "achieved_tflops": None}]
    fig = plot_roofline(points, ceilings, "bf16-amp", path=tmp_path / "roof")
    assert isinstance(fig, Figure)
    png, svg = tmp_path / "roof.png", tmp_path / "roof.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = svg.read_text()
    assert "<svg" in text
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)" and ax.get_ylabel() == "performance (TFLOP/s)"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "memory 3,350 GB/s (datasheet)" in legend
    assert "bf16-amp compute 790.0 TFLOP/s (measured)" in legend
    labels = [t.get_text() for t in ax.texts]
    assert "gemm 8192" in labels and "copy" in labels and any("not shown" in t for t in labels)
    # A .png path writes the same pair; no ceilings still gives a plot of the points.
    plot_roofline(points[:1], None, "fp32", title="t", path=tmp_path / "sub" / "r.png")
    assert (tmp_path / "sub" / "r.png").exists() and (tmp_path / "sub" / "r.svg").exists()


def _row(model, config, batch, mode, tput, device, roof=None, status="ok", error=None):
    return {"model": model, "config": config, "batch_size": batch, "mode": mode, "status": status, "error": error,
            "throughput_items_per_s": tput if status == "ok" else None,
            "latency_ms": {"p50": 1e3 * batch / tput, "p95": 1.1e3 * batch / tput, "p99": 1.2e3 * batch / tput,
                           "mean": 1e3 * batch / tput} if status == "ok" else None,
            "peak_memory": None, "device": device, "precision": config.split("+")[0],
            "flops_per_item": 8.2e9, "bytes_per_item_min": 1.2e8, "bytes_per_item_max": 3.0e8, "roofline": roof}


def test_roofline_markdown_and_points():
    roof = place(flops_per_item=8.2e9, bytes_per_item=1.2e8, items_per_s=3000, precision="fp16-amp",
                 ceilings={"device": "NVIDIA A100-SXM4-80GB"})
    rows = [_row("resnet50", "fp16-amp", 32, "throughput", 3000.0, "NVIDIA A100-SXM4-80GB", roof),
            _row("vit_b_16", "fp32", 8, "latency", 100.0, "NVIDIA A100-SXM4-80GB")]
    md = roofline_markdown(rows)
    assert md.startswith("## Roofline")
    peak = lookup("NVIDIA A100-SXM4-80GB").fp16_tflops
    tflops = 8.2e9 * 3000 / 1e12
    assert f"| resnet50 | fp16-amp | 32 | {tflops:.3g} | {100 * tflops / peak:.0f} | {peak:.4g} TFLOP/s (datasheet) |" in md
    assert roof["reason"] in md and "vit_b_16" not in md
    points = roofline_points(rows)
    assert points == [{"label": "resnet50 fp16-amp bs32", "arithmetic_intensity": roof["arithmetic_intensity"],
                       "achieved_tflops": roof["achieved_tflops"]}]
    assert "No row carries" in roofline_markdown(rows[1:])


# ----------------------------------------------------------------------------- cross-hardware report


def _doc(gpu, rows, **env):
    return {"schema_version": 1, "env": {"gpus": [{"index": 0, "name": gpu}], "gpuopt": "0.1.0", "torch": "2.14.1",
                                         "driver": "580.1", **env}, "rows": rows}


def test_cross_hardware_report_from_json_files(tmp_path):
    a100, h100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
    roof_a = place(flops_per_item=8.2e9, bytes_per_item=1.2e8, items_per_s=3000, precision="fp16-amp",
                   ceilings={"device": a100})
    roof_h = place(flops_per_item=8.2e9, bytes_per_item=1.2e8, items_per_s=6000, precision="fp16-amp",
                   ceilings={"device": h100})
    docs = [
        _doc(a100, [_row("resnet50", "fp16-amp", 32, "throughput", 3000.0, a100, roof_a),
                    _row("vit_b_16", "fp32", 8, "latency", 100.0, a100),
                    _row("bert", "fp16", 1, "latency", 250.0, a100)]),
        _doc(h100, [_row("resnet50", "fp16-amp", 32, "throughput", 6000.0, h100, roof_h),
                    _row("vit_b_16", "fp32", 8, "latency", 0.0, h100, status="failed",
                         error="RuntimeError: CUDA out of memory | tried to allocate\n2 GiB"),
                    _row("gpt2", "bf16", 4, "latency", 80.0, h100)]),
    ]
    paths = []
    for i, doc in enumerate(docs):
        p = tmp_path / f"results{i}.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    loaded = [json.loads(p.read_text()) for p in paths]
    md = cross_hardware_markdown(loaded)

    def line(section, model):
        part = md.split(f"## {section}")[1].split("\n## ")[0]
        return next(ln for ln in part.splitlines() if ln.startswith(f"| {model} |"))

    tput = f"Throughput (items/s; ratio against {a100})"
    assert line(tput, "resnet50") == "| resnet50 | fp16-amp | 32 | throughput | 3,000 | 6,000 (2.00x) |"
    failed = line(tput, "vit_b_16")
    assert "failed: RuntimeError: CUDA out of memory \\| tried to allocate 2 GiB" in failed
    assert failed.startswith("| vit_b_16 | fp32 | 8 | latency | 100 | failed")
    assert line(tput, "bert") == "| bert | fp16 | 1 | latency | 250 | - |"
    assert line(tput, "gpt2") == "| gpt2 | bf16 | 4 | latency | - | 80 |"
    assert line("Median latency", "resnet50") == "| resnet50 | fp16-amp | 32 | throughput | 10.7 | 5.33 |"
    roof_line = line("Share of each device's own roofline", "resnet50")
    assert f"{roof_a['pct_of_compute_ceiling']:.0f}% compute" in roof_line
    assert f"{roof_h['pct_of_memory_ceiling']:.0f}% memory" in roof_line
    assert roof_line.count("(latency/launch-bound)") == 2  # ResNet-50 at these rates: under 25% of both
    assert line("Share of each device's own roofline", "bert").endswith("| n/a | - |")
    assert f"| 1 | {a100} | 0.1.0 | 2.14.1 | 580.1 | 3 |" in md


def test_cross_hardware_report_tells_same_named_devices_apart():
    row = _row("m", "fp32", 1, "latency", 10.0, "X")
    md = cross_hardware_markdown([_doc("NVIDIA L4", [row]), _doc("NVIDIA L4", [row])])
    assert "NVIDIA L4 (1)" in md and "NVIDIA L4 (2)" in md and "(1.00x)" in md
    no_env = cross_hardware_markdown([{"rows": [row]}])  # no env: the rows' device names the column
    assert "| m | fp32 | 1 | latency | 10 |" in no_env and "| 1 | X |" in no_env
    # Results objects and documents of either schema version side by side.
    v2 = Results.from_dict(_doc("NVIDIA L4", [_row("m", "fp32", 1, "latency", 20.0, "Y")]))
    mixed = cross_hardware_markdown([_doc("NVIDIA A10", [row]), v2, v2.to_dict()])
    assert "| m | fp32 | 1 | latency | 10 | 20 (2.00x) | 20 (2.00x) |" in mixed


@pytest.mark.parametrize(
    "docs, error, match",
    [
        ({"rows": []}, TypeError, "docs must be a list"),
        ([], ValueError, "at least one results document"),
        (["a.json"], TypeError, "document 1 must be Results or a dict"),
        ([_doc("A", [_row("m", "fp32", 1, "latency", 1.0, "A")]), {"env": {}}], ValueError,
         "document 2, not a gpuopt results document: no 'rows' list"),
        ([_doc("A", [])], ValueError, "document 1 has no rows"),
        ([{"schema_version": 3, "rows": [_row("m", "fp32", 1, "latency", 1.0, "A")]}], ValueError,
         r"document 1, results schema_version 3 is not one this gpuopt reads \(1 to 2\); upgrade gpuopt"),
        ([{"rows": [{"model": "m"}]}], ValueError, "document 1, row 1 lacks config, batch_size, mode, status"),
        ([{"rows": [{**_row("m", "fp32", 1, "latency", 1.0, "A"), "colour": "red"}]}], ValueError,
         r"document 1, row 1 has unknown field\(s\) colour"),
    ],
)
def test_cross_hardware_report_validates_documents(docs, error, match):
    with pytest.raises(error, match=match):
        cross_hardware_markdown(docs)


def test_the_low_utilization_rule_works_at_the_documented_threshold():
    # The threshold as the docstring states it (the spec), then placements just under and just over it:
    # intensity 1000 FLOP/B is above the ridge point (266.7), so a busy run is compute-bound.
    documented = float(re.search(r"Below (\d+(?:\.\d+)?)% of both the compute and the memory ceiling",
                                 " ".join(place.__doc__.split())).group(1))
    flops, nbytes = 1e9, 1e6
    for share, bound in ((0.99, "latency/launch-bound"), (1.01, "compute-bound")):
        rate = share * documented / 100 * 800e12 / flops  # items/s at that share of the 800 TFLOP/s ceiling
        r = place(flops_per_item=flops, bytes_per_item=nbytes, items_per_s=rate, precision="bf16", ceilings=CEILINGS)
        assert r["pct_of_compute_ceiling"] == pytest.approx(share * documented)
        assert r["pct_of_memory_ceiling"] == pytest.approx(100 * rate * nbytes / 3000e9)
        assert r["pct_of_memory_ceiling"] < documented
        assert r["bound"] == bound, r["reason"]
        assert (f"below {documented:.0f}% of both ceilings" in r["reason"]) == (share < 1)


def _crowded_points(n: int = 14) -> list[dict]:
    # configs at nearly the same place, long labels: drawn naively, they pile on top of each other
    return [{"label": f"resnet50 fp16-amp+channels_last+compile bs{2 ** i}",
             "arithmetic_intensity": 100.0 * (1 + 0.02 * i), "achieved_tflops": 50.0 * (1 + 0.01 * i)}
            for i in range(n)]


def test_roofline_labels_do_not_overlap_and_the_legend_covers_no_point():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    ceilings = {"device": H100, "measured": {"gemm_tflops": {"fp16": 750.0}}}
    fig = plot_roofline(_crowded_points(), ceilings, "fp16-amp")
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().startswith("resnet50")]
    assert len(labels) == 14
    from matplotlib.text import Text

    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the label, without its leader line
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert not overlapping
    # the legend lies outside the axes, so it covers none of the points
    legend = ax.get_legend().get_window_extent(renderer)
    axes_box = ax.get_window_extent(renderer)
    assert legend.y1 <= axes_box.y0
    # log axes labelled with plain numbers, not powers of ten
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "100" in ticks and not any("10^" in t or "$" in t for t in ticks)


def test_roofline_draws_into_the_given_axes():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2)
    try:
        out = plot_roofline(_crowded_points(3), {"device": H100}, "bf16-amp", ax=right)
        assert out is fig
        assert len(right.collections) == 3 and not left.collections and not left.texts
        assert right.get_xscale() == "log" and len(fig.axes) == 2
    finally:
        plt.close(fig)


def test_gpuopts_operators_are_counted_as_what_they_compute():
    """FlopCounterMode counts an operator without a formula as 0: gpuopt registers one for its decode and
    int8 weight-only linear layers (2 * rows * K * N, once: the CPU kernels' inner ATen calls are not
    counted again) and its decode attention (4 * B * H * L * D)."""
    from gpuopt.llm.linear import DecodeLinear
    from gpuopt.quant.weight_only import quantize_int8_weight_only

    lin = torch.nn.Linear(64, 48)
    x = torch.randn(3, 64)
    assert count_flops(lin, x) == 2 * 3 * 64 * 48
    assert count_flops(DecodeLinear(lin), x) == 2 * 3 * 64 * 48
    q = quantize_int8_weight_only(torch.nn.Sequential(torch.nn.Linear(64, 48)), torch.float32)
    assert count_flops(q, x) == 2 * 3 * 64 * 48
    qry, k = torch.randn(2, 8, 1, 16), torch.randn(2, 4, 30, 16)

    def attend(q):
        return torch.ops.gpuopt.decode_attention(q, k, k, None)

    assert count_flops(attend, qry) == 4 * 2 * 8 * 30 * 16
