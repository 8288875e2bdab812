"""Runs the cells of one workload: for a batch size, the FP32 reference, then every config (prepared,
parity-gated) in every mode, each cell measured by gpuopt's engine and handed on as a row."""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._ext import _C
from ..analysis import ceilings as device_ceilings
from ..analysis import roofline
from ..analysis.profiler import profile
from ..memory import InputPipeline, PinnedPool
from ..prepare.config import Config, Prepared
from ..prepare.parity import parity as check_parity
from ..timing.inputs import split_inputs, tensors_in
from ..timing.measurement import Measurement, measure
from .workload import TRAIN_MODE, Workload, batch_of


def _call_inputs(args: tuple, kwargs: dict) -> Any:
    return kwargs if kwargs and not args else args


def _count(model: torch.nn.Module, inputs: Any, batch: int) -> dict[str, float | None]:
    """FLOPs and bytes moved per item of one forward call (None where they cannot be counted)."""
    out: dict[str, float | None] = {"flops_per_item": None, "bytes_per_item_min": None, "bytes_per_item_max": None}
    try:
        out["flops_per_item"] = roofline.count_flops(model, inputs) / batch
        b = roofline.count_bytes(model, inputs)
        out["bytes_per_item_min"] = b["min_bytes"] / batch
        out["bytes_per_item_max"] = b["max_bytes"] / batch
    except Exception:  # noqa: BLE001 - counting is best effort; the row says None
        pass
    return out


def _place(row: dict, ceilings: dict | None) -> dict | None:
    if ceilings is None or row.get("throughput_items_per_s") is None:
        return None
    flops = row["flops_per_item"]
    if flops is not None and row["mode"] == TRAIN_MODE:
        flops = 3 * flops  # forward + backward (about twice the forward)
    try:
        return roofline.place(flops_per_item=flops, bytes_per_item=row["bytes_per_item_min"],
                              items_per_s=row["throughput_items_per_s"], precision=row["precision"],
                              ceilings=ceilings, diagnosis=row.get("diagnosis"))
    except Exception as exc:  # noqa: BLE001
        return {"bound": "unknown", "reason": f"placement failed: {exc}"}


def device_ceilings_for(device: torch.device) -> dict | None:
    """Measured ceilings if cached (never measures here: that takes tens of seconds), else the
    datasheet entry of the device, else None."""
    if device.type != "cuda":
        return None
    cached = device_ceilings.ceilings(device, cached_only=True)
    if cached is not None:
        return cached
    sheet = roofline.datasheet_ceilings(torch.cuda.get_device_name(device))
    return sheet if sheet["datasheet"] is not None else None


def _row(base: dict, **kw: Any) -> dict:
    r = dict(base)
    r.update(kw)
    return r


def _measured_row(base: dict, m: Measurement, batch: int) -> dict:
    return _row(
        base, status="ok", error=None,
        latency_ms={"p50": m.p50, "p95": m.p95, "p99": m.p99, "mean": m.mean, "min": m.min},
        throughput_items_per_s=batch * 1e3 / m.p50 if m.p50 > 0 else None,
        ci95_ms=list(m.ci95), ci_rel=m.ci_rel, peak_memory=m.memory, warnings=list(m.warnings),
        diagnosis=m.diagnosis,
        timing={"n": m.n, "warmup_s": m.warmup_s, "sampling_s": m.sampling_s, "stop_reason": m.stop_reason,
                "target_met": m.target_met, "mode": m.mode},
        measurement=m.to_dict(),
    )


def _failed(base: dict, reason: str) -> dict:
    return _row(base, status="failed", error=reason, latency_ms=None, throughput_items_per_s=None, measurement=None)


def _loss(out: Any) -> torch.Tensor:
    """A scalar to backpropagate through whatever the model returns."""
    if hasattr(out, "logits"):
        out = out.logits
    elif hasattr(out, "last_hidden_state"):
        out = out.last_hidden_state
    elif isinstance(out, dict):
        out = next(iter(out.values()))
    elif isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().square().mean()


def train_step(config: Config, model: torch.nn.Module, inputs: Any, device: torch.device) -> Callable[[], None]:
    """One forward + backward + optimizer step (SGD with momentum) under ``config``: autocast with a
    GradScaler for fp16-amp, none for bf16-amp; channels-last; torch.compile. TorchScript and CUDA-graph
    configs are inference-only."""
    if config.backend in ("torchscript", "cudagraph"):
        raise ValueError(f"backend {config.backend!r} is inference-only; train=True supports eager and compile")
    m = copy.deepcopy(model).train()
    with torch.no_grad():
        for t in [*m.parameters(), *m.buffers()]:
            t.data, _ = _C.convert_nested(t.data, device, config.cast_dtype, config.memory_format == "channels_last")
    (args, kwargs), _ = _C.convert_nested(split_inputs(inputs), device, config.cast_dtype,
                                          config.memory_format == "channels_last")
    step_model = m
    if config.backend == "compile":
        step_model = torch.compile(m, mode=config.compile_mode)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16-amp" else None
    guard = config.guard(device.type, inference_mode=False)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with guard:
            loss = _loss(step_model(*args, **kwargs))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return step


def end_to_end(prepared: Prepared, host_batches: list[torch.Tensor]) -> Callable[[], None]:
    """One call per batch: host tensor in (through gpuopt.InputPipeline on CUDA), model, result copied
    back to the host (into a pinned pool). Rotates through ``host_batches``."""
    if prepared.device.type != "cuda":
        cycle = itertools.cycle(host_batches)
        return lambda: prepared(next(cycle))
    pipe = InputPipeline(depth=2, device=prepared.device)
    out_pool = PinnedPool(name="end-to-end outputs")
    cycle = itertools.cycle(host_batches)
    for _ in range(pipe.depth):
        pipe.submit(next(cycle))

    def call() -> None:
        y = prepared(pipe.next())
        pipe.submit(next(cycle))
        for t in tensors_in(y):
            out_pool.empty(tuple(t.shape), t.dtype).copy_(t, non_blocking=True)

    call.pipeline = pipe  # keep the pipeline alive with the callable
    return call


class Runner:
    """Runs cells of one workload: for a batch size, every config, every mode. Rows go to
    ``on_row`` as each finishes, so a sweep can persist them one by one."""

    def __init__(self, work: Workload, configs: list[Config], modes: list[str], *, parity: bool, device: torch.device,
                 measure_options: dict[str, Any], on_row: Callable[[dict], None], skip: Callable[[dict], bool] | None = None,
                 profile_dir: str | None = None, progress: Callable[[str, str], None] | None = None):
        self.work, self.configs, self.modes = work, configs, modes
        self.parity, self.device, self.options = parity, device, measure_options
        self.on_row, self.skip = on_row, skip or (lambda key: False)
        self.profile_dir = profile_dir
        self.progress = progress or (lambda event, cell: None)  # ("start" | "done", cell description)
        self.ceilings = device_ceilings_for(device)
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.profiles: dict[str, dict] = {}

    def run_batch(self, batch: int) -> None:
        keys = {(str(c), m): {"model": self.work.name, "config": str(c), "batch_size": batch, "mode": m}
                for c in self.configs for m in self.modes}
        if all(self.skip(k) for k in keys.values()):
            return
        inputs = self.work.inputs(batch)
        actual = batch_of(inputs)
        if self.work.make_inputs is not None and actual != batch:
            raise ValueError(f"input_fn({batch}) returned a batch of {actual}")
        ref = Config("fp32").apply(self.work.model, inputs, device=self.device) if self.parity else None
        if ref is not None and not ref.ok:
            if isinstance(ref.exception, torch.OutOfMemoryError):
                raise torch.OutOfMemoryError(f"the fp32 reference ran out of memory at batch {batch}")
            shapes = [tuple(t.shape) for t in tensors_in(inputs)]
            raise ValueError(f"{self.work.name}: inputs of shape {', '.join(map(str, shapes))} (batch {batch}) do not "
                             f"fit the model: {ref.error}")
        counts = {"flops_per_item": None, "bytes_per_item_min": None, "bytes_per_item_max": None}
        if ref is not None:
            args, kwargs = ref.convert_inputs(inputs)
            counts = _count(ref.eager_module, _call_inputs(args, kwargs), actual)
        for config in self.configs:
            wanted = [m for m in self.modes if not self.skip(keys[(str(config), m)])]
            if wanted:
                self._run_config(config, actual, inputs, ref, counts, wanted, keys)
        del ref
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _run_config(self, config: Config, batch: int, inputs: Any, ref: Prepared | None, counts: dict,
                    modes: list[str], keys: dict) -> None:
        t_cell = time.perf_counter()
        cell = f"{self.work.name} b{batch} {config.label}"
        self.progress("start", cell)
        base = {**keys[(str(config), modes[0])], "config_label": config.label, "precision": config.precision,
                "items_per_call": batch, "item_unit": self.work.item_unit, "device": self.device_name, **counts}
        inference = [m for m in modes if m != TRAIN_MODE]
        prepared = config.apply(self.work.model, inputs, device=self.device) if inference else None
        common = {}
        if prepared is not None:
            common = {"prepare_s": prepared.prepare_s, "first_call_ms": prepared.first_call_ms,
                      "notes": list(prepared.notes)}
        gate = None
        if prepared is not None and prepared.ok and self.parity and ref is not None:
            t0 = time.perf_counter()
            try:
                p = check_parity(prepared, ref, self.work.inputs(batch))
                gate = p.to_dict()
                if not p.passed:
                    gate["error"] = f"parity failed: {p}"
            except Exception as exc:  # noqa: BLE001
                gate = {"passed": False, "error": f"parity check raised {type(exc).__name__}: {exc}"}
            common["parity_s"] = time.perf_counter() - t0
        common["parity"] = gate
        for mode in modes:
            base_mode = {**base, **common, "mode": mode}
            t_mode = time.perf_counter()
            if mode != TRAIN_MODE and prepared is not None and not prepared.ok:
                row = _failed(base_mode, prepared.error)
            elif mode != TRAIN_MODE and gate is not None and not gate["passed"]:
                row = _failed(base_mode, gate["error"])
            else:
                row = self._measure(config, prepared, inputs, batch, mode, base_mode)
            timed = row.get("timing", {}) or {}
            row["runner_overhead_s"] = max(0.0, (time.perf_counter() - t_mode) - timed.get("warmup_s", 0.0)
                                           - timed.get("sampling_s", 0.0))
            row["roofline"] = _place(row, self.ceilings) if row["status"] == "ok" else None
            self.on_row(row)
        if self.profile_dir is not None and prepared is not None and prepared.ok:
            self._profile(config, prepared, inputs, batch)
        del prepared
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.progress("done", f"{cell} ({time.perf_counter() - t_cell:.1f} s)")

    def _measure(self, config: Config, prepared: Prepared | None, inputs: Any, batch: int, mode: str,
                 base: dict) -> dict:
        try:
            opts = dict(self.options)
            label = f"{self.work.name} b{batch} {config.label} {mode}"
            if mode == TRAIN_MODE:
                fn = train_step(config, self.work.model, inputs, self.device)
                fn()  # compiles / allocates optimizer state outside the timed region
                m = measure(fn, mode="throughput" if self.device.type == "cuda" else "host", label=label, **opts)
            elif mode == "end-to-end":
                if not isinstance(inputs, torch.Tensor):
                    raise ValueError("end-to-end mode needs a model with one tensor input")
                fn = end_to_end(prepared, [self.work.inputs(batch) for _ in range(3)])
                m = measure(fn, mode="throughput" if self.device.type == "cuda" else "host", label=label, **opts)
            else:
                m = measure(prepared.runner(inputs), mode=mode, label=label, **opts)
            return _measured_row(base, m, batch)
        except torch.OutOfMemoryError as exc:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return _failed(base, f"out of memory: {str(exc).splitlines()[0]}")
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded; the sweep goes on
            return _failed(base, f"{type(exc).__name__}: {exc}")

    def _profile(self, config: Config, prepared: Prepared, inputs: Any, batch: int) -> None:
        out = Path(self.profile_dir) / f"{self.work.name}-b{batch}-{config.label}".replace("+", "_").replace(":", "_")
        try:
            summary = profile(prepared, inputs, output_dir=str(out))
            self.profiles[f"{self.work.name} b{batch} {config.label}"] = {"summary": summary.to_dict(),
                                                                          "markdown": summary.to_markdown()}
        except Exception as exc:  # noqa: BLE001
            self.profiles[f"{self.work.name} b{batch} {config.label}"] = {"error": f"{type(exc).__name__}: {exc}"}


class ProgressBar:
    """A tqdm bar with ETA when tqdm is installed (and wanted), else silent; one step per cell."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, unit="cell", leave=False)
            except ImportError:
                self.bar = None

    def __call__(self, event: str, cell: str) -> None:
        if self.bar is None:
            return
        if event == "done":
            self.bar.update(1)
        self.bar.set_description(cell[:60])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
