"""The main job: a model under several configs and batch sizes, every cell prepared, checked for
parity against FP32 and measured in each mode, into a :class:`~gpuopt.results.Results` table."""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import zoo
from .config import Config, Prepared, preset, presets, split_inputs, tensors_in
from .parity import parity as check_parity
from .timing import _MEASURE_DEFAULTS, MODES, Measurement, measure

BENCH_MODES = (*MODES, "end-to-end")
TRAIN_MODE = "train"


@dataclass
class Workload:
    """A model and how to make its inputs for a batch size."""

    name: str
    model: torch.nn.Module
    make_inputs: Callable[[int], Any] | None  # None: fixed inputs
    fixed_inputs: Any = None
    item_unit: str = "items"

    def inputs(self, batch: int) -> Any:
        return self.fixed_inputs if self.make_inputs is None else self.make_inputs(batch)


def _batch_of(inputs: Any) -> int:
    for t in tensors_in(inputs):
        if t.dim() > 0:
            return int(t.shape[0])
    raise ValueError("inputs hold no tensor with a batch dimension")


def workload(model_or_name: torch.nn.Module | str, *, inputs: Any = None, input_shape: Sequence[int] | None = None,
             input_fn: Callable[[int], Any] | None = None) -> Workload:
    """Resolve what to benchmark: a zoo name or a module, and exactly one way to get inputs
    (zoo models bring theirs; ``inputs`` fixes them; ``input_shape`` is one item's shape, filled with
    random numbers per batch size; ``input_fn(batch_size)`` makes them)."""
    given = [k for k, v in (("inputs", inputs), ("input_shape", input_shape), ("input_fn", input_fn)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of inputs, input_shape, input_fn; got {', '.join(given)}")
    if isinstance(model_or_name, str):
        spec = zoo.spec(model_or_name)
        model, make = zoo.get(model_or_name)
        name, unit = model_or_name, spec.items
    elif isinstance(model_or_name, torch.nn.Module):
        model, make, name, unit = model_or_name, None, type(model_or_name).__name__, "items"
    else:
        raise TypeError(f"model must be a zoo name (see gpuopt.zoo.names()) or a torch.nn.Module, "
                        f"got {type(model_or_name).__name__}")
    if input_shape is not None:
        if not (isinstance(input_shape, (tuple, list)) and input_shape
                and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in input_shape)):
            raise ValueError(f"input_shape must be a non-empty sequence of positive ints (one item, without the "
                             f"batch dimension), got {input_shape!r}")
        shape = tuple(input_shape)
        make = lambda batch: torch.randn(batch, *shape)  # noqa: E731
    elif input_fn is not None:
        if not callable(input_fn):
            raise TypeError(f"input_fn must be callable (batch_size -> inputs), got {type(input_fn).__name__}")
        make = input_fn
    elif inputs is not None:
        return Workload(name, model, None, inputs, unit)
    if make is None:
        raise ValueError(f"model {name} needs inputs: give inputs=, input_shape= or input_fn=")
    return Workload(name, model, make, None, unit)


def resolve_configs(configs: str | Config | Sequence[str | Config]) -> list[Config]:
    """A preset name, one config (object or string) or a sequence of them."""
    if isinstance(configs, Config):
        return [configs]
    if isinstance(configs, str):
        if configs in presets():
            return preset(configs)
        return [Config.parse(configs)]
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ValueError(f"configs must be a preset name, a config or a non-empty list of them, got {configs!r}")
    out = [Config.parse(c) for c in configs]
    labels = [c.label for c in out]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ValueError(f"configs repeat {', '.join(dupes)}; give each a distinct name")
    return out


def resolve_batch_sizes(batch_sizes: Sequence[int] | int) -> list[int]:
    if isinstance(batch_sizes, int) and not isinstance(batch_sizes, bool):
        batch_sizes = [batch_sizes]
    if not isinstance(batch_sizes, (list, tuple)) or not batch_sizes:
        raise ValueError(f"batch_sizes must be a non-empty list of positive integers, got {batch_sizes!r}")
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise ValueError(f"batch_sizes must hold positive integers, got {b!r} in {list(batch_sizes)!r}")
    return list(dict.fromkeys(batch_sizes))


def resolve_modes(modes: Sequence[str] | str, train: bool, device: torch.device | None = None) -> list[str]:
    """Validated modes; on a CPU device latency and throughput become host mode (wall clock around
    each call: a CPU call's latency), graph mode is refused."""
    if isinstance(modes, str):
        modes = [modes]
    bad = [m for m in modes if m not in BENCH_MODES]
    if bad or not modes:
        raise ValueError(f"modes must be a non-empty list of {', '.join(BENCH_MODES)}; got {list(modes)!r}")
    if device is not None and device.type == "cpu":
        if "graph" in modes:
            raise ValueError("mode 'graph' needs a CUDA device; on the CPU use latency, throughput, host or end-to-end")
        modes = ["host" if m in ("latency", "throughput") else m for m in modes]
    return list(dict.fromkeys(modes)) + ([TRAIN_MODE] if train else [])


def _device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for CUDA, and no CUDA device is visible")
    return d


def _call_inputs(args: tuple, kwargs: dict) -> Any:
    return kwargs if kwargs and not args else args


def _count(model: torch.nn.Module, inputs: Any, batch: int) -> dict[str, float | None]:
    """FLOPs and bytes moved per item of one forward call (None where they cannot be counted)."""
    from . import roofline

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
    from . import roofline

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
    from . import device_ceilings
    from .roofline import datasheet_ceilings

    cached = device_ceilings.ceilings(device, cached_only=True)
    if cached is not None:
        return cached
    sheet = datasheet_ceilings(torch.cuda.get_device_name(device))
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
    from ._ext import _C

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
    from .memory import InputPipeline, PinnedPool

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
        actual = _batch_of(inputs)
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
        from pathlib import Path

        from .profile import profile

        out = Path(self.profile_dir) / f"{self.work.name}-b{batch}-{config.label}".replace("+", "_").replace(":", "_")
        try:
            summary = profile(prepared, inputs, output_dir=str(out))
            self.profiles[f"{self.work.name} b{batch} {config.label}"] = {"summary": summary.to_dict(),
                                                                          "markdown": summary.to_markdown()}
        except Exception as exc:  # noqa: BLE001
            self.profiles[f"{self.work.name} b{batch} {config.label}"] = {"error": f"{type(exc).__name__}: {exc}"}


def check_measure_options(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(_MEASURE_DEFAULTS) - {"label"})
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; measure options: {', '.join(sorted(_MEASURE_DEFAULTS))}")
    if "mode" in options or "inputs" in options:
        raise TypeError("give modes= (a list) instead of mode=, and inputs= to benchmark() itself")
    return options


def benchmark(
    model_or_name: torch.nn.Module | str,
    *,
    inputs: Any = None,
    input_shape: Sequence[int] | None = None,
    input_fn: Callable[[int], Any] | None = None,
    configs: str | Config | Sequence[str | Config] = "bench",
    batch_sizes: Sequence[int] | int = (1, 8, 16, 32),
    modes: Sequence[str] | str = ("latency", "throughput"),
    parity: bool = True,
    train: bool = False,
    output_dir: str | None = None,
    device: str | torch.device | None = None,
    profile: bool = False,
    progress: bool = True,
    **measure_options: Any,
):
    """Benchmark a model under several configs and batch sizes; return a :class:`Results`.

    Every cell (config x batch size) is prepared (``Config.apply``), checked for parity against the
    FP32 reference on fresh inputs (a config that drifts is recorded as failed, never timed), then
    measured in each of ``modes`` (``latency``, ``throughput``, ``graph``, ``host``, ``end-to-end``: host
    batch in through :class:`gpuopt.InputPipeline`, result back on the host). ``train=True`` adds
    forward + backward + optimizer-step timing. A cell that fails (out of memory, compile error,
    parity) is recorded with its reason and the rest goes on. ``measure_options`` go to
    :func:`gpuopt.measure` (e.g. ``max_time_s=2``). ``output_dir`` saves JSON, CSV, Markdown and plots.

    >>> r = gpuopt.benchmark("tiny-cnn", configs=["fp32", "bf16-amp"], batch_sizes=[1, 8],
    ...                      device="cpu", max_time_s=0.2)                       # doctest: +SKIP
    >>> print(r.to_markdown())                                                   # doctest: +SKIP
    """
    from .results import Results, check_writable

    work = workload(model_or_name, inputs=inputs, input_shape=input_shape, input_fn=input_fn)
    cfgs = resolve_configs(configs)
    batches = resolve_batch_sizes(batch_sizes) if work.make_inputs is not None else [_batch_of(work.fixed_inputs)]
    dev = _device(device)
    mode_list = resolve_modes(modes, train, dev)
    opts = check_measure_options(dict(measure_options))
    for name, flag in (("parity", parity), ("train", train), ("profile", profile), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if output_dir is not None:
        check_writable(output_dir)  # before the run, not after it
    results = Results.new(spec={"models": [work.name], "configs": [str(c) for c in cfgs],
                                "config_labels": [c.label for c in cfgs], "batch_sizes": batches,
                                "modes": mode_list, "parity": parity, "measure": opts})
    bar = ProgressBar(len(batches) * len(cfgs), progress)
    profile_dir = str(Path(output_dir or ".") / "gpuopt-profiles") if profile else None
    runner = Runner(work, cfgs, mode_list, parity=parity, device=dev, measure_options=opts,
                    on_row=results.add, profile_dir=profile_dir, progress=bar)
    try:
        for b in batches:
            runner.run_batch(b)
    finally:
        bar.close()
        results.profiles.update(runner.profiles)
        results.ceilings = runner.ceilings
        if output_dir is not None:
            results.save(output_dir)
    return results


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
