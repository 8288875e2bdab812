"""Thin, failure-tolerant access to NVML (nvidia-ml-py), used where it is installed.

Every function returns None (or an empty result) when NVML or the queried field is unavailable:
NVML facts enrich results, they never decide whether a run works.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import torch


@functools.lru_cache(maxsize=1)
def _nvml():
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no permission, stub library...
        return None
    return pynvml


def available() -> bool:
    return _nvml() is not None


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
    uuid = _call(lambda: torch.cuda.get_device_properties(device_index).uuid)
    if uuid is not None:
        h = _call(nv.nvmlDeviceGetHandleByUUID, f"GPU-{uuid}")
        if h is not None:
            return h
    return _call(nv.nvmlDeviceGetHandleByIndex, device_index)


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


# Clock-event (throttle) reasons worth naming; idle and application-clock settings are not problems.
_THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def _throttle_reasons(nv, h) -> int:
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is not None:
            value = _call(fn, h)
            if value is not None:
                return int(value)
    return 0


class ClockMonitor:
    """Samples the SM clock, throttle reasons and other compute processes in a background thread
    while a measurement runs (the timing loop releases the GIL, so the thread gets to run)."""

    def __init__(self, device_index: int, interval_s: float = 0.1):
        self._nv = _nvml()
        self._h = handle(device_index)
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = None
        self._t0 = 0.0
        self.samples: list[tuple[float, int, int]] = []  # (seconds since start, SM MHz, reasons)
        self.max_sm_mhz: int | None = None
        self.processes: set[int] = set()

    @property
    def active(self) -> bool:
        return self._nv is not None and self._h is not None

    def __enter__(self):
        if not self.active:
            return self
        self.max_sm_mhz = _call(self._nv.nvmlDeviceGetMaxClockInfo, self._h, self._nv.NVML_CLOCK_SM)
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="gpuopt-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        return False

    def _run(self):
        nv, h = self._nv, self._h
        while True:
            mhz = _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            if mhz is not None:
                self.samples.append((time.perf_counter() - self._t0, int(mhz), _throttle_reasons(nv, h)))
            procs = _call(nv.nvmlDeviceGetComputeRunningProcesses, h, default=[]) or []
            self.processes.update(p.pid for p in procs)
            if self._stop.wait(self._interval):
                return

    def summary(self, skip_s: float) -> dict | None:
        """Clock statistics over the samples taken after the first `skip_s` seconds (warm-up)."""
        kept = [s for s in self.samples if s[0] >= skip_s] or self.samples[-1:]
        if not kept:
            return None
        mhz = sorted(s[1] for s in kept)
        reasons = 0
        for s in kept:
            reasons |= s[2]
        return {
            "sm_mhz_median": mhz[len(mhz) // 2],
            "sm_mhz_min": mhz[0],
            "max_sm_mhz": self.max_sm_mhz,
            "throttle_reasons": [name for bit, name in _THROTTLE_BITS.items() if reasons & bit],
            "samples": len(kept),
            # Our own PID may be invisible inside a container, so "others" means: more than one.
            "compute_processes": len(self.processes),
        }
