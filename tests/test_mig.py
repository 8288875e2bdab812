"""The MIG layout read through NVML (nvidia-ml-py), with NVML absent and with a fake pynvml at the
boundary: enabled with MIG devices, disabled with a change pending, a GPU without MIG."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpuopt.cli import format_mig
from gpuopt.timing import nvml


class NVMLError_NotSupported(Exception):  # noqa: N801 - pynvml's own class name
    pass


class NVMLError_NotFound(Exception):  # noqa: N801
    pass


def _fake(mode=(1, 1), slots=3, empty=(1,), supported=True):
    def mig_mode(h):
        if not supported:
            raise NVMLError_NotSupported("Not Supported")
        return mode

    def mig_handle(h, i):
        if i in empty:
            raise NVMLError_NotFound("Not Found")
        return ("mig", i)

    return SimpleNamespace(
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetMaxMigDeviceCount=lambda h: slots,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetUUID=lambda h: f"MIG-{h[1]}".encode(),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=(h[1] + 1) * 10 * 2**30),
        nvmlDeviceGetAttributes=lambda h: SimpleNamespace(multiprocessorCount=14 * (h[1] + 1)),
        nvmlDeviceGetGpuInstanceId=lambda h: h[1] + 5,
        nvmlDeviceGetComputeInstanceId=lambda h: 0,
    )


@pytest.fixture
def with_nvml(monkeypatch):
    def use(fake):
        monkeypatch.setattr(nvml, "_init", lambda: (fake, None))
        monkeypatch.setattr(nvml, "_uuid", lambda index: None)  # by index, as without torch's UUID

    return use


def test_without_nvml_the_answer_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(nvml, "_init", lambda: (None, "nvidia-ml-py is not installed"))
    layout = nvml.mig_layout(0)
    assert layout == {"mode": "unavailable", "reason": "nvidia-ml-py is not installed"}
    assert format_mig(layout) == "MIG: unknown (nvidia-ml-py is not installed)"


def test_on_this_machine_nvml_answers_or_says_why_not():
    """On a GPU with NVML the real answer (an H100 or H200 is MIG-capable: enabled with its MIG devices,
    or disabled); without NVML or a GPU, "unavailable" with the reason, never a guess."""
    layout = nvml.mig_layout(0)
    if not nvml.available() or not torch.cuda.is_available():
        assert layout["mode"] == "unavailable" and layout["reason"], layout
        return
    name = torch.cuda.get_device_name(0)
    if any(k in name for k in ("H100", "H200", "A100", "A30", "B200")):
        assert layout["mode"] in ("enabled", "disabled"), (name, layout)
    else:
        assert layout["mode"] in ("enabled", "disabled", "unsupported"), (name, layout)
    if layout["mode"] == "enabled":
        assert layout["devices"] and all(d["uuid"].startswith("MIG-") for d in layout["devices"]), layout
    assert format_mig(layout).startswith(f"MIG {layout['mode']}"), format_mig(layout)


def test_enabled_mig_lists_each_mig_device_skipping_empty_slots(with_nvml):
    with_nvml(_fake())
    layout = nvml.mig_layout(0)
    assert layout["mode"] == "enabled" and "pending" not in layout
    assert [d["index"] for d in layout["devices"]] == [0, 2]
    assert layout["devices"][1] == {"index": 2, "uuid": "MIG-2", "memory_bytes": 30 * 2**30, "sm_count": 42,
                                    "gpu_instance_id": 7, "compute_instance_id": 0}
    assert format_mig(layout) == "MIG enabled, 2 MIG device(s): MIG-0: 10.0 GiB, 14 SMs; MIG-2: 30.0 GiB, 42 SMs"


def test_disabled_with_a_pending_change_and_a_gpu_without_mig(with_nvml):
    with_nvml(_fake(mode=(0, 1)))
    assert nvml.mig_layout(0) == {"mode": "disabled", "pending": "enabled"}
    assert format_mig(nvml.mig_layout(0)) == "MIG disabled (pending enabled after a GPU reset)"
    with_nvml(_fake(supported=False))
    assert nvml.mig_layout(0) == {"mode": "unsupported"}
