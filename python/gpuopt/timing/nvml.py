"""Thin, failure-tolerant access to NVML: device facts through nvidia-ml-py where it is installed,
and the clock monitor of measure() -- gpuopt's C++ thread reading the driver's libnvidia-ml itself.

Every function returns None (or an empty result) when NVML or the queried field is unavailable:
NVML facts enrich results, they never decide whether a run works.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import torch

from .._ext import _C


@functools.lru_cache(maxsize=1)
def _init() -> tuple[Any, str | None]:
    """(pynvml, None) when NVML started, else (None, why not): the package is missing, the driver's
    library is not found, the driver is not loaded, or NVML failed otherwise."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py for clocks, power, ECC)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no permission, stub library...
        name = type(exc).__name__
        if name.endswith("LibraryNotFound"):
            why = "the driver's NVML library (libnvidia-ml.so.1) was not found: no NVIDIA driver installed"
        elif name.endswith("DriverNotLoaded"):
            why = "the NVIDIA driver is not loaded"
        else:
            why = f"NVML did not start: {exc}"
        return None, f"nvidia-ml-py is installed, but {why}"
    return pynvml, None


def _nvml():
    return _init()[0]


def available() -> bool:
    return _nvml() is not None


def unavailable_reason() -> str | None:
    """Why NVML is not available (None when it is), in words for a user."""
    return _init()[1]


def _call(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - field not supported on this device/driver
        return default


def _str(value):
    return value.decode() if isinstance(value, bytes) else value


def handle(device_index: int):
    """NVML handle of torch's CUDA device `device_index` (matched by UUID, so that
    CUDA_VISIBLE_DEVICES reordering cannot mix devices up)."""
    nv = _nvml()
    if nv is None:
        return None
    uuid = _uuid(device_index)
    if uuid is not None:
        h = _call(nv.nvmlDeviceGetHandleByUUID, uuid)
        if h is not None:
            return h
    return _call(nv.nvmlDeviceGetHandleByIndex, device_index)


def _uuid(device_index: int) -> str | None:
    """NVML's name for torch's CUDA device: "GPU-<uuid>"."""
    uuid = _call(lambda: torch.cuda.get_device_properties(device_index).uuid)
    return None if uuid is None else f"GPU-{uuid}"


def driver_version() -> str | None:
    nv = _nvml()
    return None if nv is None else _str(_call(nv.nvmlSystemGetDriverVersion))


def device_facts(device_index: int) -> dict[str, Any]:
    """Clocks (current and max), power limit, persistence and ECC state, temperature."""
    nv = _nvml()
    h = handle(device_index)
    if nv is None or h is None:
        return {}
    ecc = _call(nv.nvmlDeviceGetEccMode, h)
    power_mw = _call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
    persistence = _call(nv.nvmlDeviceGetPersistenceMode, h)
    return {
        "clock_sm_mhz": _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        "clock_mem_mhz": _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
        "max_clock_sm_mhz": _call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        "max_clock_mem_mhz": _call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
        "power_limit_w": None if power_mw is None else power_mw / 1000.0,
        "persistence_mode": None if persistence is None else bool(persistence),
        "ecc_enabled": None if ecc is None else bool(ecc[0]),
        "temperature_c": _call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
    }


def memory_used_bytes(device_index: int) -> int | None:
    nv = _nvml()
    h = handle(device_index)
    if nv is None or h is None:
        return None
    info = _call(nv.nvmlDeviceGetMemoryInfo, h)
    return None if info is None else int(info.used)


def other_processes(device_index: int) -> list[dict[str, int | None]] | None:
    """Compute processes on torch's CUDA device ``device_index`` other than this one: ``pid`` and
    ``used_memory_bytes`` (None where the driver does not say); None where NVML cannot tell. In a
    container NVML may report host pids, so this process can show up under another pid: ask before
    this process first uses the device."""
    nv = _nvml()
    h = handle(device_index)
    if nv is None or h is None:
        return None
    procs = _call(nv.nvmlDeviceGetComputeRunningProcesses, h)
    if procs is None:
        return None
    return [{"pid": int(p.pid), "used_memory_bytes": p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None}
            for p in procs if p.pid != os.getpid()]


def clock_monitor(device_index: int, interval_ms: float = 100.0) -> _C.ClockMonitor:
    """The SM clock, clock-event (throttle) reasons and compute processes of torch's CUDA device
    ``device_index``, read every ``interval_ms`` while a measurement runs (``with monitor:``;
    ``monitor.summary(skip_s)`` afterwards). The reading thread is C++: it never needs the GIL that
    the timed loop holds. Inactive, with ``monitor.reason``, where NVML or the device is missing.
    """
    return _C.ClockMonitor(device_index, _uuid(device_index), interval_ms)


def energy_meter(device_index: int) -> _C.NvmlEnergyMeter:
    """NVML's total energy counter of torch's CUDA device ``device_index``, read by measure()'s C++ loop
    at the edges of its timed region (``read_j()``, ``power_w()``, ``power_limit_w()``; inactive, with
    ``reason``, where NVML or the device is missing; ``read_j()`` None where the GPU has no counter)."""
    return _C.NvmlEnergyMeter(device_index, _uuid(device_index))


_IDLE_POWER: dict[int, float | None] = {}
IDLE_SAMPLES, IDLE_INTERVAL_S = 10, 0.05


def idle_power_w(device_index: int, meter: _C.NvmlEnergyMeter | None = None) -> float | None:
    """The device's power draw with nothing of this process running on it: the mean of
    ``IDLE_SAMPLES`` readings ``IDLE_INTERVAL_S`` apart (0.5 s), taken once per device and process and
    cached (None where the power cannot be read). Other processes on the GPU count in it."""
    if device_index not in _IDLE_POWER:
        meter = meter or energy_meter(device_index)
        if not meter.active:  # no readings to wait for
            _IDLE_POWER[device_index] = None
            return None
        if torch.cuda.is_available():
            torch.cuda.synchronize(device_index)
        readings = []
        for i in range(IDLE_SAMPLES):
            if i:
                time.sleep(IDLE_INTERVAL_S)
            w = meter.power_w()
            if w is not None:
                readings.append(w)
        _IDLE_POWER[device_index] = sum(readings) / len(readings) if readings else None
    return _IDLE_POWER[device_index]


def _error_name(exc: BaseException) -> str:
    return type(exc).__name__.removeprefix("NVMLError_")


def mig_layout(device_index: int) -> dict[str, Any]:
    """The MIG layout of torch's CUDA device ``device_index`` as NVML reports it (reading only: changing
    it needs ``nvidia-smi mig`` as root). ``mode`` is ``enabled``, ``disabled``, ``unsupported`` (a GPU
    without MIG) or ``unavailable`` (NVML cannot tell: ``reason`` says why); ``pending`` the mode after
    the next GPU reset when it differs; with MIG enabled, ``devices`` lists each MIG device: ``index``,
    ``uuid``, ``memory_bytes``, ``sm_count``, ``gpu_instance_id``, ``compute_instance_id`` (None where
    the driver does not say).

    >>> mig_layout(0)["mode"] in ("enabled", "disabled", "unsupported", "unavailable")
    True
    """
    nv = _nvml()
    if nv is None:
        return {"mode": "unavailable", "reason": unavailable_reason()}
    h = handle(device_index)
    if h is None:
        return {"mode": "unavailable", "reason": f"NVML has no device for cuda:{device_index}"}
    try:
        current, pending = nv.nvmlDeviceGetMigMode(h)
    except Exception as exc:  # noqa: BLE001 - pynvml raises one class per NVML status
        if _error_name(exc) == "NotSupported":
            return {"mode": "unsupported"}
        return {"mode": "unavailable", "reason": f"nvmlDeviceGetMigMode failed: {exc}"}
    enabled = getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
    out: dict[str, Any] = {"mode": "enabled" if current == enabled else "disabled"}
    if pending != current:
        out["pending"] = "enabled" if pending == enabled else "disabled"
    if current != enabled:
        return out
    devices = []
    for i in range(_call(nv.nvmlDeviceGetMaxMigDeviceCount, h, default=0) or 0):
        mig = _call(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
        if mig is None:  # a slot without a MIG device
            continue
        memory = _call(nv.nvmlDeviceGetMemoryInfo, mig)
        attributes = _call(nv.nvmlDeviceGetAttributes, mig)
        devices.append({
            "index": i,
            "uuid": _str(_call(nv.nvmlDeviceGetUUID, mig)),
            "memory_bytes": None if memory is None else int(memory.total),
            "sm_count": None if attributes is None else int(attributes.multiprocessorCount),
            "gpu_instance_id": _call(nv.nvmlDeviceGetGpuInstanceId, mig),
            "compute_instance_id": _call(nv.nvmlDeviceGetComputeInstanceId, mig),
        })
    out["devices"] = devices
    return out
