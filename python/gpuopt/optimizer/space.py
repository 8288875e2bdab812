"""The optimizer's search space and its objectives: the device's candidate configs (built from
:class:`~gpuopt.Config`'s parts), the default batch sizes, the score of a row under an objective and
the constraints a row can break (with by how much)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import torch

from .._ext import _C
from ..prepare.config import Config
from ..quant import QUANTIZED_PRECISIONS, fp8_refusal
from ..report.results import Row

OBJECTIVES = ("throughput", "latency", "energy")
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BATCH_SIZES = (1,)  # objective="latency": p99 of one item unless batch_sizes are given

# The parts the default space is built from, per device type.
_CUDA_PARTS = {"precision": ("fp32", "tf32", "fp16-amp", "bf16-amp", "fp16"),
               "memory_format": ("contiguous", "channels_last"), "backend": ("eager", "compile")}
_CPU_PARTS = {"precision": ("fp32", "bf16-amp"), "memory_format": ("contiguous", "channels_last"),
              "backend": ("eager",)}


def candidate_configs(device: torch.device) -> list[Config]:
    """The default space on ``device``: precisions x memory formats x backends that apply there (on CUDA
    bf16 only where the GPU has it, and the quantized precisions -- fp8 where the GPU has FP8 tensor cores --
    in eager mode; on the CPU a small set, no compile: inductor's C++ build takes minutes)."""
    parts = _CUDA_PARTS if device.type == "cuda" else _CPU_PARTS
    precisions = [p for p in parts["precision"]
                  if not ("bf16" in p and device.type == "cuda" and not torch.cuda.is_bf16_supported())]
    out = []
    for precision, fmt, backend in itertools.product(precisions, parts["memory_format"], parts["backend"]):
        if precision == "fp32" and (fmt, backend) != ("contiguous", "eager"):
            continue  # fp32 is the reference point; its variants rarely win and each costs a preparation
        out.append(Config(precision, fmt, backend))
    if device.type == "cuda" and torch.cuda.is_bf16_supported():  # quantized: the rest of the model in bf16
        for precision, fmt in itertools.product(QUANTIZED_PRECISIONS, parts["memory_format"]):
            if precision != "fp8" or fp8_refusal(device) is None:
                out.append(Config(precision, fmt, "eager"))
    return out


def eager_twin(config: Config) -> Config | None:
    """The same precision and memory format in eager mode, for a config whose preparation is expensive
    (compile); None for one that is cheap to prepare."""
    if config.backend != "compile":
        return None
    return dataclasses.replace(config, backend="eager", compile_mode=None, name=None)


def energy_per_item(row: Row) -> float | None:
    """Joules per item of a measured row (``Row.energy``), None where energy was not measured. The one
    place the optimizer reads energy from."""
    e = row.energy
    return e.get("joules_per_item") if e else None


def energy_missing_reason(row: Row) -> str:
    e = row.energy
    return (e or {}).get("reason") or "the measurement holds no energy reading"


def memory_gb(row: Row, prepared: Any = None, exclude_bytes: int = 0) -> tuple[float | None, str]:
    """(GB, source) of a row: the allocator's peak during the measurement on CUDA, less ``exclude_bytes``
    (what other candidates and the fp32 reference held then); elsewhere (no allocator record) the
    parameters and buffers of the prepared model, a lower bound."""
    mem = row.peak_memory or {}
    if mem.get("max_allocated_bytes") is not None:
        own = max(0, int(mem["max_allocated_bytes"]) - int(exclude_bytes))
        return own / 1e9, "allocator peak" + (" less what other candidates held" if exclude_bytes else "")
    if prepared is None or prepared.eager_module is None:
        return None, "not measured"
    m = prepared.eager_module
    n = sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
    return n / 1e9, "parameters + buffers (lower bound: no allocator record off CUDA)"


def score(row: Row, objective: str) -> float | None:
    """Higher is better: items/s (throughput), minus a request's p99 ms (latency, :func:`request_p99`),
    minus joules per item (energy)."""
    if not row.ok:
        return None
    if objective == "throughput":
        return row.throughput_items_per_s
    if objective == "latency":
        p99 = request_p99(row)
        return -p99 if p99 is not None else None
    j = energy_per_item(row)
    return -j if j is not None else None


def objective_value(row: Row, objective: str) -> float | None:
    """The objective in its own unit: items/s, p99 ms or J/item."""
    s = score(row, objective)
    return None if s is None else (s if objective == "throughput" else -s)


OBJECTIVE_UNITS = {"throughput": "items/s", "latency": "ms p99", "energy": "J/item"}


def request_ms(row: Row) -> list[float]:
    """Each call's latency as a request sees it, in the order measured: the later of the device time and
    the host's time issuing the call. Latency mode times the device alone (a kernel queued ahead hides the
    launches), so a launch-bound call -- torch.compile's BERT-base at batch 1 on the H100's host: 1.1 ms on
    the device, 8 ms to issue -- would look faster than any request can be served."""
    return calls_ms(row.measurement)


def calls_ms(m) -> list[float]:
    """:func:`request_ms` of a Measurement (an empty list for None)."""
    if m is None:
        return []
    enqueue = m.enqueue_ms if len(m.enqueue_ms) == len(m.samples_ms) else [0.0] * len(m.samples_ms)
    return [max(s, e) for s, e in zip(m.samples_ms, enqueue)]


def holds_host_gaps(m) -> bool:
    """Whether most of a Measurement's calls took the host longer to issue than the spin queued ahead of
    them: its device times then hold the host's gaps (a synchronization inside the call, as in Hugging
    Face's eager BERT, waits for the spin every time); a few such calls are the host's noise."""
    return m.delay_short > 0.5 * m.n


def request_p99(row: Row) -> float | None:
    """p99 of :func:`request_ms` (the SLO's figure), or the row's p99 where it holds no samples."""
    return request_quantile(row, 0.99)


def request_quantile(row: Row, q: float) -> float | None:
    calls = request_ms(row)
    if not calls:
        return row.latency_ms[{0.5: "p50", 0.99: "p99"}[q]] if row.latency_ms else None
    return float(_C.quantile(calls, q))


def is_out_of_memory(text: str | None) -> bool:
    """A failure reason that says the device ran out of memory (torch's message or its exception's name)."""
    return bool(text) and ("out of memory" in text.lower() or "OutOfMemoryError" in text)


def misses(row: Row, gb: float | None, *, slo_p99_ms: float | None, memory_gb: float | None) -> dict[str, float]:
    """How far a measured row is outside the constraints: {"p99_ms_over": ..., "memory_gb_over": ...}
    (empty when it meets them). The SLO judges :func:`request_p99`."""
    out = {}
    p99 = request_p99(row) if slo_p99_ms is not None else None
    if p99 is not None and p99 > slo_p99_ms:
        out["p99_ms_over"] = p99 - slo_p99_ms
    if memory_gb is not None and gb is not None and gb > memory_gb:
        out["memory_gb_over"] = gb - memory_gb
    return out


TAIL_SAMPLES = 300  # a p99 the SLO judges, where a 1% tail may explain it, is measured again with this many
# The level of the binomial test that calls a p99 over the SLO from fewer samples: a search judges tens of
# candidates, and one wrongly called infeasible prunes the larger batch sizes of its config with it (at 5%,
# ViT-B/16's fp16 b4 was called infeasible from 2 episodes in 20 calls and the sweep's best, fp16 b64, was
# never run); at 0.1% one candidate in a thousand whose true p99 meets the SLO is called over it.
TAIL_ALPHA = 0.001


def tail_undecided(row: Row, slo_p99_ms: float | None) -> str | None:
    """Why ``row``'s p99 over ``slo_p99_ms`` does not show the config breaks the SLO, or None when it does
    (or meets it). p99 allows 1% of calls over: from few samples, one host stall (a page fault, the GC, a
    preempted thread) is the "p99". The median over the SLO decides at once; otherwise the episodes over
    it (runs of consecutive calls: one stall of the host spans several) must be more than a 1% tail
    explains (binomial, at level ``TAIL_ALPHA``) or come from at least ``TAIL_SAMPLES`` samples."""
    if slo_p99_ms is None or not row.ok or row.measurement is None or not row.latency_ms:
        return None
    samples = request_ms(row)  # in the order they were taken
    if not samples:
        return None
    p50, p99 = float(_C.quantile(samples, 0.5)), float(_C.quantile(samples, 0.99))
    if p99 <= slo_p99_ms or p50 > slo_p99_ms:
        return None
    e = _C.exceedance(samples, slo_p99_ms, 0.01)
    if e["n"] >= TAIL_SAMPLES or e["p_value"] < TAIL_ALPHA:
        return None
    return (f"p99 {p99:.4g} ms > slo_p99_ms={slo_p99_ms:g} from {e['over']} of {e['n']} calls in {e['episodes']} "
            f"episode{'s' if e['episodes'] != 1 else ''} (median {p50:.4g} ms): a 1% tail explains that many")


STALL_SHARE = 0.05  # at most this share of calls over the SLO ...
STALL_EXCESS = 1.5  # ... taking at least this many times the SLO (median of those calls): stalls, not the body


def stalls_only(row: Row, slo_p99_ms: float) -> str | None:
    """How ``row`` breaks the SLO when only stalls do -- few calls over it (at most ``STALL_SHARE``), and
    those far over it (their median at least ``STALL_EXCESS`` x the SLO) -- else None: the body of its calls
    sits at or over the SLO (as compiled ResNet-50 b64 issuing for ~5 ms against a 5 ms SLO)."""
    samples = request_ms(row)
    if not samples:
        return None
    e = _C.exceedance(samples, slo_p99_ms, 0.01)
    share = e["over"] / e["n"]
    if share == 0 or share > STALL_SHARE:
        return None
    excess = float(_C.quantile([x for x in samples if x > slo_p99_ms], 0.5)) / slo_p99_ms
    if excess < STALL_EXCESS:
        return None
    return f"{share:.1%} of its calls over it, at {excess:.1f}x the SLO in the median"


def device_median_ms(row: Row) -> float | None:
    """The device's median time per call (latency mode; the host's in host mode): what a faster backend of
    the same precision shortens, and what grows with the batch whatever the host does."""
    return row.latency_ms.get("p50") if row.ok and row.latency_ms else None


def host_bound_miss(row: Row, misses_: dict[str, float], slo_p99_ms: float | None) -> float | None:
    """The device median of a row whose only miss is a request's p99 over the SLO while the device's median
    is within it (the host's issuing or its stalls break the SLO, not the work), else None."""
    if slo_p99_ms is None or set(misses_) != {"p99_ms_over"}:
        return None
    d = device_median_ms(row)
    return d if d is not None and d <= slo_p99_ms else None


def tail_options(confirm: dict[str, Any]) -> dict[str, Any]:
    """The measure options of a second look at a tail: the confirmation's, aiming at ``TAIL_SAMPLES``
    samples within at most 5 s (or the confirmation's longer limit); a call over ~17 ms gets fewer."""
    o = {k: v for k, v in confirm.items() if k != "iters"}
    o["min_iters"] = max(TAIL_SAMPLES, int(o.get("min_iters") or 0))
    o["max_iters"] = max(o["min_iters"], int(o.get("max_iters") or 0))
    o["max_time_s"] = max(5.0, float(o.get("max_time_s") or 0.0))
    return o


def check_positive(name: str, value: Any, *, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number > 0{' or None' if allow_none else ''}, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0{' or None' if allow_none else ''}, got {value!r}")
    return float(value)
