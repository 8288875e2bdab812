"""Vendor peak figures of common NVIDIA GPUs: the fallback ceilings of the roofline when measured
ones are missing, and the yardstick a measured ceiling is read against.

All tensor-core figures are *dense*. NVIDIA's datasheets since Ampere print the 2:4 structured
sparsity figure first (marked with an asterisk); where only that figure is printed it is halved here
and the entry's ``note`` says so. FP16 figures are with FP32 accumulation, which is what PyTorch's
fp16 matmuls and convolutions use; GeForce parts run that at half the FP16-accumulate rate.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# What each gpuopt precision runs its matmuls and convolutions on.
_PRECISION_FIELD = {
    "fp32": "fp32_tflops",  # TF32 off: CUDA-core FP32
    "tf32": "tf32_tflops",
    "fp16": "fp16_tflops",
    "fp16-amp": "fp16_tflops",
    "bf16": "bf16_tflops",
    "bf16-amp": "bf16_tflops",
    "fp8": "fp8_tflops",
    "int8": "int8_tops",
    "int8-wo": "bf16_tflops",  # int8 weights dequantized into bf16 matmuls
}
PRECISIONS = tuple(_PRECISION_FIELD)


@dataclass(frozen=True)
class DeviceSpec:
    """Peak figures of one GPU from its vendor's datasheet (dense; TFLOP/s, TOP/s, GB, GB/s).

    A figure is None where the GPU has no hardware path for it (no BF16 or TF32 before Ampere, no
    FP8 before Ada/Hopper). ``memory_gb`` is decimal gigabytes as printed on the datasheet.
    """

    key: str
    name: str
    architecture: str
    compute_capability: str
    fp32_tflops: float
    tf32_tflops: float | None
    fp16_tflops: float
    bf16_tflops: float | None
    int8_tops: float | None
    fp8_tflops: float | None
    memory_gb: float
    memory_bandwidth_gbps: float
    source: str
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


_H100_SHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_A100_SHEET = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
               "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_V100_SHEET = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_HALVED = "tensor figures halved from the datasheet's sparsity figures"

# (match pattern on the lower-cased torch device name, spec). The first match wins, so specific
# names come before general ones (A100 80GB before A100, L40S before L40, A10G before A10). The
# Grace Hopper superchip (GH200) has its own memory figures and is deliberately not matched.
_SPECS: list[tuple[str, DeviceSpec]] = [
    (r"h100.*(pcie|hbm2e)", DeviceSpec(
        "H100 PCIe", "NVIDIA H100 PCIe", "Hopper", "9.0", 51.0, 378.0, 756.5, 756.5, 1513.0, 1513.0,
        80, 2000, _H100_SHEET, f"{_HALVED} (756/1513/1513/3026/3026)")),
    (r"h100.*nvl", DeviceSpec(
        "H100 NVL", "NVIDIA H100 NVL", "Hopper", "9.0", 60.0, 417.5, 835.5, 835.5, 1670.5, 1670.5,
        94, 3900, _H100_SHEET, f"{_HALVED} (835/1671/1671/3341/3341)")),
    (r"h100", DeviceSpec(
        "H100 SXM", "NVIDIA H100 SXM5 80GB", "Hopper", "9.0", 67.0, 494.5, 989.5, 989.5, 1979.0, 1979.0,
        80, 3350, _H100_SHEET,
        f"{_HALVED} (989/1979/1979/3958/3958); torch names it 'NVIDIA H100 80GB HBM3'")),
    (r"(?<!g)h200.*nvl", DeviceSpec(
        "H200 NVL", "NVIDIA H200 NVL", "Hopper", "9.0", 60.0, 417.5, 835.5, 835.5, 1670.5, 1670.5,
        141, 4800, "https://www.nvidia.com/en-us/data-center/h200/", f"{_HALVED} (835/1671/1671/3341/3341)")),
    (r"(?<!g)h200", DeviceSpec(
        "H200", "NVIDIA H200 SXM 141GB", "Hopper", "9.0", 67.0, 494.5, 989.5, 989.5, 1979.0, 1979.0,
        141, 4800, "https://www.nvidia.com/en-us/data-center/h200/",
        f"{_HALVED} (989/1979/1979/3958/3958); the compute of the H100 SXM with HBM3e")),
    (r"a100.*80\s*gb.*pcie|a100.*pcie.*80\s*gb", DeviceSpec(
        "A100 80GB PCIe", "NVIDIA A100 80GB PCIe", "Ampere", "8.0", 19.5, 156.0, 312.0, 312.0, 624.0, None,
        80, 1935, _A100_SHEET, "dense figures as printed (the datasheet gives sparsity beside them)")),
    (r"a100.*80\s*gb", DeviceSpec(
        "A100 80GB SXM", "NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 19.5, 156.0, 312.0, 312.0, 624.0, None,
        80, 2039, _A100_SHEET, "dense figures as printed (the datasheet gives sparsity beside them)")),
    (r"a100.*pcie", DeviceSpec(
        "A100 40GB PCIe", "NVIDIA A100-PCIE-40GB", "Ampere", "8.0", 19.5, 156.0, 312.0, 312.0, 624.0, None,
        40, 1555, _A100_SHEET, "dense figures as printed (the datasheet gives sparsity beside them)")),
    (r"a100", DeviceSpec(
        "A100 40GB SXM", "NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 19.5, 156.0, 312.0, 312.0, 624.0, None,
        40, 1555, _A100_SHEET, "dense figures as printed; an A100 whose name gives no size is taken as 40GB")),
    (r"a10g", DeviceSpec(
        "A10G", "NVIDIA A10G", "Ampere", "8.6", 35.0, 35.0, 70.0, 70.0, 140.0, None,
        24, 600, "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
        "AWS-only variant of the A10 with no public NVIDIA datasheet; figures as AWS and the cited "
        "comparison give them (more CUDA-core, half the tensor-core rate of the A10); approximate")),
    (r"\ba10\b", DeviceSpec(
        "A10", "NVIDIA A10", "Ampere", "8.6", 31.2, 62.5, 125.0, 125.0, 250.0, None,
        24, 600, "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf",
        "dense figures as printed (the datasheet gives sparsity beside them)")),
    (r"l40s", DeviceSpec(
        "L40S", "NVIDIA L40S", "Ada Lovelace", "8.9", 91.6, 183.0, 362.05, 362.05, 733.0, 733.0,
        48, 864, "https://www.nvidia.com/en-us/data-center/l40s/",
        "dense figures as printed beside the sparsity ones; INT8 from FP8 (the same tensor-core rate)")),
    (r"\bl40\b", DeviceSpec(
        "L40", "NVIDIA L40", "Ada Lovelace", "8.9", 90.5, 90.5, 181.05, 181.05, 362.0, 362.0,
        48, 864, "https://www.nvidia.com/en-us/data-center/l40/",
        "dense figures as printed beside the sparsity ones")),
    (r"\bl4\b", DeviceSpec(
        "L4", "NVIDIA L4", "Ada Lovelace", "8.9", 30.3, 60.0, 121.0, 121.0, 242.5, 242.5,
        24, 300, "https://www.nvidia.com/en-us/data-center/l4/", f"{_HALVED} (120/242/242/485/485)")),
    (r"\bt4\b", DeviceSpec(
        "T4", "Tesla T4", "Turing", "7.5", 8.1, None, 65.0, None, 130.0, None,
        16, 320, "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
        "t4-tensor-core-datasheet-951643.pdf", "no TF32, BF16 or FP8 hardware; FP16 is mixed FP16/FP32")),
    (r"v100.*pcie", DeviceSpec(
        "V100 PCIe", "Tesla V100-PCIE-32GB", "Volta", "7.0", 14.0, None, 112.0, None, None, None,
        32, 900, _V100_SHEET, "no TF32, BF16, INT8 tensor or FP8 hardware; also sold with 16 GB")),
    (r"v100", DeviceSpec(
        "V100 SXM2", "Tesla V100-SXM2-32GB", "Volta", "7.0", 15.7, None, 125.0, None, None, None,
        32, 900, _V100_SHEET, "no TF32, BF16, INT8 tensor or FP8 hardware; also sold with 16 GB")),
    (r"rtx\s*4090", DeviceSpec(
        "RTX 4090", "NVIDIA GeForce RTX 4090", "Ada Lovelace", "8.9", 82.6, 82.6, 165.2, 165.2, 660.6, 330.3,
        24, 1008, "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
        "Ada whitepaper, dense; FP16 and FP8 with FP32 accumulate (GeForce: half the FP16-accumulate "
        "rates 330.3 and 660.6)")),
    (r"rtx\s*3090", DeviceSpec(
        "RTX 3090", "NVIDIA GeForce RTX 3090", "Ampere", "8.6", 35.6, 35.6, 71.0, 71.0, 284.0, None,
        24, 936, "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf",
        "GA102 whitepaper, dense; FP16 with FP32 accumulate (GeForce: half the FP16-accumulate rate 142)")),
]


def all_specs() -> list[DeviceSpec]:
    """Every GPU in the table, in matching order.

    >>> any(s.key == "H100 SXM" for s in all_specs())
    True
    """
    return [spec for _, spec in _SPECS]


def lookup(device_name: str) -> DeviceSpec | None:
    """The datasheet entry of a GPU by its torch name (``torch.cuda.get_device_name()``), or None.

    Matching is on the lower-cased name, so variants like ``"NVIDIA A100-SXM4-80GB"`` and
    ``"NVIDIA A100 80GB PCIe"`` find their entries; an H100 without PCIe/NVL in its name is the SXM.

    >>> lookup("NVIDIA H100 80GB HBM3").key
    'H100 SXM'
    >>> lookup("NVIDIA GeForce GTX 1080") is None
    True
    """
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a string, got {type(device_name).__name__}")
    name = device_name.lower().replace("_", " ")
    for pattern, spec in _SPECS:
        if re.search(pattern, name):
            return spec
    return None


def lookup_dict(device_name: str) -> dict | None:
    """The datasheet entry of a GPU as the dict results and ceilings carry (``DeviceSpec.to_dict()``),
    or None: the one way a datasheet entry is serialised.

    >>> lookup_dict("NVIDIA H200")["memory_bandwidth_gbps"]
    4800
    """
    spec = lookup(device_name)
    return spec.to_dict() if spec is not None else None


def peak_tflops(spec: DeviceSpec | dict, precision: str) -> float | None:
    """Dense peak TFLOP/s (TOP/s for int8) that matmuls under ``precision`` run at.

    ``fp32`` means TF32 off (CUDA-core FP32); ``tf32`` on a GPU without TF32 runs as FP32;
    ``fp16``/``fp16-amp`` and ``bf16``/``bf16-amp`` are the tensor-core figures. None where the GPU
    has no hardware for the precision. ``spec`` may also be a ``DeviceSpec.to_dict()``.

    >>> peak_tflops(lookup("NVIDIA A100-SXM4-80GB"), "bf16-amp")
    312.0
    """
    if precision not in _PRECISION_FIELD:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    d = spec.to_dict() if isinstance(spec, DeviceSpec) else spec
    if not isinstance(d, dict):
        raise TypeError(f"spec must be a DeviceSpec or its dict, got {type(spec).__name__}")
    value = d.get(_PRECISION_FIELD[precision])
    if value is None and precision == "tf32":
        value = d.get("fp32_tflops")
    return None if value is None else float(value)
