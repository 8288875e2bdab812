"""The datasheet table: lookups by torch's device names and peak figures per precision (CPU; CI)."""

from __future__ import annotations

import re

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


# What each precision's matmuls run on; written here from the meaning of the precisions (autocast
# runs matmuls in the 16-bit type, fp32 means TF32 off), not copied from the implementation.
_FIELD = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "fp16": "fp16_tflops", "fp16-amp": "fp16_tflops",
          "bf16": "bf16_tflops", "bf16-amp": "bf16_tflops", "fp8": "fp8_tflops", "int8": "int8_tops",
          "int8-wo": "bf16_tflops"}


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: s.key)
def test_peak_tflops_reads_the_field_of_each_precision(spec):
    assert set(_FIELD) == set(PRECISIONS)
    for precision, field in _FIELD.items():
        expected = getattr(spec, field)
        if expected is None and precision == "tf32":
            expected = spec.fp32_tflops  # no TF32 hardware: tf32 runs as fp32
        assert peak_tflops(spec, precision) == expected
        assert peak_tflops(spec.to_dict(), precision) == expected


def test_peak_tflops_rejects_bad_arguments():
    h100 = lookup("NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="precision must be one of fp32, tf32"):
        peak_tflops(h100, "fp64")
    with pytest.raises(TypeError, match="spec must be a DeviceSpec"):
        peak_tflops("H100", "fp32")


def _numbers(text):
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]


@pytest.mark.parametrize("spec", [s for s in all_specs() if "halved" in s.note], ids=lambda s: s.key)
def test_halved_entries_are_half_the_sparsity_figures_their_note_quotes(spec):
    # The note quotes the datasheet's sparsity figures (tf32/fp16/bf16/fp8/int8); the dense entry must
    # be half of each, within the rounding of the printed figures.
    quoted = _numbers(spec.note[spec.note.index("("):spec.note.index(")") + 1])
    dense = [spec.tf32_tflops, spec.fp16_tflops, spec.bf16_tflops, spec.fp8_tflops, spec.int8_tops]
    assert len(quoted) == 5, spec.note
    for q, d in zip(quoted, dense):
        assert d == pytest.approx(q / 2, abs=0.6), (spec.key, q, d)


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
