"""The datasheet table: lookups by torch's device names and peak figures per precision (CPU; CI)."""

from __future__ import annotations

import pytest

from gpuopt.analysis.datasheet import PRECISIONS, DeviceSpec, all_specs, lookup, peak_tflops


@pytest.mark.parametrize(
    "torch_name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ],
)
def test_lookup_matches_torch_device_names(torch_name, key):
    spec = lookup(torch_name)
    assert spec is not None and spec.key == key
    assert lookup(torch_name.upper()) == spec == lookup(f"  {torch_name.lower()} ")


@pytest.mark.parametrize("name", ["NVIDIA GeForce GTX 1080", "NVIDIA GH200 480GB", "AMD Instinct MI300X", "", "cpu"])
def test_unknown_gpus_are_none(name):
    assert lookup(name) is None


def test_lookup_rejects_non_strings():
    with pytest.raises(TypeError, match="device_name must be a string"):
        lookup(None)


def test_peak_tflops_per_precision():
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert peak_tflops(h100, "fp32") == 67.0  # TF32 off: CUDA cores
    assert peak_tflops(h100, "tf32") == 494.5
    assert peak_tflops(h100, "fp16-amp") == peak_tflops(h100, "fp16") == 989.5
    assert peak_tflops(h100, "bf16-amp") == peak_tflops(h100, "bf16") == 989.5
    assert peak_tflops(h100, "fp8") == 1979.0 and peak_tflops(h100, "int8") == 1979.0
    assert peak_tflops(h100.to_dict(), "bf16") == 989.5
    t4 = lookup("Tesla T4")
    assert peak_tflops(t4, "fp16-amp") == 65.0
    assert peak_tflops(t4, "bf16-amp") is None and peak_tflops(t4, "fp8") is None
    assert peak_tflops(t4, "tf32") == 8.1  # no TF32 hardware: tf32 runs as fp32
    with pytest.raises(ValueError, match="precision must be one of fp32, tf32"):
        peak_tflops(h100, "fp64")
    with pytest.raises(TypeError, match="spec must be a DeviceSpec"):
        peak_tflops("H100", "fp32")


def test_known_dense_figures():
    a100 = lookup("NVIDIA A100-SXM4-80GB")
    assert (a100.fp32_tflops, a100.tf32_tflops, a100.bf16_tflops, a100.int8_tops, a100.fp8_tflops) == (
        19.5, 156.0, 312.0, 624.0, None)
    assert a100.memory_bandwidth_gbps == 2039 and lookup("NVIDIA A100-SXM4-40GB").memory_bandwidth_gbps == 1555
    assert lookup("NVIDIA H200").memory_bandwidth_gbps == 4800 and lookup("NVIDIA H200").memory_gb == 141
    assert lookup("NVIDIA L4").bf16_tflops == 121.0  # 242 with sparsity, halved
    assert lookup("NVIDIA GeForce RTX 4090").fp16_tflops == 165.2  # FP32 accumulate


def test_every_entry_is_complete_and_plausible():
    specs = all_specs()
    keys = [s.key for s in specs]
    assert len(set(keys)) == len(keys)
    for required in ("T4", "L4", "A10G", "A100 40GB SXM", "A100 80GB SXM", "H100 PCIe", "H100 SXM", "H200",
                     "L40S", "RTX 4090"):
        assert required in keys
    for s in specs:
        assert isinstance(s, DeviceSpec)
        assert s.source.startswith("https://"), s.key
        assert s.fp32_tflops > 0 and s.memory_gb > 0 and s.memory_bandwidth_gbps > 0, s.key
        assert s.fp16_tflops > s.fp32_tflops, s.key  # tensor cores beat CUDA cores
        if s.bf16_tflops is not None:
            assert s.tf32_tflops is not None and s.tf32_tflops <= s.bf16_tflops, s.key
        if s.fp8_tflops is not None:
            assert s.fp8_tflops == pytest.approx(2 * s.fp16_tflops, rel=0.02), s.key
        if "halved" in s.note:
            assert "sparsity" in s.note
        assert lookup(s.name) == s, s.key  # each entry's own name finds it
        for p in PRECISIONS:
            v = peak_tflops(s, p)
            assert v is None or v > 0
